"""Attribution jobs: read a replica's requests for its pending windows from
the ledger, split its device time (metering.attribution), and store the
shares and each window's totals. Re-running a window replaces its results; usage
that arrives while it runs leaves it pending for the next run."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import groupby

import numpy as np
import pandas as pd
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from core.db_frames import query_frame
from metering.attribution import Timeline, WindowAttribution, attribute_window
from metering.choices import WindowStatus
from metering.models import AttributionShare, AttributionWindow, RequestShares
from metering.rollups import hours_mark_dirty

logger = logging.getLogger(__name__)

GROUP_COLUMNS = ("tenant_id", "served_model_id", "pool_id", "priority")
SHARE_COLUMNS = ("window_id", *GROUP_COLUMNS, "requests", "device_ns")


def _epoch_us_sql(column: str) -> str:
    """Epoch microseconds of a timestamp column, computed by PostgreSQL in
    float8 (far faster than numeric) and exact: a double resolves 2.4e-7 s
    at today's epoch, so rounding recovers the stored microsecond."""
    return f"round(date_part('epoch', {column}) * 1000000)::bigint"


_EVENT_COLUMNS = {
    "replica_id": "replica_id",
    "request_id": "request_id",
    "tenant_id": "tenant_id",
    "served_model_id": "served_model_id",
    "pool_id": "pool_id",
    "priority": "priority",
    "sent_us": _epoch_us_sql("coalesce(sent_at, received_at)"),
    "first_token_us": _epoch_us_sql("first_token_at"),
    "ended_us": _epoch_us_sql("ended_at"),
    "queue_us": "round(queue_ms::float8 * 1000)::bigint",
    "ttft_us": "round(ttft_ms::float8 * 1000)::bigint",
    "generation_us": "round(generation_ms::float8 * 1000)::bigint",
    "prompt_tokens": "prompt_tokens",
    "cached_tokens": "cached_tokens",
    "completion_tokens": "completion_tokens",
    "decode_only": "(phase = 'decode')::int",
}
_EVENTS = (
    "SELECT "
    + ", ".join(f"{expr} AS {name}" for name, expr in _EVENT_COLUMNS.items())
    + """
    FROM metering_usageevent
    WHERE replica_id = ANY(%s) AND status <> 'rejected'
      AND received_at >= %s AND received_at < %s AND ended_at > %s
"""
)
_DTYPES = {name: "int64" for name in _EVENT_COLUMNS} | {"request_id": str}
_DTYPES |= {c: "Int64" for c in ("served_model_id", "pool_id", "first_token_us")}
_DTYPES |= {c: "Int64" for c in ("queue_us", "ttft_us", "generation_us")}
# The longest span of windows attributed together (per replica: one
# transaction to write), which bounds memory with REPLICAS_PER_READ.
BATCH_SPAN = timedelta(hours=24)
# Replicas whose usage is read from the ledger in one query. Their rows
# interleave on the ledger's pages, so a query for one replica's day visits
# every page of that day: reading several at once saves those passes
# (0.4 s a pass over a day of 1 M requests, measured), at the memory of
# that many replicas' usage.
REPLICAS_PER_READ = 4


@dataclass(frozen=True)
class WindowOutcome:
    window_id: int
    requests: int
    attributed_ns: int
    idle_ns: int
    capacity_ns: int
    still_pending: bool


def _epoch_us(moment: datetime) -> int:
    delta = moment - datetime(1970, 1, 1, tzinfo=moment.tzinfo)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def events_frames(
    *, replica_ids: list[int], start: datetime, end: datetime, raw=None
) -> dict[int, pd.DataFrame]:
    """The requests resident on each of `replica_ids` during [start, end),
    a DataFrame per replica (no Python object per row), read in one query."""
    lookback = start - timedelta(seconds=settings.METERING["MAX_REQUEST_SECONDS"])
    ids = [int(r) for r in replica_ids]
    frame = query_frame(_EVENTS, [ids, lookback, end, start], _DTYPES, raw=raw)
    parts = {
        int(replica_id): part.reset_index(drop=True)
        for replica_id, part in frame.groupby("replica_id", sort=False)
    }
    return {r: parts[r] if r in parts else frame.iloc[:0] for r in ids}


def timeline_from_events(events: pd.DataFrame) -> Timeline:
    """Phase boundaries from the engine's own timings where the event has
    them: scheduled = sent + queue; first token = scheduled + TTFT; last
    token = first + generation. Without them (timing "gateway"): sent to
    first token to end as the gateway saw them. An engine that reports its
    inference time whole (generation without TTFT, TGI) is resident from
    scheduling for that long, its first token unknown (prefill is then
    taken as the moment it was scheduled). Never past the request's end."""
    sent = events["sent_us"].to_numpy(np.int64)
    ended = events["ended_us"].to_numpy(np.int64)
    start = sent + events["queue_us"].fillna(0).to_numpy(np.int64)
    start = np.minimum(start, ended)
    ttft = events["ttft_us"]
    seen_first = events["first_token_us"].fillna(-1).to_numpy(np.int64)
    first = np.where(
        ttft.notna().to_numpy(),
        start + ttft.fillna(0).to_numpy(np.int64),
        np.where(seen_first >= 0, seen_first, start),
    )
    first = np.clip(first, start, ended)
    generation = events["generation_us"]
    whole = (generation.notna() & ttft.isna()).to_numpy()  # inference time, whole
    first = np.where(whole, start, first)
    end = np.where(
        generation.notna().to_numpy(), first + generation.fillna(0).to_numpy(np.int64), ended
    )
    end = np.clip(end, first, ended)
    prompt = events["prompt_tokens"].to_numpy(np.float64)
    cached = events["cached_tokens"].to_numpy(np.float64)
    completion = events["completion_tokens"].to_numpy(np.float64)
    # A decode phase read its prompt as KV cache from its prefill replica.
    uncached = np.where(events["decode_only"].to_numpy() == 1, 0.0, prompt - cached)
    return Timeline(
        start_us=start,
        first_us=first,
        end_us=end,
        prefill_tokens=uncached,
        context_tokens=prompt + completion / 2,
    )


def attribution_window_compute(*, window_id: int, policy: str | None = None) -> WindowOutcome:
    """Compute one window (see attribution_windows_compute)."""
    (outcome,) = attribution_windows_compute(window_ids=[window_id], policy=policy)
    return outcome


def attribution_windows_compute(
    *, window_ids: list[int], policy: str | None = None
) -> list[WindowOutcome]:
    """Compute `window_ids` and store their shares and totals, replacing any
    earlier run. Replica by replica: numpy per window, one transaction to
    write; one read of the ledger for all the windows of REPLICAS_PER_READ
    replicas (memory stays bounded by their usage). Safe to run twice, and
    concurrently with ingestion: a window that new usage marked while it
    was being computed stays pending for the next run."""
    policy = policy or settings.METERING["ATTRIBUTION_POLICY"]
    replicas = attribution_windows_by_replica(window_ids)
    outcomes: list[WindowOutcome] = []
    if not replicas:
        return outcomes
    reads = [
        replicas[i : i + REPLICAS_PER_READ] for i in range(0, len(replicas), REPLICAS_PER_READ)
    ]
    connection.ensure_connection()
    raw = connection.connection
    # The next replicas' usage is read (by the server, on this same session)
    # while these ones' is computed: two cores busy instead of one.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="attribution-read") as reader:

        def read(groups: list[list[AttributionWindow]]):
            windows = [w for group in groups for w in group]
            return reader.submit(
                events_frames,
                replica_ids=[group[0].replica_id for group in groups],
                start=min(w.start for w in windows),
                end=max(w.end for w in windows),
                raw=raw,
            )

        pending = read(reads[0])
        for n, groups in enumerate(reads):
            frames = pending.result()
            if n + 1 < len(reads):
                pending = read(reads[n + 1])
            for group in groups:
                outcomes += _compute_replica(group, frames[group[0].replica_id], policy=policy)
    return outcomes


@dataclass(frozen=True)
class WindowSpec:
    """A window to attribute: its id and its bounds in epoch microseconds."""

    window_id: int
    start_us: int
    end_us: int


@dataclass(frozen=True)
class ReplicaShape:
    """What attributing a replica's device time needs to know of it."""

    gpu_units: int
    weight_bytes: int | None
    kv_bytes_per_token: int | None


@dataclass
class ReplicaComputed:
    """One replica's windows attributed, ready to store: each window's
    totals and resident count, the shares per group, and per request."""

    results: dict[int, tuple[WindowAttribution, int]]
    groups: pd.DataFrame
    vectors: list[tuple[int, list[str], list[int]]]


def replica_compute(
    frame: pd.DataFrame, windows: list[WindowSpec], shape: ReplicaShape, *, policy: str
) -> ReplicaComputed:
    """Attribute one replica's windows from its requests (`frame`, as
    events_frames reads them from the ledger or metering.log.frames from
    the raw-event store): pure computation, the same whichever path read
    them, on whichever machine. Rows are taken in request-id order, so the
    split of a tie (largest remainder) does not depend on where they came
    from or in what order."""
    frame = frame.sort_values("request_id", kind="stable", ignore_index=True)
    timeline = timeline_from_events(frame)
    results, residents, vectors = {}, [], []
    # Rows are taken by position from these, once per window: two boolean
    # .loc selections of the whole frame per window cost more than the
    # attribution itself (profiled).
    grouped = frame[["request_id", *GROUP_COLUMNS]]
    request_ids = frame["request_id"].to_numpy(dtype=object)
    for window in windows:
        lo, hi = window.start_us, window.end_us
        inside = (timeline.start_us < hi) & (timeline.end_us > lo)
        result = attribute_window(
            timeline.subset(inside),
            window_start_us=lo,
            window_end_us=hi,
            gpu_units=shape.gpu_units,
            policy=policy,
            weight_bytes=shape.weight_bytes,
            kv_bytes_per_token=shape.kv_bytes_per_token,
        )
        used = result.device_ns > 0  # resident only before the window: nothing here
        rows = np.flatnonzero(inside)[used]
        resident = grouped.iloc[rows]
        device_ns = result.device_ns[used]
        vectors.append((window.window_id, request_ids[rows].tolist(), device_ns.tolist()))
        residents.append(
            resident.assign(window_id=window.window_id, device_ns=device_ns, requests=1)
        )
        results[window.window_id] = (result, len(resident))
    keys = ["window_id", *GROUP_COLUMNS]
    groups = (
        pd.concat(residents)
        .groupby(keys, dropna=False, as_index=False)[["requests", "device_ns"]]
        .sum()
    )
    return ReplicaComputed(results=results, groups=groups, vectors=vectors)


def window_specs(windows: list[AttributionWindow]) -> list[WindowSpec]:
    return [WindowSpec(w.pk, _epoch_us(w.start), _epoch_us(w.end)) for w in windows]


def replica_shape(window: AttributionWindow) -> ReplicaShape:
    """Of a window read with attribution_windows' annotations."""
    model = window.replica.model
    return ReplicaShape(window.replica_units, model.weight_bytes, model.kv_bytes_per_token)


def attribution_windows_by_replica(window_ids: list[int]) -> list[list[AttributionWindow]]:
    """`window_ids`' windows, grouped by replica (in replica, then time
    order), each with its replica's model and GPU units."""
    windows = list(
        AttributionWindow.objects.filter(pk__in=window_ids)
        .select_related("replica__model")
        .annotate(replica_units=Coalesce(Sum("replica__gpu_shares__units"), 0))
        .order_by("replica_id", "start")
    )
    return [list(group) for _, group in groupby(windows, key=lambda w: w.replica_id)]


def _compute_replica(
    windows: list[AttributionWindow], frame: pd.DataFrame, *, policy: str
) -> list[WindowOutcome]:
    if windows[0].replica_units == 0:
        logger.warning(
            "replica %s holds no GPUs: its windows have no capacity", windows[0].replica.name
        )
    specs, shape = window_specs(windows), replica_shape(windows[0])
    computed = replica_compute(frame, specs, shape, policy=policy)
    return replica_store(windows, computed, policy=policy)


def replica_store(
    windows: list[AttributionWindow], computed: ReplicaComputed, *, policy: str
) -> list[WindowOutcome]:
    """A replica's computed windows stored in one transaction, replacing
    what an earlier run stored for them; a window marked again meanwhile
    stays pending."""
    results, groups, vectors = computed.results, computed.groups, computed.vectors
    marked = {w.pk: w.marked_at for w in windows}
    ids = sorted(marked)
    outcomes = []
    with transaction.atomic():
        _derived_commit()
        locked = {  # in id order, as every writer of these rows locks them
            w.pk: w for w in AttributionWindow.objects.select_for_update().filter(pk__in=ids)
        }
        AttributionShare.objects.filter(window_id__in=ids).delete()
        RequestShares.objects.filter(window_id__in=ids).delete()
        _copy_groups(groups)
        _copy_vectors(vectors)
        now = timezone.now()
        gpu_units = {w.pk: w.replica_units for w in windows}
        updates = []
        for window_id in ids:
            result, requests = results[window_id]
            still_pending = locked[window_id].marked_at != marked[window_id]
            status = WindowStatus.PENDING if still_pending else WindowStatus.DONE
            updates.append(
                (
                    window_id,
                    status,
                    gpu_units[window_id],
                    result.capacity_ns,
                    result.attributed_ns,
                    result.idle_ns,
                    requests,
                )
            )
            outcomes.append(
                WindowOutcome(
                    window_id=window_id,
                    requests=requests,
                    attributed_ns=result.attributed_ns,
                    idle_ns=result.idle_ns,
                    capacity_ns=result.capacity_ns,
                    still_pending=still_pending,
                )
            )
        _update_windows(updates, policy=policy, computed_at=now)
        hours_mark_dirty(hours={w.start for w in locked.values()})  # device-seconds changed
    return outcomes


def _derived_commit() -> None:
    """Derived rows (recomputable from the ledger) need not wait for the
    disk at commit: the WAL is one sequence, so any later synchronous commit
    (the next ledger batch) makes them durable, and a crash before that
    loses whole transactions, leaving their windows pending to recompute."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL synchronous_commit TO OFF")


def _update_windows(updates: list[tuple], *, policy: str, computed_at) -> None:
    """One UPDATE for every window of the batch."""
    values = ", ".join(["(%s, %s, %s, %s::bigint, %s::bigint, %s::bigint, %s)"] * len(updates))
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE metering_attributionwindow w
            SET status = v.status, gpu_units = v.gpu_units, capacity_ns = v.capacity_ns,
                attributed_ns = v.attributed_ns, idle_ns = v.idle_ns, requests = v.requests,
                policy = %s, computed_at = %s
            FROM (VALUES {values})
                AS v (id, status, gpu_units, capacity_ns, attributed_ns, idle_ns, requests)
            WHERE w.id = v.id
            """,
            [policy, computed_at, *(value for row in updates for value in row)],
        )


def _copy_groups(groups: pd.DataFrame) -> None:
    if groups.empty:
        return
    csv = groups.to_csv(index=False, header=False, columns=list(SHARE_COLUMNS)).encode()
    columns = ", ".join(SHARE_COLUMNS)
    sql = f"COPY metering_attributionshare ({columns}) FROM STDIN WITH (FORMAT csv)"
    with (
        connection.cursor() as cursor,
        connection.wrap_database_errors,
        cursor.cursor.copy(sql) as copy,
    ):
        copy.write(csv)


def _copy_vectors(vectors: list[tuple[int, list[str], list[int]]]) -> None:
    """One row per window: its request ids and their device-nanoseconds, in
    COPY's binary format (psycopg encodes the arrays; no text escaping)."""
    sql = (
        "COPY metering_requestshares (window_id, request_ids, device_ns) FROM STDIN (FORMAT BINARY)"
    )
    with (
        connection.cursor() as cursor,
        connection.wrap_database_errors,
        cursor.cursor.copy(sql) as copy,
    ):
        copy.set_types(["int8", "varchar[]", "int8[]"])
        for row in vectors:
            copy.write_row(row)


def attribution_batches(window_ids: list[int]) -> list[list[int]]:
    """Due windows in batches spanning at most BATCH_SPAN (bounded memory)."""
    rows = AttributionWindow.objects.filter(pk__in=window_ids).order_by("start")
    batches: list[list[int]] = []
    batch_start = None
    for pk, start in rows.values_list("pk", "start"):
        if batch_start is None or start - batch_start >= BATCH_SPAN:
            batches.append([])
            batch_start = start
        batches[-1].append(pk)
    return batches


def attribution_windows_due(*, now: datetime | None = None) -> list[int]:
    """Pending windows that closed at least the grace period ago (records of
    requests still running at the close arrive when they end)."""
    now = now or timezone.now()
    closed_before = now - timedelta(seconds=settings.METERING["ATTRIBUTION_GRACE_SECONDS"])
    return list(
        AttributionWindow.objects.filter(
            status=WindowStatus.PENDING, end__lte=closed_before
        ).values_list("pk", flat=True)
    )


@dataclass(frozen=True)
class ConservationBreak:
    window_id: int
    replica_id: int
    start: datetime
    capacity_ns: int
    attributed_ns: int
    idle_ns: int
    shares_ns: int
    requests_ns: int

    def __str__(self) -> str:
        return (
            f"window {self.window_id} (replica {self.replica_id}, {self.start:%Y-%m-%d %H:%M}): "
            f"capacity {self.capacity_ns} != attributed {self.attributed_ns} + idle "
            f"{self.idle_ns}, or shares sum {self.shares_ns} / per request {self.requests_ns}"
        )


def attribution_conservation_check(*, since: datetime | None = None) -> list[ConservationBreak]:
    """Attributed windows where attributed + idle != capacity, or the stored
    shares (per group, per request) do not add up to the attributed total.
    Expected: none."""
    since = since or timezone.now() - timedelta(days=35)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT w.id, w.replica_id, w.start, w.capacity_ns, w.attributed_ns, w.idle_ns,
                   coalesce(g.ns, 0), coalesce(v.ns, 0)
            FROM metering_attributionwindow w
            LEFT JOIN (
                SELECT window_id, sum(device_ns) AS ns FROM metering_attributionshare
                GROUP BY window_id
            ) g ON g.window_id = w.id
            LEFT JOIN (
                SELECT window_id, (SELECT sum(x) FROM unnest(device_ns) x) AS ns
                FROM metering_requestshares
            ) v ON v.window_id = w.id
            WHERE w.status = 'done' AND w.start >= %s
              AND (w.attributed_ns + w.idle_ns <> w.capacity_ns
                   OR coalesce(g.ns, 0) <> w.attributed_ns
                   OR coalesce(v.ns, 0) <> w.attributed_ns)
            """,
            [since],
        )
        breaks = [ConservationBreak(*row) for row in cursor.fetchall()]
    for found in breaks:
        logger.error("conservation break: %s", found)
    return breaks
