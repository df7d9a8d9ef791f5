"""Usage exports (JSON, CSV) write device-seconds in plain
fixed-point: a zero is "0.000000000" and 150 nano-seconds "0.000000150",
never "0E-9" or "1.50E-7"."""

from __future__ import annotations

import csv
import io
import re
from decimal import Decimal

from metering.models import UsageRollup
from tests.conftest import client_for_user
from tests.factories import make_finance_user
from tests.metering.conftest import T0

RANGE = {"start": "2026-10-05", "end": "2026-10-06"}
SCIENTIFIC = re.compile(r"\d[eE][+-]?\d")


def _rollups(ledger):
    """Alpha (USD): tokens, no device time. Bravo (EUR): 150 ns of it."""
    ledger.b.billing_currency = "EUR"
    ledger.b.save(update_fields=["billing_currency"])
    for tenant, seconds, tokens in ((ledger.a, "0", 10), (ledger.b, "0.00000015", 0)):
        UsageRollup.objects.create(
            hour=T0,
            tenant=tenant,
            served_model=ledger.model,
            pool=ledger.pool,
            replica=ledger.replica,
            completion_tokens=tokens,
            device_seconds=Decimal(seconds),
            requests_ok=1,
        )


def _csv(response) -> tuple[str, list[dict]]:
    body = b"".join(response.streaming_content).decode()
    return body, list(csv.DictReader(io.StringIO(body)))


def test_usage_json_and_csv_write_zero_and_tiny_device_seconds_in_fixed_point(ledger):
    _rollups(ledger)
    finance = client_for_user(make_finance_user())

    rows = finance.get("/api/v1/usage", RANGE).json()["results"]
    body, csv_rows = _csv(finance.get("/api/v1/usage", {**RANGE, "format": "csv"}))

    expected = {ledger.a.slug: "0.000000000", ledger.b.slug: "0.000000150"}
    assert {r["tenant"]: r["device_seconds"] for r in rows} == expected
    assert {r["tenant"]: r["device_seconds"] for r in csv_rows} == expected
    assert not SCIENTIFIC.search(body), body
