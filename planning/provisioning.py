"""GPUs needed per pool, against the GPUs it holds and, for a reserved
pool, the GPUs its tenants contracted. Pure: planning.plan gathers the
figures.

For each model a pool serves: its forecast peak of tokens an hour (the
upper edge of the band finance chose, or the point forecast) plus the
headroom, over the capacity at SLO of one GPU of its replicas (the median
over its replicas that have a number: planning.capacity), in whole
replicas (the median replica's GPUs). A model whose capacity is not known
leaves the pool's need unknown, unless the models that are known already
need more than it holds.

Flags: "under" (needs more than it holds), "over" (holds at least one
replica's GPUs more than it needs), "unknown", "short_of_contract" (a
reserved pool holding fewer GPUs than its reservations in force). Money:
what the GPUs beyond the need cost over the horizon, and for a pool under
its need the SLA credits at risk: what its tenants' latency credits would
pay on their revenue over the horizon were the targets missed."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

UNDER, OVER, OK, UNKNOWN, SHORT = "under", "over", "ok", "unknown", "short_of_contract"


@dataclass(frozen=True)
class ModelNeed:
    model: str
    peak_tokens_per_hour: float
    per_gpu_tokens_per_hour: float | None  # capacity at SLO of one GPU
    replica_gpus: float
    gpus_needed: float | None
    note: str
    gpus_at_peak: float | None = None  # the peak alone over capacity, no headroom, fractional

    def as_json(self) -> dict:
        return {
            "model": self.model,
            "peak_tokens_per_hour": round(self.peak_tokens_per_hour, 1),
            "per_gpu_tokens_per_hour": None
            if self.per_gpu_tokens_per_hour is None
            else round(self.per_gpu_tokens_per_hour, 1),
            "replica_gpus": self.replica_gpus,
            "gpus_needed": self.gpus_needed,
            "note": self.note,
        }


@dataclass(frozen=True)
class PoolNeed:
    gpus_held: float
    gpus_needed: float | None
    gpus_contracted: float | None
    flags: list[str]
    models: list[ModelNeed] = field(default_factory=list)

    @property
    def headroom_percent(self) -> float | None:
        """How much more than the forecast peak its GPUs carry within the
        SLO (negative: short of it); None where a capacity is unknown."""
        if any(m.gpus_at_peak is None for m in self.models):
            return None
        at_peak = sum(m.gpus_at_peak for m in self.models)
        return (self.gpus_held / at_peak - 1) * 100 if at_peak > 0 else None


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
    per_gpu = [tokens / gpus for tokens, gpus in capacities if gpus > 0 and tokens > 0]
    if not per_gpu:
        return ModelNeed(model, peak, None, size, None, "no replica with a capacity at its SLO")
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
    )


def pool_need(*, gpus_held: float, models: list[ModelNeed], contracted: float | None) -> PoolNeed:
    known = [m.gpus_needed for m in models if m.gpus_needed is not None]
    unknown = len(known) < len(models)
    needed = None if unknown else round(sum(known), 3)
    flags: list[str] = []
    if sum(known) > gpus_held + 1e-9:
        flags.append(UNDER)
    elif unknown:
        flags.append(UNKNOWN)
    else:
        smallest = min((m.replica_gpus for m in models), default=1.0)
        flags.append(OVER if gpus_held - sum(known) >= smallest - 1e-9 else OK)
    if contracted is not None and gpus_held + 1e-9 < contracted:
        flags.append(SHORT)
    return PoolNeed(gpus_held, needed, contracted, flags, models)
