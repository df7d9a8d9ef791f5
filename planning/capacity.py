"""Capacity per replica at an SLO, measured from the ledger: each hour's
load on the replica (tokens served, requests in flight) against the p95
of its requests' time to first token and inter-token latency that hour
(metering.models.ReplicaLoadHour). Pure: a frame in, a Capacity out.

The hours, sorted by tokens served, are cut into up to BINS bins of equal
count; a bin's load is its hours' median, its latency the median of their
p95s (a typical hour at that load). Walking up from the lightest bin, the
first that misses a target ends it: capacity is where the curve crosses
the target, interpolated between that bin and the one below ("measured").
A replica that met its targets at the heaviest load seen has "at least"
that capacity ("not_reached"); one that missed them at the lightest has
none to plan on ("misses"). Hours with fewer than MIN_REQUESTS requests
carry no p95 worth the name; under MIN_HOURS such hours the data is "too
thin" and no number is given."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

MIN_REQUESTS = 20
MIN_HOURS = 24
BINS = 8
MIN_BIN_HOURS = 3

MEASURED, NOT_REACHED, MISSES, TOO_THIN = "measured", "not_reached", "misses", "too_thin"
PLANNABLE = (MEASURED, NOT_REACHED)


@dataclass(frozen=True)
class Slo:
    """The latency targets a replica is held to (ms, p95); None: not promised."""

    ttft_ms: float | None = None
    itl_ms: float | None = None

    def text(self) -> str:
        parts = [
            f"{label} p95 {value:g} ms"
            for label, value in (("TTFT", self.ttft_ms), ("inter-token", self.itl_ms))
            if value is not None
        ]
        return ", ".join(parts) or "no latency target"


@dataclass(frozen=True)
class Capacity:
    status: str
    tokens_per_hour: float | None  # at the SLO (at least, when not reached)
    hours: int  # hours with enough requests to count
    note: str
    curve: list[dict] = field(default_factory=list)

    @property
    def plannable(self) -> bool:
        return self.status in PLANNABLE


def _meets(value: float, target: float | None) -> bool:
    return target is None or np.isnan(value) or value <= target


def load_curve(points: pd.DataFrame) -> list[dict]:
    """The binned curve of latency against load (see the module's doc)."""
    ordered = points.sort_values("tokens", kind="stable")
    n_bins = max(1, min(BINS, len(ordered) // MIN_BIN_HOURS))
    curve = []
    for rows in np.array_split(np.arange(len(ordered)), n_bins):
        part = ordered.iloc[rows]
        itl = part["itl_p95_ms"].dropna().astype(float)
        curve.append(
            {
                "tokens_per_hour": float(part["tokens"].median()),
                "concurrency": round(float(part["busy_seconds"].median()) / 3600, 3),
                "ttft_p95_ms": round(float(part["ttft_p95_ms"].astype(float).median()), 3),
                "itl_p95_ms": round(float(itl.median()), 3) if len(itl) else None,
                "hours": len(part),
                "requests": int(part["requests"].sum()),
            }
        )
    return curve


def _crossing(low: dict, high: dict, slo: Slo) -> float:
    """Where between two bins (`low` meets, `high` misses) the curve reaches
    the first target it crosses: linear in load."""
    loads = []
    for key, target in (("ttft_p95_ms", slo.ttft_ms), ("itl_p95_ms", slo.itl_ms)):
        a, b = low[key], high[key]
        if target is None or a is None or b is None or b <= target:
            continue
        share = (target - a) / (b - a) if b > a else 0.0
        loads.append(
            low["tokens_per_hour"] + share * (high["tokens_per_hour"] - low["tokens_per_hour"])
        )
    return min(loads) if loads else low["tokens_per_hour"]


def capacity_at_slo(points: pd.DataFrame, slo: Slo) -> Capacity:
    """`points`: one replica's hours (tokens, requests, busy_seconds,
    ttft_p95_ms, itl_p95_ms)."""
    usable = points[(points["requests"] >= MIN_REQUESTS) & points["ttft_p95_ms"].notna()]
    hours = len(usable)
    if hours < MIN_HOURS:
        return Capacity(
            TOO_THIN,
            None,
            hours,
            f"too thin: {hours} hours of {MIN_REQUESTS} requests or more, {MIN_HOURS} needed",
        )
    curve = load_curve(usable)
    for k, point in enumerate(curve):
        met = _meets(point["ttft_p95_ms"], slo.ttft_ms) and _meets(
            np.nan if point["itl_p95_ms"] is None else point["itl_p95_ms"], slo.itl_ms
        )
        if met:
            continue
        if k == 0:
            return Capacity(
                MISSES,
                None,
                hours,
                f"misses {slo.text()} even at its lightest load measured "
                f"({point['tokens_per_hour']:,.0f} tokens an hour)",
                curve,
            )
        tokens = _crossing(curve[k - 1], point, slo)
        return Capacity(
            MEASURED, tokens, hours, f"{tokens:,.0f} tokens an hour at {slo.text()}", curve
        )
    top = curve[-1]["tokens_per_hour"]
    return Capacity(
        NOT_REACHED,
        top,
        hours,
        f"at least {top:,.0f} tokens an hour: met {slo.text()} at the heaviest load seen",
        curve,
    )
