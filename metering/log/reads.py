"""Reads of raw events on the scaled path, from the store (DuckDB in
this process, only the hours asked for opened), answering what the
ledger's reads answer from PostgreSQL, with the same SQL where there is
SQL: the SLO figures SLA credits are judged by."""

from __future__ import annotations

from datetime import datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
from django.conf import settings

from metering.log.duck import DUCKDB_SECONDS, duck
from metering.log.frames import hours_between
from metering.log.store import RawStore
from metering.log.stream import LogConfig
from metering.selectors.slo import SLO_COLUMNS, slo_sql
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
    store = RawStore(config.store_url, stream=config.stream)
    return store.events(hours_between(start, end + longest), where=where)


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
