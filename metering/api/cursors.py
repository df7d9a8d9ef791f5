"""The usage export's pages: keyset pagination over usage_summary, its
cursor an opaque url-safe token of the last key a page held."""

from __future__ import annotations

import base64
import json
from datetime import datetime

from metering.selectors.usage import UsageQuery, usage_summary
from tenants.models import Tenant


def usage_page(
    *, tenant: Tenant | None, query: UsageQuery, limit: int, cursor: str | None
) -> tuple[list[dict], str | None]:
    """One page of usage_summary and the cursor of the next (None at the end)."""
    after = cursor_decode(cursor) if cursor else None
    rows = list(usage_summary(tenant=tenant, query=query, after=after)[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    next_cursor = None
    if more:
        last = rows[-1]
        next_cursor = cursor_encode((last["period"], last["tenant_id"], last["model_key"]))
    return rows, next_cursor


def cursor_encode(key: tuple) -> str:
    period, tenant_id, model_key = key
    raw = json.dumps([period.isoformat(), tenant_id, model_key]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def cursor_decode(cursor: str) -> tuple:
    """Raises ValueError for a cursor we did not make."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        period, tenant_id, model_key = json.loads(base64.urlsafe_b64decode(padded))
        return datetime.fromisoformat(period), int(tenant_id), int(model_key)
    except (ValueError, TypeError) as exc:
        raise ValueError("not a cursor from this API") from exc
