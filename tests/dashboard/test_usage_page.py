"""The tenant portal's usage page: its own usage in the chart data and
totals, spend against its budget, its invoices, exports; nobody else's."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from metering.choices import EventSource
from metering.ledger import usage_record_batch
from metering.models import UsageRollup
from serving.models import Pool, ServedModel
from tenants.models import TenantPolicy
from tests.factories import make_finance_user, make_member
from tests.ledger import T0


@pytest.fixture
def used(world_a, world_b):
    model = ServedModel.objects.create(name="tiny-llama")
    pool = Pool.objects.create(name="shared", kind="shared")
    hour = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)
    for tenant, tokens in ((world_a.tenant, 1000), (world_b.tenant, 777_777)):
        UsageRollup.objects.create(
            hour=hour,
            tenant=tenant,
            served_model=model,
            pool=pool,
            prompt_tokens=tokens,
            completion_tokens=tokens,
            device_seconds=Decimal("12.5"),
            requests_ok=3,
        )
    return hour


def test_a_member_sees_their_usage_chart_and_spend_only(client, world_a, world_b, used):
    TenantPolicy.objects.filter(tenant=world_a.tenant).update(monthly_budget=Decimal("100"))
    client.force_login(world_a.viewer.user)

    response = client.get("/usage/")

    assert response.status_code == 200
    html = response.content.decode()
    chart = response.context["chart"]
    assert [d["label"] for d in chart["datasets"]] == ["tiny-llama"]
    assert sum(chart["datasets"][0]["data"]) == 2000  # Alpha's 1,000 + 1,000, not Bravo's
    assert 'id="usage-chart"' in html and "chart-4.6.1.umd.min.js" in html
    assert json.loads(html.split('id="usage-chart" type="application/json">')[1].split("<")[0])
    assert response.context["totals"]["requests"] == 3
    assert "777" not in html
    assert "<dd>1,000 (0 cached)</dd>" in html  # grouped thousands, as people read them
    assert "of a 100.00 USD budget" in html
    assert 'data-testid="export-csv"' in html


def test_the_page_warns_over_the_soft_threshold_and_shows_a_block(client, world_a, used):
    TenantPolicy.objects.filter(tenant=world_a.tenant).update(
        budget_blocked_at=timezone.now(), budget_block_message="monthly budget of 1 USD reached"
    )
    client.force_login(world_a.owner.user)
    html = client.get("/usage/").content.decode()
    assert 'data-testid="budget-blocked"' in html and "monthly budget of 1 USD reached" in html


def test_finance_without_a_tenant_and_anonymous_callers_are_refused(client, world_a):
    assert client.get("/usage/").status_code == 302  # to the login page
    client.force_login(make_finance_user())
    assert client.get("/usage/").status_code == 403


def test_a_prepaid_member_sees_the_balance_and_what_requests_in_flight_hold(
    client, world_a, settings
):
    """What the gateway holds the tenant to, read from the counters the
    gateways share: credit 5, 1.25 spent, 0.5 reserved by a request in flight."""
    import asyncio
    import uuid

    from billing.models import CreditGrant, Plan, Subscription
    from billing.spend.accounts import Limit, RedisSpend, nanos
    from billing.spend.terms import spend_terms
    from tests.services import redis_url, require

    url = redis_url()
    require(url is not None, "no Redis for the gateways' shared counters")
    settings.REDIS_URL = url
    settings.GATEWAY = {**settings.GATEWAY, "REDIS_PREFIX": f"test-{uuid.uuid4().hex}"}
    tenant = world_a.tenant
    start = timezone.now() - timedelta(days=2)
    Subscription.objects.create(
        tenant=tenant, plan=Plan.objects.create(name="Prepaid", prepaid=True), start=start
    )
    CreditGrant.objects.create(tenant=tenant, amount=Decimal("5"), granted_at=start)
    (account,) = spend_terms(tenant=tenant, now=timezone.now()).accounts

    async def gateway_holds():
        store = RedisSpend(url, prefix=settings.GATEWAY["REDIS_PREFIX"])
        limit = [Limit(account.key, account.limit, Decimal("1.25"))]
        await store.reserve(limit, "in-flight", nanos(Decimal("0.5")), ttl=60)
        await store.close()

    asyncio.run(gateway_holds())
    client.force_login(world_a.viewer.user)

    html = client.get("/usage/").content.decode()

    row = html.split('data-testid="standing-prepaid"')[1].split("</tr>")[0]
    assert "Prepaid balance" in row
    cells = [c.split(">", 1)[1].split("<")[0] for c in row.split('<td class="num"')[1:]]
    assert cells[:3] == ["5.00 USD", "1.25 USD", "0.50 USD"]
    assert "3.25 USD" in row  # left: 5 - 1.25 - 0.5
    assert "Figures are the gateway's own" in html


def test_recent_requests_show_the_part_of_their_ids_that_differs(client, ledger):
    """The gateway's ids of one process share all but their last digits
    ("gw-", the process's half, a count): the rows show those digits, and
    the whole id on hover; another tenant's request is not there."""
    shared = "gw-3f9a1c0e5b7d2a64" + "0" * 15
    usage_record_batch(
        events=[
            ledger.event(f"{shared}1"),
            ledger.event(f"{shared}2", at=T0 + timedelta(seconds=1)),
            ledger.event(f"{shared}3", tenant=ledger.b),
        ],
        source=EventSource.API,
    )
    client.force_login(make_member(ledger.a).user)

    html = client.get("/usage/").content.decode()

    table = html.split('data-testid="recent-requests"')[1].split("</table>")[0]
    shown = re.findall(r"<code>([^<]*)</code>", table)
    assert len(shown) == 2 and len(set(shown)) == 2
    assert {s[-2:] for s in shown} == {"01", "02"}
    assert all(s.startswith("gw-3f") for s in shown)
    assert f'title="{shared}1"' in table and f'title="{shared}2"' in table
    assert f"{shared}3" not in html
