"""Attribution jobs: read one replica's requests for a window from the
ledger, split its device time (metering.attribution), and store the shares
and the window's totals. Re-running a window replaces its results; usage
that arrives while it runs leaves it pending for the next run."""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
import pandas as pd
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from metering.attribution import Timeline, attribute_window
from metering.choices import WindowStatus
from metering.models import AttributionShare, AttributionWindow
from metering.rollups import hour_mark_dirty

logger = logging.getLogger(__name__)

SHARE_COLUMNS = (
    "window_id",
    "request_id",
    "tenant_id",
    "served_model_id",
    "pool_id",
    "priority",
    "device_ns",
)
# Epoch microseconds computed by PostgreSQL (exact: numeric arithmetic).
_WINDOW_EVENTS = """
    SELECT request_id, tenant_id, served_model_id, pool_id, priority,
           (extract(epoch FROM coalesce(sent_at, received_at)) * 1000000)::bigint AS sent_us,
           (extract(epoch FROM first_token_at) * 1000000)::bigint AS first_token_us,
           (extract(epoch FROM ended_at) * 1000000)::bigint AS ended_us,
           (queue_ms * 1000)::bigint AS queue_us,
           (ttft_ms * 1000)::bigint AS ttft_us,
           (generation_ms * 1000)::bigint AS generation_us,
           prompt_tokens, cached_tokens, completion_tokens
    FROM metering_usageevent
    WHERE replica_id = {replica} AND status <> 'rejected'
      AND received_at >= '{lookback}' AND received_at < '{end}' AND ended_at > '{start}'
"""
_DTYPES = {"served_model_id": "Int64", "pool_id": "Int64", "first_token_us": "Int64"}
_DTYPES.update({c: "Int64" for c in ("queue_us", "ttft_us", "generation_us")})


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


def window_events_frame(*, replica_id: int, start: datetime, end: datetime) -> pd.DataFrame:
    """The requests resident on `replica_id` during [start, end), read with
    COPY into a DataFrame (no Python object per row)."""
    lookback = start - timedelta(seconds=settings.METERING["MAX_REQUEST_SECONDS"])
    query = _WINDOW_EVENTS.format(
        replica=int(replica_id),
        lookback=lookback.isoformat(),
        start=start.isoformat(),
        end=end.isoformat(),
    )
    buffer = io.BytesIO()
    sql = f"COPY ({query}) TO STDOUT WITH (FORMAT csv, HEADER)"
    with (
        connection.cursor() as cursor,
        connection.wrap_database_errors,
        cursor.cursor.copy(sql) as copy,
    ):
        for chunk in copy:
            buffer.write(chunk)
    buffer.seek(0)
    return pd.read_csv(buffer, dtype=_DTYPES | {"request_id": str})


def timeline_from_events(events: pd.DataFrame) -> Timeline:
    """Phase boundaries from vLLM's own timings where the event has them:
    scheduled = sent + queue; first token = scheduled + TTFT; last token =
    first + generation. Without them: sent to first token to end as the
    gateway saw them. Never past the request's end."""
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
    end = np.where(
        generation.notna().to_numpy(), first + generation.fillna(0).to_numpy(np.int64), ended
    )
    end = np.clip(end, first, ended)
    prompt = events["prompt_tokens"].to_numpy(np.float64)
    cached = events["cached_tokens"].to_numpy(np.float64)
    completion = events["completion_tokens"].to_numpy(np.float64)
    return Timeline(
        start_us=start,
        first_us=first,
        end_us=end,
        prefill_tokens=prompt - cached,
        context_tokens=prompt + completion / 2,
    )


def attribution_window_compute(*, window_id: int, policy: str | None = None) -> WindowOutcome:
    """Compute one window and store its shares and totals (replacing any
    earlier run). Safe to run twice, and concurrently with ingestion."""
    policy = policy or settings.METERING["ATTRIBUTION_POLICY"]
    window = AttributionWindow.objects.select_related("replica__model").get(pk=window_id)
    marked_at = window.marked_at
    replica = window.replica
    gpus = replica.gpus.count()
    if gpus == 0:
        logger.warning("replica %s holds no GPUs: its windows have no capacity", replica.name)
    events = window_events_frame(replica_id=replica.pk, start=window.start, end=window.end)
    result = attribute_window(
        timeline_from_events(events),
        window_start_us=_epoch_us(window.start),
        window_end_us=_epoch_us(window.end),
        gpus=gpus,
        policy=policy,
        weight_bytes=replica.model.weight_bytes,
        kv_bytes_per_token=replica.model.kv_bytes_per_token,
    )
    shares = events[["request_id", "tenant_id", "served_model_id", "pool_id", "priority"]].copy()
    shares.insert(0, "window_id", window.pk)
    shares["device_ns"] = result.device_ns
    shares = shares[shares["device_ns"] > 0]  # resident before the window only

    with transaction.atomic():
        window = AttributionWindow.objects.select_for_update().get(pk=window_id)
        still_pending = window.marked_at != marked_at  # usage arrived while we computed
        AttributionShare.objects.filter(window=window).delete()
        _copy_shares(shares)
        window.status = WindowStatus.PENDING if still_pending else WindowStatus.DONE
        window.policy = policy
        window.gpus = gpus
        window.capacity_ns = result.capacity_ns
        window.attributed_ns = result.attributed_ns
        window.idle_ns = result.idle_ns
        window.requests = len(shares)
        window.computed_at = timezone.now()
        window.save()
        hour_mark_dirty(hour=window.start)  # its device-seconds changed
    return WindowOutcome(
        window_id=window.pk,
        requests=len(shares),
        attributed_ns=result.attributed_ns,
        idle_ns=result.idle_ns,
        capacity_ns=result.capacity_ns,
        still_pending=still_pending,
    )


def _copy_shares(shares: pd.DataFrame) -> None:
    if shares.empty:
        return
    csv = shares.to_csv(index=False, header=False, columns=list(SHARE_COLUMNS)).encode()
    columns = ", ".join(SHARE_COLUMNS)
    with connection.cursor() as cursor, connection.wrap_database_errors, cursor.cursor.copy(
        f"COPY metering_attributionshare ({columns}) FROM STDIN WITH (FORMAT csv)"
    ) as copy:
        copy.write(csv)


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

    def __str__(self) -> str:
        return (
            f"window {self.window_id} (replica {self.replica_id}, {self.start:%Y-%m-%d %H:%M}): "
            f"capacity {self.capacity_ns} != attributed {self.attributed_ns} + idle "
            f"{self.idle_ns}, or shares sum {self.shares_ns}"
        )


def attribution_conservation_check(*, since: datetime | None = None) -> list[ConservationBreak]:
    """Attributed windows where attributed + idle != capacity, or the stored
    shares do not add up to the attributed total. Expected: none."""
    since = since or timezone.now() - timedelta(days=35)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT w.id, w.replica_id, w.start, w.capacity_ns, w.attributed_ns, w.idle_ns,
                   coalesce(sum(s.device_ns), 0) AS shares_ns
            FROM metering_attributionwindow w
            LEFT JOIN metering_attributionshare s ON s.window_id = w.id
            WHERE w.status = 'done' AND w.start >= %s
            GROUP BY w.id
            HAVING w.attributed_ns + w.idle_ns <> w.capacity_ns
                OR coalesce(sum(s.device_ns), 0) <> w.attributed_ns
            """,
            [since],
        )
        breaks = [ConservationBreak(*row) for row in cursor.fetchall()]
    for found in breaks:
        logger.error("conservation break: %s", found)
    return breaks
