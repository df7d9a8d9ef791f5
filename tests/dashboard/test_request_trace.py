"""Following one request from the gateway to the margin report: its
device-seconds, its hour, the invoice lines billing it, its share of the
hour's GPU cost and the tenant's margin (finance); a tenant's member sees
its own request without cost or margin, and not another tenant's. The
finance drill-down into a tenant and the reconciliation page."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from billing.choices import ReportKind
from billing.costs.runs import allocation_run_create, allocation_run_execute
from billing.invoicing.invoices import invoice_draft_build, invoice_finalize
from billing.reports.margin_reports import margin_report_build, margin_report_request
from metering.choices import EventSource
from metering.jobs import metering_run
from metering.ledger import usage_record_batch
from metering.models import ReconciliationGap
from serving.models import Gpu
from tests.factories import make_finance_user, make_list_price, make_member
from tests.ledger import T0

OCT, NOV = datetime(2026, 10, 1, tzinfo=UTC), datetime(2026, 11, 1, tzinfo=UTC)


@pytest.fixture
def traced(ledger):
    Gpu.objects.update(in_service_date=OCT.date())  # leased since October
    make_list_price(ledger.model, effective_from=OCT - timedelta(days=31))
    usage_record_batch(
        events=[
            ledger.event("a1", gateway_queue_ms=Decimal("12.5")),
            ledger.event("b1", tenant=ledger.b),
        ],
        source=EventSource.API,
    )
    metering_run(now=T0 + timedelta(hours=3))
    hour = T0.replace(minute=0)
    allocation_run_execute(
        run_id=allocation_run_create(start=hour, end=hour + timedelta(hours=1)).pk
    )
    draft, _ = invoice_draft_build(tenant=ledger.a, period_start=OCT, period_end=NOV)
    invoice = invoice_finalize(invoice_id=draft.pk)
    margin_report_build(
        report_id=margin_report_request(kind=ReportKind.CLOSE, start=OCT, end=NOV).pk
    )
    return invoice


def test_finance_follows_a_request_to_its_cost_and_the_margin_report(client, ledger, traced):
    client.force_login(make_finance_user())

    page = client.get("/requests/a1/")

    assert page.status_code == 200
    c = page.context
    assert c["device_seconds"] == Decimal("0.45")  # shared evenly with b1
    assert c["rollup"].requests_ok == 1 and c["rollup"].tenant_id == ledger.a.pk
    assert c["invoice"] == traced and c["lines"]
    assert all(line.model == ledger.model.name for line in c["lines"])
    # The hour's cost carried by Alpha on this model, and a1's part of it: all of it,
    # since a1 is Alpha's only request in that hour.
    (hour,) = c["cost"].hours
    assert hour.allocated > 0
    assert c["cost"].share == hour.allocated.quantize(Decimal("0.000000001"))
    assert c["margin"]["tenant"] == ledger.a.slug
    html = page.content.decode()
    assert 'data-testid="trace-margin"' in html and traced.number in html
    # The gateway's queue time beside vLLM's own.
    assert "gateway queue 12.500 ms</span> · vLLM queue 100.000 ms" in html
    untimed = client.get("/requests/b1/").content.decode()  # recorded none: not a zero
    assert "gateway queue — ms</span>" in untimed


def test_a_member_sees_its_own_request_without_cost_and_not_anothers(client, ledger, traced):
    client.force_login(make_member(ledger.a).user)

    page = client.get("/requests/a1/")
    assert page.status_code == 200
    assert page.context["invoice"] == traced
    html = page.content.decode()
    assert "trace-cost" not in html and "trace-margin" not in html
    assert "gateway queue 12.500 ms" in html
    assert client.get("/requests/b1/").status_code == 404
    assert client.get("/requests/nope/").status_code == 404


def test_the_usage_page_lists_recent_requests_linking_to_their_trace(client, ledger, traced):
    client.force_login(make_member(ledger.b).user)
    html = client.get("/usage/").content.decode()
    assert 'href="/requests/b1/"' in html and "/requests/a1/" not in html


def test_finance_drills_into_a_tenant(client, ledger, traced):
    finance = make_finance_user()
    client.force_login(finance)

    page = client.get(f"/finance/tenants/{ledger.a.slug}/")

    assert page.status_code == 200
    assert page.context["tenant"] == ledger.a and page.context["drill"]
    assert page.context["margin"]["tenant"] == ledger.a.slug
    html = page.content.decode()
    assert f"&amp;tenant={ledger.a.slug}" in html  # exports of that tenant
    assert 'href="/requests/a1/"' in html and "/requests/b1/" not in html
    assert client.get("/finance/tenants/nobody/").status_code == 404
    client.force_login(make_member(ledger.a).user)
    assert client.get(f"/finance/tenants/{ledger.a.slug}/").status_code == 403


def test_reconciliation_shows_tokens_served_but_not_billed(client, ledger):
    now = datetime.now(UTC).replace(microsecond=0)
    for replica, vllm, metered in ((ledger.replica, 1500, 1000), (ledger.other_replica, 70, 70)):
        ReconciliationGap.objects.create(
            replica=replica,
            start=now - timedelta(hours=2),
            end=now - timedelta(hours=1),
            vllm_prompt_tokens=vllm,
            vllm_generation_tokens=vllm // 2,
            metered_prompt_tokens=metered,
            metered_generation_tokens=metered // 2,
            samples=12,
            computed_at=now,
        )
    client.force_login(make_finance_user())

    page = client.get("/reconciliation/")

    assert page.status_code == 200
    totals = page.context["totals"]
    assert (totals["windows"], totals["prompt_gap"], totals["generation_gap"]) == (2, 500, 250)
    assert [g.replica for g in page.context["gaps"]] == [
        ledger.replica
    ]  # the one that agrees: not listed
    client.force_login(make_member(ledger.a).user)
    assert client.get("/reconciliation/").status_code == 403
