"""Exact integer splits, many groups at once (largest remainder): the
parts of each group sum to its total exactly, and each part is within one
unit of its exact share."""

from __future__ import annotations

import numpy as np


def apportion_groups(values: np.ndarray, groups: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """Round non-negative float `values` to int64 so that, for every group
    g, the parts with groups == g sum to totals[g]. The caller's values for
    a group must sum to about its total (within the group's size)."""
    n = len(values)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    values = np.maximum(np.asarray(values, dtype=np.float64), 0.0)
    groups = np.asarray(groups, dtype=np.int64)
    floors = np.floor(values).astype(np.int64)
    deficit = np.asarray(totals, dtype=np.int64) - group_sum(floors, groups, len(totals))
    remainders = values - floors
    order = np.lexsort((-remainders, groups))
    sorted_groups = groups[order]
    rank = np.arange(n) - np.searchsorted(sorted_groups, sorted_groups, side="left")
    sizes = np.bincount(groups, minlength=len(totals))
    if np.any(deficit > sizes):
        raise ValueError("values fall short of their group's total by more than one per part")
    floors[order[rank < deficit[sorted_groups]]] += 1
    for group in np.flatnonzero(deficit < 0):  # float error overshot: take back, smallest first
        members = order[sorted_groups == group][::-1]
        members = members[floors[members] > 0][: -deficit[group]]
        floors[members] -= 1
    return floors


def group_sum(values: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
    """Exact int64 sums of `values` per group."""
    sums = np.zeros(n_groups, dtype=np.int64)
    np.add.at(sums, groups, values)
    return sums


def rounded_totals(values: np.ndarray, groups: np.ndarray, n_groups: int, cap: np.ndarray):
    """Each group's float sum rounded to an integer, never above `cap`: the
    total an exact split of `values` should add up to."""
    sums = np.bincount(groups, weights=values, minlength=n_groups)
    return np.minimum(np.rint(sums).astype(np.int64), cap)
