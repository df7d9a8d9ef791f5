"""The SLO pages: finance's /finance/slo/ (every tenant, breaches marked,
a chart of daily compliance), a tenant's own figures on /usage/ (never
another tenant's), and the waiver button on a draft invoice's page."""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing.invoicing.invoices import invoice_draft_build, invoice_finalize
from billing.models import SlaCreditAdjustment
from metering.choices import EventSource
from metering.ledger import usage_record_batch
from tests.billing.conftest import NOV, OCT
from tests.factories import make_finance_user
from tests.ledger import T0
from tests.slo import slo_day, slo_policy


@pytest.fixture
def recent(ledger, world_a, world_b):
    """Three minutes ago: Alpha's day of tests/slo.py (40 s of requests);
    Bravo's one request, a 503."""
    at = timezone.now().replace(microsecond=0) - timedelta(minutes=3)
    slo_policy()
    slo_day(ledger, world_a.tenant, at)
    usage_record_batch(
        events=[
            ledger.event("b-503", tenant=world_b.tenant, at=at, status="error",
                         http_status=503, first_token_at=None),
        ],
        source=EventSource.API,
    )  # fmt: skip
    return at


def test_finance_sees_every_tenant_with_breaches_marked(client, recent, world_a, world_b):
    client.force_login(make_finance_user())
    response = client.get("/finance/slo/", {"days": "7"})
    assert response.status_code == 200
    rows = {row.tenant.slug: row for row in response.context["tenants"]}
    assert set(rows) == {world_a.tenant.slug, world_b.tenant.slug}
    assert rows[world_a.tenant.slug].period.availability == Decimal("87.5000")
    assert rows[world_b.tenant.slug].period.availability == Decimal("0.0000")
    html = response.content.decode()
    assert html.count('data-breached="1"') == 2 and 'data-breach="ttft_p95"' in html
    (tier,) = response.context["tiers"]
    assert (tier.tier, tier.period.requests, tier.period.failed, tier.breached) == (
        "shared",
        25,
        4,
        2,
    )
    chart = json.loads(html.split('id="slo-chart" type="application/json">')[1].split("<")[0])
    assert [d["label"] for d in chart["datasets"]] == ["shared"]
    assert 0 in chart["datasets"][0]["data"]  # both missed a target that day: 0 %


def test_a_tenant_sees_its_own_figures_only(client, recent, world_a, world_b):
    client.force_login(world_a.viewer.user)
    response = client.get("/usage/")
    assert response.status_code == 200
    slo = response.context["slo"]
    assert slo["policy"].name == "shared default"
    assert (slo["period"].requests, slo["period"].failed) == (24, 3)
    assert slo["period"].availability == Decimal("87.5000")
    assert sum(day.requests for day in slo["days"]) == 24
    html = response.content.decode()
    assert 'data-testid="slo-period"' in html and "87.50%" in html
    assert "0.00%" not in html  # Bravo's availability
    client.force_login(world_b.viewer.user)
    bravo = client.get("/usage/").context["slo"]
    assert (bravo["period"].requests, bravo["period"].failed) == (1, 1)
    # Finance's drill-down into a tenant shows that tenant's.
    client.force_login(make_finance_user())
    drill = client.get(f"/finance/tenants/{world_a.tenant.slug}/").context["slo"]
    assert drill["period"].requests == 24


def test_availability_is_rounded_to_the_nearest_hundredth_and_charted_up_to_100(
    client, ledger, world_a
):
    """47 of 48 requests served: 97.92% (not 97.91%), on the tenant's page
    and finance's; a figure that misses its target never rounds up to it
    (97.9166% < 97.92%). The tenant's chart's percent axis stops at 100."""
    policy = slo_policy()
    at = timezone.now().replace(microsecond=0) - timedelta(minutes=3)
    events = [
        ledger.event(f"r-{n}", tenant=world_a.tenant, at=at + timedelta(seconds=n))
        for n in range(47)
    ]
    events.append(ledger.event("r-503", tenant=world_a.tenant, at=at, status="error",
                               http_status=503, first_token_at=None))  # fmt: skip
    usage_record_batch(events=events, source=EventSource.API)

    client.force_login(world_a.viewer.user)
    html = client.get("/usage/").content.decode()
    period = html.split('data-testid="slo-period"')[1].split("</table>")[0]
    assert "97.92% <span" in period and "97.91%" not in period
    options = html.split('data-testid="slo-chart"')[1].split("</script>")[1]
    assert 'y: { position: "left", max: 100,' in options
    client.force_login(make_finance_user())
    html = client.get("/finance/slo/", {"days": "7"}).content.decode()
    assert "97.92% <span" in html and "97.91%" not in html

    type(policy).objects.filter(pk=policy.pk).update(availability_percent=Decimal("97.92"))
    html = client.get("/finance/slo/", {"days": "7"}).content.decode()
    assert '97.9166% <span class="muted">/ 97.92%</span> ✗' in html


def test_the_waiver_button_on_a_draft(client, world, ledger, world_a):
    slo_policy()
    slo_day(ledger, world_a.tenant, T0)
    world.price()
    world.tokens(world_a.tenant, hour=OCT + timedelta(hours=1), completion=2_500_000)
    draft, _ = invoice_draft_build(tenant=world_a.tenant, period_start=OCT, period_end=NOV)
    url = f"/invoices/{draft.pk}/"
    finance = make_finance_user()
    client.force_login(finance)
    html = client.get(url).content.decode()
    assert 'data-testid="sla-credit-form-availability"' in html
    assert html.count('data-testid="sla-credit"') == 2

    refused = client.post(f"{url}sla-credit", {"metric": "availability", "action": "waive"})
    assert refused.status_code == 400 and "reason" in refused.content.decode()
    done = client.post(
        f"{url}sla-credit",
        {"metric": "availability", "action": "waive", "reason": "announced maintenance"},
    )
    assert done.status_code == 302
    html = client.get(url).content.decode()
    assert html.count('data-testid="sla-credit"') == 1
    assert "announced maintenance" in html and finance.get_username() in html

    client.force_login(world_a.owner.user)
    assert client.post(f"{url}sla-credit", {"metric": "ttft_p95", "action": "waive",
                                            "reason": "x"}).status_code == 403  # fmt: skip
    invoice_finalize(invoice_id=draft.pk)
    client.force_login(finance)
    html = client.get(url).content.decode()
    assert "sla-credit-form" not in html  # finalized: no button
    refused = client.post(
        f"{url}sla-credit", {"metric": "ttft_p95", "action": "waive", "reason": "late"}
    )
    assert refused.status_code == 409
    assert SlaCreditAdjustment.objects.count() == 1
