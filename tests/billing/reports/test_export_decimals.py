"""Margin report exports (stored CSV, the API's JSON totals) write
decimals in plain fixed-point: a zero is "0.000000000" and
a revenue of 150 nano-dollars "0.000000150", never "0E-9" or "1.50E-7"."""

from __future__ import annotations

import csv
import io
import re
from datetime import timedelta
from decimal import Decimal

from billing.models import FxRate
from metering.models import UsageRollup
from tests.billing.conftest import H0
from tests.conftest import client_for_user
from tests.factories import make_finance_user

HOUR = timedelta(hours=1)
SCIENTIFIC = re.compile(r"^-?[\d.]+[eE][+-]?\d+$")


def test_margin_report_csv_and_totals_write_zero_and_tiny_amounts_in_fixed_point(
    world, django_capture_on_commit_callbacks, monkeypatch
):
    """One output token at $0.15/M (Alpha, USD) and at EUR 0.15/M (Bravo,
    EUR 1 = USD 1.2): revenues of 150 and 180 nano-dollars; the unabsorbed
    row's revenue is zero."""
    from billing import tasks

    world.b.billing_currency = "EUR"
    world.b.save(update_fields=["billing_currency"])
    FxRate.objects.create(base="EUR", quote="USD", date=H0.date(), rate=Decimal("1.2"))
    world.price(output_per_mtok=Decimal("0.15"))
    world.price(output_per_mtok=Decimal("0.15"), currency="EUR")  # Bravo's book
    pool = world.pool("shared", policy="platform")
    replica = world.replica("r1", pool, [world.gpu("g1")])
    for tenant, seconds in ((world.a, "1800"), (world.b, "0.000001")):
        UsageRollup.objects.create(
            hour=H0,
            tenant=tenant,
            served_model=world.model,
            pool=pool,
            replica=replica,
            device_seconds=Decimal(seconds),
            completion_tokens=1,
            requests_ok=1,
        )
    world.allocate()
    monkeypatch.setattr(tasks.margin_report_task, "delay", lambda pk: tasks.margin_report_task(pk))
    finance = client_for_user(make_finance_user())

    with django_capture_on_commit_callbacks(execute=True):
        queued = finance.post(
            "/api/v1/margin-reports",
            {"start": H0.isoformat(), "end": (H0 + HOUR).isoformat()},
            format="json",
        )
    report = finance.get(f"/api/v1/margin-reports/{queued.json()['id']}").json()
    assert report["status"] == "done", report["error"]
    download = finance.get(report["csv_url"])

    assert report["totals"]["revenue"] == "0.000000330"
    assert report["totals"]["revenue_by_currency"] == {
        "EUR": "0.000000150",
        "USD": "0.000000150",
    }
    rows = list(csv.DictReader(io.StringIO(download.content.decode())))
    tenants = {r["tenant"]: r for r in rows if r["level"] == "tenant"}
    assert tenants[world.a.slug]["revenue"] == "0.000000150"
    assert tenants[world.b.slug]["revenue"] == "0.000000180"
    assert tenants[world.b.slug]["revenue_in_EUR"] == "0.000000150"
    assert tenants[world.b.slug]["device_seconds"] == "0.000001"  # 1e-06 as a float
    assert tenants["(unabsorbed)"]["revenue"] == "0.000000000"
    cells = [cell for row in rows for cell in row.values()]
    assert not [c for c in cells if SCIENTIFIC.match(c or "")]
