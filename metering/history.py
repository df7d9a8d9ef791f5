"""Synthetic usage history: hourly rollups for earlier months, so charts
and month-over-month figures have something to show on a fresh install.

Every row written is marked `synthetic`; a re-run replaces the synthetic
rows in its range (same seed, same rows) and never touches real usage,
and an hour that already holds a real row for a stream is left alone.
Each stream is one tenant on one replica, with a daily shape, a weekly
dip, steady growth and noise; device-seconds follow the tokens and never
exceed the replica's GPUs x 3600 in an hour."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
from django.db import connection

from core.calendar import moment_epoch_hour
from core.locks import advisory_xact_lock
from metering.jobs import RUN_LOCK
from metering.models import ReplicaLoadHour, UsageRollup

HOUR = timedelta(hours=1)
SHAPES = ("business", "nightly", "flat")


@dataclass(frozen=True)
class HistoryStream:
    """One tenant's traffic on one replica."""

    tenant_id: int
    replica_id: int
    pool_id: int
    served_model_id: int
    gpus: int
    tokens_per_hour: int  # the average at the end of the history
    shape: str = "business"  # business hours, nightly batch or flat
    prompt_share: float = 0.7  # ok-float: a generator's knob, not money
    cached_share: float = 0.0  # ok-float: of the prompt tokens
    tokens_per_request: int = 1200
    priority: int = 0


@dataclass(frozen=True)
class HistoryShape:
    """How the traffic moves: monthly growth, weekend level, noise, and the
    decode throughput that turns tokens into device-seconds (a prompt
    token costs `prefill_weight` of a generated one)."""

    monthly_growth: float = 0.12  # ok-float
    weekend: float = 0.55  # ok-float
    noise: float = 0.18  # ok-float
    decode_tokens_per_second: float = 1200.0  # ok-float: per GPU
    prefill_weight: float = 0.1  # ok-float
    busiest: float = 0.97  # ok-float: of a replica's device-seconds in an hour
    ttft_idle_ms: float = 250.0  # ok-float: TTFT p95 of an idle replica
    itl_idle_ms: float = 40.0  # ok-float: inter-token p95 of an idle replica


def hourly_profile(hours: np.ndarray, *, shape: str) -> np.ndarray:
    """A mean-one daily curve for hours given as UTC epoch-hours."""
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {SHAPES}, not {shape!r}")
    hour_of_day = hours % 24
    if shape == "business":
        curve = 0.25 + np.clip(np.sin(np.pi * (hour_of_day - 6) / 16), 0, None)
    elif shape == "nightly":
        curve = np.where(hour_of_day < 6, 3.0, 0.3)
    else:
        curve = np.ones_like(hour_of_day, dtype=float)  # ok-float: a demo traffic curve's shape
    return curve / curve[:24].mean() if len(curve) >= 24 else curve


def history_tokens(
    stream: HistoryStream, *, start: datetime, hours: int, shape: HistoryShape, rng
) -> np.ndarray:
    """Tokens per hour for one stream, growing towards its stated average."""
    epoch_hours = moment_epoch_hour(start) + np.arange(hours)
    daily = hourly_profile(epoch_hours, shape=stream.shape)
    weekday = ((epoch_hours // 24) + 3) % 7  # 1970-01-01 was a Thursday: 0 = Monday
    weekly = np.where(weekday >= 5, shape.weekend, 1.0)
    months_before_end = (hours - np.arange(hours)) / (24 * 30.4)
    growth = (1 + shape.monthly_growth) ** -months_before_end
    noise = rng.lognormal(mean=0.0, sigma=shape.noise, size=hours)
    return stream.tokens_per_hour * daily * weekly * growth * noise


@dataclass(frozen=True)
class _StreamHours:
    stream: HistoryStream
    prompt: np.ndarray  # tokens an hour, scaled to what the replica could serve
    completion: np.ndarray
    seconds: np.ndarray  # device-seconds an hour, likewise


def _stream_hours(
    streams: list[HistoryStream], *, start: datetime, hours: int, seed: int, shape: HistoryShape
) -> list[_StreamHours]:
    rng = np.random.default_rng(seed)
    per_stream = []
    for stream in streams:
        tokens = history_tokens(stream, start=start, hours=hours, shape=shape, rng=rng)
        prompt = tokens * stream.prompt_share
        completion = tokens - prompt
        weighted = prompt * shape.prefill_weight + completion
        seconds = weighted / shape.decode_tokens_per_second
        per_stream.append((stream, prompt, completion, seconds))
    # A replica cannot be busier than its GPUs allow: scale its hours down.
    busy: dict[int, np.ndarray] = {}
    for stream, _, _, seconds in per_stream:
        busy[stream.replica_id] = busy.get(stream.replica_id, 0) + seconds
    capacity = {s.replica_id: s.gpus * 3600 * shape.busiest for s in streams}
    scale = {
        replica: np.minimum(1.0, capacity[replica] / np.maximum(total, 1e-9))
        for replica, total in busy.items()
    }
    return [
        _StreamHours(
            stream,
            prompt * scale[stream.replica_id],
            completion * scale[stream.replica_id],
            seconds * scale[stream.replica_id],
        )
        for stream, prompt, completion, seconds in per_stream
    ]


def history_rows(
    streams: list[HistoryStream],
    *,
    start: datetime,
    end: datetime,
    seed: int = 7,
    shape: HistoryShape | None = None,
) -> list[tuple]:
    """The rollup rows, computed (nothing written). Deterministic for a seed."""
    return _rollup_rows(_history(streams, start=start, end=end, seed=seed, shape=shape), start)


def _history(streams, *, start, end, seed, shape) -> list[_StreamHours]:
    hours = int((end - start) / HOUR)
    if hours <= 0:
        return []
    return _stream_hours(
        streams, start=start, hours=hours, seed=seed, shape=shape or HistoryShape()
    )


def _rollup_rows(parts: list[_StreamHours], start: datetime) -> list[tuple]:
    rows = []
    for part in parts:
        stream = part.stream
        prompt_n = np.floor(part.prompt).astype(np.int64)
        completion_n = np.floor(part.completion).astype(np.int64)
        cached_n = np.floor(prompt_n * stream.cached_share).astype(np.int64)
        seconds_s = np.round(part.seconds, 6)
        requests = np.maximum(1, (prompt_n + completion_n) // stream.tokens_per_request)
        for h in np.flatnonzero(prompt_n + completion_n > 0):
            rows.append(
                (
                    start + int(h) * HOUR,
                    stream.tenant_id,
                    stream.served_model_id,
                    stream.pool_id,
                    stream.replica_id,
                    stream.priority,
                    int(prompt_n[h]),
                    int(cached_n[h]),
                    int(completion_n[h]),
                    int(requests[h]),
                    f"{seconds_s[h]:.6f}",
                )
            )
    return rows


def history_load_rows(
    streams: list[HistoryStream],
    *,
    start: datetime,
    end: datetime,
    seed: int = 7,
    shape: HistoryShape | None = None,
) -> list[tuple]:
    """Each replica's load and latency per hour (ReplicaLoadHour rows) for
    the same traffic as history_rows: latency rises with how busy the
    replica is (rho, its device-seconds over its GPUs' hour) as a queue's
    does, TTFT p95 = ttft_idle x (1 + 3 rho / (1 - rho)), inter-token p95
    = itl_idle x (1 + 4 rho^2), each with 10% noise; busy request-seconds
    by Little's law from those."""
    parts = _history(streams, start=start, end=end, seed=seed, shape=shape)
    return _load_rows(parts, start=start, seed=seed, shape=shape or HistoryShape())


def _load_rows(
    parts: list[_StreamHours], *, start: datetime, seed: int, shape: HistoryShape
) -> list[tuple]:
    if not parts:
        return []
    hours = len(parts[0].prompt)
    replicas: dict[int, dict] = {}
    for part in parts:
        stream = part.stream
        tokens = np.floor(part.prompt) + np.floor(part.completion)
        into = replicas.setdefault(
            stream.replica_id,
            {
                "stream": stream,
                "tokens": np.zeros(hours),
                "completion": np.zeros(hours),
                "requests": np.zeros(hours),
                "seconds": np.zeros(hours),
            },
        )
        into["tokens"] += tokens
        into["completion"] += np.floor(part.completion)
        into["requests"] += np.where(
            tokens > 0, np.maximum(1, tokens // stream.tokens_per_request), 0
        )
        into["seconds"] += part.seconds
    rng = np.random.default_rng(seed + 1)  # the rollups' draws stay as they were
    rows = []
    for replica_id, into in sorted(replicas.items()):
        stream = into["stream"]
        rho = np.clip(into["seconds"] / (stream.gpus * 3600), 0.0, shape.busiest)
        ttft = shape.ttft_idle_ms * (1 + 3 * rho / (1 - rho)) * rng.lognormal(0, 0.1, hours)
        itl = shape.itl_idle_ms * (1 + 4 * rho**2) * rng.lognormal(0, 0.1, hours)
        per_request = into["completion"] / np.maximum(into["requests"], 1)
        busy = into["requests"] * (ttft / 2 + per_request * itl * 0.8) / 1000
        for h in np.flatnonzero(into["requests"] > 0):
            rows.append(
                (
                    start + int(h) * HOUR,
                    replica_id,
                    stream.served_model_id,
                    stream.pool_id,
                    int(into["requests"][h]),
                    int(into["tokens"][h]),
                    f"{busy[h]:.3f}",
                    f"{ttft[h]:.3f}",
                    f"{itl[h]:.3f}",
                )
            )
    return rows


INSERT = """
INSERT INTO metering_usagerollup (hour, tenant_id, served_model_id, pool_id, replica_id,
    priority, prompt_tokens, cached_tokens, completion_tokens, requests_ok, requests_aborted,
    requests_error, requests_rejected, device_seconds, synthetic)
SELECT h, t, m, p, r, pr, pt, ct, gt, ok, 0, 0, 0, ds, true
FROM unnest(%s::timestamptz[], %s::bigint[], %s::bigint[], %s::bigint[], %s::bigint[],
            %s::int[], %s::bigint[], %s::bigint[], %s::bigint[], %s::bigint[], %s::numeric[])
     AS u(h, t, m, p, r, pr, pt, ct, gt, ok, ds)
ON CONFLICT ON CONSTRAINT rollup_unique DO NOTHING
"""
INSERT_LOAD = """
INSERT INTO metering_replicaloadhour (hour, replica_id, served_model_id, pool_id, requests,
    tokens, busy_seconds, ttft_p95_ms, itl_p95_ms, synthetic)
SELECT h, r, m, p, n, t, b, f, i, true
FROM unnest(%s::timestamptz[], %s::bigint[], %s::bigint[], %s::bigint[], %s::bigint[],
            %s::bigint[], %s::numeric[], %s::numeric[], %s::numeric[])
     AS u(h, r, m, p, n, t, b, f, i)
ON CONFLICT ON CONSTRAINT load_hour_unique DO NOTHING
"""


def history_write(
    streams: list[HistoryStream],
    *,
    start: datetime,
    end: datetime,
    seed: int = 7,
    shape: HistoryShape | None = None,
    progress: Callable[[int, int], None] | None = None,
    chunk: int = 20_000,
) -> int:
    """Replace the synthetic rollups of these tenants in [start, end), and
    their replicas' synthetic load hours, with freshly generated ones, in
    one transaction. Returns the rollup rows written."""
    parts = _history(streams, start=start, end=end, seed=seed, shape=shape)
    rows = _rollup_rows(parts, start)
    load_rows = _load_rows(parts, start=start, seed=seed, shape=shape or HistoryShape())
    written = 0
    # The metering run's lock: the two never rewrite the same days' totals
    # (UsageDay) at once, whose row locks they would take in no one order.
    with advisory_xact_lock(RUN_LOCK):
        UsageRollup.objects.filter(
            synthetic=True,
            hour__gte=start,
            hour__lt=end,
            tenant_id__in={s.tenant_id for s in streams},
        ).delete()
        with connection.cursor() as cursor:
            for at in range(0, len(rows), chunk):
                columns = list(zip(*rows[at : at + chunk], strict=True))
                cursor.execute(INSERT, [list(column) for column in columns])
                written += cursor.rowcount
                if progress:
                    progress(min(at + chunk, len(rows)), len(rows))
            ReplicaLoadHour.objects.filter(
                synthetic=True,
                hour__gte=start,
                hour__lt=end,
                replica_id__in={s.replica_id for s in streams},
            ).delete()
            for at in range(0, len(load_rows), chunk):
                columns = list(zip(*load_rows[at : at + chunk], strict=True))
                cursor.execute(INSERT_LOAD, [list(column) for column in columns])
    return written
