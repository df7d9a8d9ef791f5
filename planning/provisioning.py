"""GPUs needed per pool, against the GPUs it holds and, for a reserved
pool, the GPUs its tenants contracted. Pure: planning.plan gathers the
figures.

For each model a pool serves: its forecast peak of tokens an hour (the
upper edge of the band finance chose, or the point forecast: sized_peak,
the one figure the plan sizes for and the plan page shows) plus the
headroom, over the capacity at SLO of one GPU of its replicas (the median
over its replicas that have a number: planning.capacity), in whole
replicas (the median replica's GPUs). A model whose capacity is not known
leaves the pool's need unknown, unless the models that are known already
need more than it holds. Capacity is per model: a model's need is set
against its own replicas' GPUs (an embedding model's GPU is no chat
capacity), and the pool's SLO headroom is its tightest model's.

Flags: "under" (a model needs more than its replicas hold, or the pool
more than it holds), "over" (holds at least one
replica's GPUs more than it needs), "unknown", "short_of_contract" (a
reserved pool holding fewer GPUs than its reservations in force). Money:
what the GPUs beyond the need cost over the horizon, and for a pool under
its need the SLA credits at risk: what its tenants' latency credits would
pay on their revenue over the horizon were the targets missed."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

UNDER, OVER, OK, UNKNOWN, SHORT = "under", "over", "ok", "unknown", "short_of_contract"


def sized_peak(
    point: Sequence[float], bands: Mapping[str, Sequence], band: str
) -> tuple[float, int | None]:
    """The peak of tokens an hour a plan sizes GPUs for, and its hour (an
    index into the forecast): the highest hour of the upper edge of `band`,
    or of the point forecast for "point" (or a band the forecast lacks);
    0 and None for an empty forecast."""
    values = point if band == "point" or band not in bands else bands[band][1]
    if len(values) == 0:
        return 0.0, None
    hour = max(range(len(values)), key=values.__getitem__)
    return max(float(values[hour]), 0.0), hour


@dataclass(frozen=True)
class ModelNeed:
    model: str
    peak_tokens_per_hour: float
    per_gpu_tokens_per_hour: float | None  # capacity at SLO of one GPU
    replica_gpus: float
    gpus_needed: float | None
    note: str
    gpus_at_peak: float | None = None  # the peak alone over capacity, no headroom, fractional
    gpus_held: float | None = None  # the GPUs of the pool's replicas serving this model

    @property
    def headroom_percent(self) -> float | None:
        """How much more than its peak this model's own GPUs carry within the SLO."""
        if self.gpus_at_peak is None or self.gpus_held is None or self.gpus_at_peak <= 0:
            return None
        return (self.gpus_held / self.gpus_at_peak - 1) * 100

    def as_json(self) -> dict:
        headroom = self.headroom_percent
        return {
            "model": self.model,
            "peak_tokens_per_hour": round(self.peak_tokens_per_hour, 1),
            "per_gpu_tokens_per_hour": None
            if self.per_gpu_tokens_per_hour is None
            else round(self.per_gpu_tokens_per_hour, 1),
            "replica_gpus": self.replica_gpus,
            "gpus_held": self.gpus_held,
            "gpus_needed": self.gpus_needed,
            "headroom_percent": None if headroom is None else round(headroom, 1),
            "note": self.note,
        }


@dataclass(frozen=True)
class PoolNeed:
    gpus_held: float
    gpus_needed: float | None
    gpus_contracted: float | None
    flags: list[str]
    models: list[ModelNeed] = field(default_factory=list)
    # GPUs the pool holds that no replica holds (a what-if's added GPUs):
    # whichever model needs them can have them.
    gpus_unplaced: float = 0.0

    def _placed(self) -> list[float]:
        """Each model's GPUs: its replicas', and a share of the unplaced by
        its GPUs at peak (equal shares where none is known)."""
        at_peak = [m.gpus_at_peak or 0.0 for m in self.models]
        total = sum(at_peak)
        shares = (
            [a / total for a in at_peak] if total > 0 else [1 / len(self.models)] * len(at_peak)
        )
        return [
            (m.gpus_held or 0.0) + self.gpus_unplaced * share
            for m, share in zip(self.models, shares, strict=True)
        ]

    @property
    def headroom_percent(self) -> float | None:
        """How much more than the forecast peak its GPUs carry within the
        SLO (negative: short of it); None where a capacity is unknown.
        Model by model, each on its own replicas' GPUs (an embedding
        model's GPU carries no chat tokens): the pool's is its tightest
        model's."""
        if not self.models or any(m.gpus_at_peak is None for m in self.models):
            return None
        each = [
            (held / m.gpus_at_peak - 1) * 100
            for m, held in zip(self.models, self._placed(), strict=True)
            if m.gpus_at_peak > 0
        ]
        return min(each) if each else None

    @property
    def gpus_surplus(self) -> float | None:
        """The GPUs beyond the need: each model's own beyond its need, those
        of replicas serving no model with demand, and unplaced GPUs no
        model's shortfall takes (a model short of GPUs is not helped by
        another model's replicas)."""
        if self.gpus_needed is None:
            return None
        own = sum(max(0.0, (m.gpus_held or 0.0) - m.gpus_needed) for m in self.models)
        short = sum(max(0.0, m.gpus_needed - (m.gpus_held or 0.0)) for m in self.models)
        placed = sum(m.gpus_held or 0.0 for m in self.models)
        others = max(0.0, self.gpus_held - placed - self.gpus_unplaced)
        return own + others + max(0.0, self.gpus_unplaced - short)


def model_need(
    *,
    model: str,
    peak: float,
    headroom_percent: float,
    capacities: list[tuple[float, float]],
    replica_gpus: list[float],
) -> ModelNeed:
    """`capacities`: (tokens an hour at SLO, GPUs) of each replica of the
    model in the pool that has a number; `replica_gpus`: every replica's GPUs."""
    size = statistics.median(replica_gpus) if replica_gpus else 1.0
    held = float(sum(replica_gpus))
    per_gpu = [tokens / gpus for tokens, gpus in capacities if gpus > 0 and tokens > 0]
    if not per_gpu:
        return ModelNeed(
            model, peak, None, size, None, "no replica with a capacity at its SLO", gpus_held=held
        )
    per = statistics.median(per_gpu)
    wanted = peak * (1 + headroom_percent / 100) / per  # GPUs, fractional
    replicas = math.ceil(wanted / size - 1e-9) if wanted > 0 else 0
    return ModelNeed(
        model,
        peak,
        per,
        size,
        round(replicas * size, 3),
        f"{replicas} replica{'s' * (replicas != 1)} of {size:g} GPU",
        peak / per,
        held,
    )


def pool_need(
    *,
    gpus_held: float,
    models: list[ModelNeed],
    contracted: float | None,
    gpus_unplaced: float = 0.0,
) -> PoolNeed:
    known = [m.gpus_needed for m in models if m.gpus_needed is not None]
    unknown = len(known) < len(models)
    needed = None if unknown else round(sum(known), 3)
    flags: list[str] = []
    # A model is short when its own replicas (and the GPUs no replica
    # holds) fall short of its need, whatever other models' replicas hold.
    short = sum(
        max(0.0, m.gpus_needed - (m.gpus_held or 0.0)) for m in models if m.gpus_needed is not None
    )
    if short > gpus_unplaced + 1e-9 or sum(known) > gpus_held + 1e-9:
        flags.append(UNDER)
    elif unknown:
        flags.append(UNKNOWN)
    else:
        smallest = min((m.replica_gpus for m in models), default=1.0)
        flags.append(OVER if gpus_held - sum(known) >= smallest - 1e-9 else OK)
    if contracted is not None and gpus_held + 1e-9 < contracted:
        flags.append(SHORT)
    return PoolNeed(gpus_held, needed, contracted, flags, models, gpus_unplaced)
