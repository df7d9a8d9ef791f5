"""SLO figures, the one bulk read of the raw ledger: a percentile needs
every request, so they are computed in SQL over the ledger (by its tenant
and time index)."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import connection

# A request failed for a platform cause: a 5xx (503: no replica could take
# it), or a 429 from the platform's own queue: no replica slot within the
# queue timeout, or the queue full (codes queue_timeout and queue_full at
# the start of its error, or the openings of the messages the gateway
# records for them, gateway/queueing.py). A tenant's own limits
# and budgets (a 429 naming the limit, even after waiting for it; a 402),
# bad requests (other 4xx) and clients that went away (499) are not.
# (starts_with: said alike by PostgreSQL and DuckDB, which runs this text
# over the scaled path's store: metering.log.reads.)
SLO_PLATFORM_FAILURE_SQL = (
    "(e.http_status >= 500 OR (e.http_status = 429 AND "
    "(starts_with(e.error, 'queue_timeout:') OR starts_with(e.error, 'queue_full:'))))"
)
# What availability counts: every request but those refused for the
# tenant's own cause (a 4xx other than the platform queue's 429; a client
# that went away, 499, counts as served).
SLO_COUNTED_SQL = f"(e.http_status < 400 OR e.http_status = 499 OR {SLO_PLATFORM_FAILURE_SQL})"
# Per completed request, in ms. TTFT: what the client waited, from the
# gateway receiving the request to the first token (gateway queue, vLLM
# queue and prefill); without first_token_at (another serving tier's
# report), vLLM's queue time plus its time to first token. Inter-token
# latency: the time from the first token to the end over the gaps between
# tokens, (ended_at - first_token_at) / (completion_tokens - 1), or the
# engine's generation time over them without first_token_at (not an
# inference time reported whole, with no TTFT: that holds the prefill too);
# only requests with two tokens or more have a gap.
# Seconds between two timestamps, exact: PostgreSQL's numeric epoch of an
# interval. The raw-event store's engine (DuckDB, metering.log.rollups)
# says the same with its own functions; both give exact decimals.
PG_SECONDS = "extract(epoch FROM {end} - {start})"


def slo_ttft_ms_sql(seconds: str = PG_SECONDS) -> str:
    """A request's time to first token (ms, float8): the gateway's window
    where it saw the first token, else the engine's queue and TTFT."""
    waited = seconds.format(end="e.first_token_at", start="e.received_at")
    return (
        f"CASE WHEN e.status = 'ok' THEN coalesce({waited} * 1000, "
        "coalesce(e.queue_ms, 0) + e.ttft_ms)::float8 END"
    )


def slo_itl_ms_sql(seconds: str = PG_SECONDS) -> str:
    """A request's mean inter-token latency (ms, float8)."""
    decoding = seconds.format(end="e.ended_at", start="e.first_token_at")
    return (
        f"CASE WHEN e.status = 'ok' AND e.completion_tokens >= 2 THEN (coalesce("
        f"{decoding} * 1000, CASE WHEN e.ttft_ms IS NOT NULL THEN e.generation_ms END)"
        " / (e.completion_tokens - 1))::float8 END"
    )


SLO_TTFT_MS_SQL = slo_ttft_ms_sql()
SLO_ITL_MS_SQL = slo_itl_ms_sql()
SLO_GROUPS = {"tenant": "e.tenant_id", "tier": "t.tier"}


SLO_COLUMNS = ["key", "day", "requests", "failed", "timed", "ttft_p95_ms", "itl_p95_ms"]


def slo_sql(
    *,
    group: str,
    by_day: bool,
    only: str = "",
    seconds: str = PG_SECONDS,
    events: str = "metering_usageevent",
    placeholder: str = "%s",
) -> str:
    """The SLO figures' query over `events` (the ledger, or the store's
    events as DuckDB reads them), received in [start, end) (two
    parameters); `only`: a further condition on `e`."""
    day = "CAST(e.received_at AT TIME ZONE 'UTC' AS date)" if by_day else "CAST(NULL AS date)"
    p = placeholder
    # Only this module's constants are formatted in; values are parameters.
    return f"""
        WITH r AS (
            SELECT {SLO_GROUPS[group]} AS key, {day} AS day,
                   {SLO_COUNTED_SQL} AS counted, {SLO_PLATFORM_FAILURE_SQL} AS failed,
                   {slo_ttft_ms_sql(seconds)} AS ttft_ms, {slo_itl_ms_sql(seconds)} AS itl_ms
            FROM {events} e JOIN tenants_tenant t ON t.id = e.tenant_id
            WHERE e.received_at >= {p} AND e.received_at < {p} {only}
              -- A disaggregated request counts once: by its decode (or by a
              -- prefill that failed, which ended it).
              AND NOT (e.phase = 'prefill' AND e.status = 'ok')
        )
        SELECT key, day,
               count(*) FILTER (WHERE counted) AS requests,
               count(*) FILTER (WHERE failed) AS failed,
               count(ttft_ms) AS timed,
               round(CAST(percentile_cont(0.95) WITHIN GROUP (ORDER BY ttft_ms) AS numeric), 3),
               round(CAST(percentile_cont(0.95) WITHIN GROUP (ORDER BY itl_ms) AS numeric), 3)
        FROM r GROUP BY key, day ORDER BY key, day
    """  # noqa: S608


def slo_figures(
    *,
    start: datetime,
    end: datetime,
    tenant_ids: list[int] | None,
    by_day: bool,
    group: str = "tenant",
) -> list[dict]:
    """SLO figures from the ledger over [start, end), per tenant (`group`
    "tenant": key = tenant id) or per tenant tier ("tier": key = tier), and
    per UTC day when `by_day` (else day None): requests counted for
    availability, how many of them failed for a platform cause, how many
    completed with a time to first token, and the 95th percentiles
    (percentile_cont, interpolated) of TTFT and inter-token latency in ms,
    rounded to the microsecond (None without a sample). `tenant_ids` None:
    every tenant (finance staff code paths only); a tenant's read passes
    its own id alone."""
    if settings.USAGE_LOG["URL"]:  # the scaled path: the raw-event store
        from metering.log.reads import store_slo_figures

        return store_slo_figures(
            start=start, end=end, tenant_ids=tenant_ids, by_day=by_day, group=group
        )
    only = "AND e.tenant_id = ANY(%s)" if tenant_ids is not None else ""
    sql = slo_sql(group=group, by_day=by_day, only=only)
    params: list = [start, end]
    if tenant_ids is not None:
        params.append(list(tenant_ids))
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [dict(zip(SLO_COLUMNS, row, strict=True)) for row in cursor.fetchall()]
