"""Exact integer splits by largest remainder: the parts sum to their total
exactly, each within one unit of its exact share. Attribution splits a
window's device-nanoseconds over requests; cost allocation splits many
pool-hours' costs at once (one group each)."""

from __future__ import annotations

import numpy as np


def apportion_groups(values: np.ndarray, groups: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """Round non-negative float `values` to int64 so that, for every group
    g, the parts with groups == g sum to totals[g]."""
    n = len(values)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    values = np.maximum(np.asarray(values, dtype=np.float64), 0.0)
    groups = np.asarray(groups, dtype=np.int64)
    floors = np.floor(values).astype(np.int64)
    totals = np.asarray(totals, dtype=np.int64)
    deficit = totals - group_sum(floors, groups, len(totals))
    sizes = np.bincount(groups, minlength=len(totals))
    far = np.abs(deficit) >= np.maximum(sizes, 1)  # never expected; keeps the sums exact regardless
    if far.any():
        floors += np.where(far, deficit // np.maximum(sizes, 1), 0)[groups]
        deficit = totals - group_sum(floors, groups, len(totals))
    remainders = values - floors
    if len(totals) == 1:  # one group: a partial partition, no sort
        return _settle(floors, remainders, int(deficit[0]))
    order = np.lexsort((-remainders, groups))
    sorted_groups = groups[order]
    rank = np.arange(n) - np.searchsorted(sorted_groups, sorted_groups, side="left")
    floors[order[rank < deficit[sorted_groups]]] += 1
    for group in np.flatnonzero(deficit < 0):  # float error overshot: take back, smallest first
        members = order[sorted_groups == group][::-1]
        members = members[floors[members] > 0][: -deficit[group]]
        floors[members] -= 1
    return floors


def _settle(floors: np.ndarray, remainders: np.ndarray, short: int) -> np.ndarray:
    """Add the `short` units to the largest remainders (or, negative, take
    them from the smallest)."""
    if short > 0:
        floors[np.argpartition(-remainders, short - 1)[:short]] += 1
    elif short < 0:
        order = np.argsort(remainders)
        floors[order[floors[order] > 0][:-short]] -= 1
    return floors


def apportion(values: np.ndarray, *, total: int) -> np.ndarray:
    """One group: round `values` to integers that sum to exactly `total`."""
    return apportion_groups(values, np.zeros(len(values), dtype=np.int64), np.array([total]))


def group_sum(values: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
    """Exact int64 sums of `values` per group."""
    if n_groups == 1:
        return np.array([values.sum(dtype=np.int64)])
    sums = np.zeros(n_groups, dtype=np.int64)
    np.add.at(sums, groups, values)
    return sums


def rounded_totals(values: np.ndarray, groups: np.ndarray, n_groups: int, cap: np.ndarray):
    """Each group's float sum rounded to an integer, never above `cap`: the
    total an exact split of `values` should add up to."""
    sums = np.bincount(groups, weights=values, minlength=n_groups)
    return np.minimum(np.rint(sums).astype(np.int64), cap)
