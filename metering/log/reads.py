"""Reads of raw events on the scaled path, from the store (DuckDB in
this process, only the hours asked for opened), answering what the
ledger's reads answer from PostgreSQL, with the same SQL where there is
SQL: the SLO figures SLA credits are judged by, one request's rows (the
request trace), a tenant's latest requests, and the tokens reconciliation
compares with the engines' counters.

Which hours a request is in: a gateway's request id says the hour it was
received (serving.records), so its rows are in that hour's partition or
the next few (the store is by the hour a request ended; none runs past
METERING_MAX_REQUEST_SECONDS). An id that says nothing (another serving
tier's, through the ingestion API) is looked for in the last
USAGE_TRACE_HOURS hours."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
from django.conf import settings

from metering.log.duck import DUCKDB_SECONDS, duck
from metering.log.frames import hours_between
from metering.log.store import RawStore
from metering.log.stream import LogConfig
from metering.models import UsageEvent
from metering.selectors.slo import SLO_COLUMNS, slo_sql
from metering.validation import CLOCK_SKEW, LEDGER_COLUMNS
from serving.records import request_id_hour
from tenants.models import Tenant

UTC_US = pa.timestamp("us", "UTC")


def store_events_received(
    *, start: datetime, end: datetime, tenant_ids: list[int] | None = None
) -> pa.Table:
    """The store's events received in [start, end) (of `tenant_ids` only,
    when given), each (request id, phase) once."""
    config = LogConfig.from_settings()
    where = (pc.field("received_at") >= pa.scalar(start, UTC_US)) & (
        pc.field("received_at") < pa.scalar(end, UTC_US)
    )
    if tenant_ids is not None:
        where &= pc.field("tenant_id").isin([int(t) for t in tenant_ids])
    longest = timedelta(seconds=settings.METERING["MAX_REQUEST_SECONDS"])
    return _store(config).events(hours_between(start, end + longest), where=where)


def _store(config: LogConfig | None = None) -> RawStore:
    config = config or LogConfig.from_settings()
    return RawStore(config.store_url, stream=config.stream)


def _longest() -> timedelta:
    return timedelta(seconds=settings.METERING["MAX_REQUEST_SECONDS"])


def _as_events(table: pa.Table) -> list[UsageEvent]:
    """Store rows as the ledger's model instances (unsaved: read only),
    so the pages and reports that show a request take either path's."""
    names = [*LEDGER_COLUMNS, "ingested_at"]
    return [UsageEvent(**{n: row[n] for n in names}) for row in table.select(names).to_pylist()]


def _recent_hours(now: datetime | None = None) -> list[str]:
    """The last USAGE_TRACE_HOURS hours' partitions, newest first."""
    now = now or datetime.now(UTC)
    span = timedelta(hours=settings.USAGE_LOG["TRACE_HOURS"])
    return list(reversed(hours_between(now - span, now + CLOCK_SKEW)))


def store_request_events(*, request_id: str, tenant_id: int | None) -> list[UsageEvent]:
    """One request's rows (a disaggregated request's two) from the store;
    another tenant's request finds none (`tenant_id` None: finance staff)."""
    hour = request_id_hour(request_id)
    if hour is not None:
        received = datetime.fromtimestamp(hour * 3600, tz=UTC)
        hours = hours_between(received, received + timedelta(hours=1) + _longest())
    else:
        hours = _recent_hours()
    where = pc.field("request_id") == request_id
    if tenant_id is not None:
        where &= pc.field("tenant_id") == int(tenant_id)
    return _as_events(_store().events(hours, where=where))


def store_requests_recent(*, tenant_id: int | None, limit: int) -> list[UsageEvent]:
    """The latest requests (by when they were received) of one tenant, or
    of all: the newest hours' partitions read first, as many as it takes
    (within USAGE_TRACE_HOURS). A disaggregated request once, by its decode
    row (a prefill that failed, alone)."""
    store = _store()
    where = ~((pc.field("phase") == "prefill") & (pc.field("status") == "ok"))
    if tenant_id is not None:
        where &= pc.field("tenant_id") == int(tenant_id)
    found: list[UsageEvent] = []
    for hour in _recent_hours():
        found += _as_events(store.latest([hour], where=where, limit=limit))
        # Every request that ended from this hour on is read, so every one
        # received from it on: enough of those, and no older one can be newer.
        since = datetime.strptime(hour, "%Y-%m-%dT%H").replace(tzinfo=UTC)
        if sum(e.received_at >= since for e in found) >= limit:
            break
    found.sort(key=lambda e: e.received_at, reverse=True)
    return found[:limit]


def store_tokens_ended(
    *, replica_ids: list[int], behind: list[int], after: datetime, through: datetime
) -> dict[str, int]:
    """The tokens of the requests on `replica_ids` that ended in
    (after, through], not refused, as reconciliation counts them: a
    frontend's workers (`behind`) by their prefill row's prompt and their
    decode row's output (metering.reconciliation's sums from the ledger)."""
    ids = [int(r) for r in replica_ids]
    where = (
        pc.field("replica_id").isin(ids)
        & (pc.field("status") != "rejected")
        & (pc.field("ended_at") > pa.scalar(after, UTC_US))
        & (pc.field("ended_at") <= pa.scalar(through, UTC_US))
    )
    events = _store().events(hours_between(after, through), where=where)
    with duck(events=events) as db:
        prompt, generation = db.execute(
            """
            SELECT
              coalesce(sum(CASE WHEN list_contains($behind, replica_id) AND phase = 'decode'
                           THEN 0 ELSE prompt_tokens END), 0),
              coalesce(sum(CASE WHEN list_contains($behind, replica_id) AND phase = 'prefill'
                           THEN 0 ELSE completion_tokens END), 0)
            FROM events
            """,
            {"behind": [int(r) for r in behind] or [-1]},
        ).fetchone()
    return {"prompt": int(prompt), "generation": int(generation)}


def store_slo_figures(
    *, start: datetime, end: datetime, tenant_ids: list[int] | None, by_day: bool, group: str
) -> list[dict]:
    """metering.selectors.slo.slo_figures over the store."""
    events = store_events_received(start=start, end=end, tenant_ids=tenant_ids)
    found = list(Tenant.objects.values_list("id", "tier"))
    tenants = pa.table(
        {"id": pa.array([i for i, _ in found], pa.int64()), "tier": [t for _, t in found]},
        schema=pa.schema([("id", pa.int64()), ("tier", pa.string())]),
    )
    sql = slo_sql(group=group, by_day=by_day, seconds=DUCKDB_SECONDS, placeholder="?")
    with duck(metering_usageevent=events, tenants_tenant=tenants) as db:
        rows = db.execute(sql, [start, end]).fetchall()
    return [dict(zip(SLO_COLUMNS, row, strict=True)) for row in rows]
