"""Money on the cost, fleet and tenant pages always carries its currency,
in the currency's minor units, rounded one way: half to even, as invoice
lines are (issue 40, item 10). The tenant page's spend so far is rounded
line by line, as the invoice estimate beside it is, so the two agree;
where the gateway's exact figures are shown, the page says why they may
differ from the invoice's."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal
from html import unescape

import pytest
from django.test import Client
from django.utils import timezone

from billing.models import ModelPrice, PriceBook
from core.calendar import months_add
from metering.models import UsageRollup
from serving.models import Pool
from tenants.models import TenantPolicy
from tests.factories import make_finance_user, make_member, make_tenant


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _text(html: str) -> str:
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split())


@pytest.fixture
def booked_in_euros(world, settings):
    """One pool-hour booked in EUR (the reporting currency), three hours
    ago: the GPU costs exactly 0.125 EUR an hour, Alpha used a quarter of
    it, the idle rest stays unallocated: 0.03125 carried, 0.09375 not."""
    settings.REPORTING_CURRENCY = "EUR"
    hour = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
    in_service = (hour - timedelta(days=40)).date()
    life_hours = (months_add(in_service, 12) - in_service).days * 24
    gpu = world.gpu(
        "g-eur", in_service=in_service, capex=str(Decimal("0.125") * life_hours), currency="EUR"
    )
    pool = world.pool("shared-eu", policy="platform")
    world.use(world.a, world.replica("r1", pool, [gpu]), 900, hour=hour)
    world.allocate(start=hour)
    world.gpu("g-lease", lease_rate_per_hour=Decimal("2.3456"), currency="USD")  # after: spare
    return life_hours


def test_the_cost_page_gives_every_amount_its_currency_rounded_half_even(world, booked_in_euros):
    html = _client(make_finance_user()).get("/costs/").content.decode()

    tiers = _text(html.split('data-testid="cost-by-tier"')[1].split("</section>")[0])
    # 0.125 to even is 0.12 (not 0.13), 0.09375 is 0.09.
    assert "0.12 EUR (0.09 EUR unallocated)" in tiers
    pools = _text(html.split('data-testid="utilization"')[1].split("</section>")[0])
    assert "25.0% busy · cost 0.12 EUR" in pools


def test_the_fleet_page_gives_cost_and_gpu_prices_their_currency(world, booked_in_euros):
    html = _client(make_finance_user()).get("/fleet/").content.decode()

    pools = html.split('data-testid="pools"')[1].split("</table>")[0]
    row = re.search(r"<tr><td>shared-eu</td>.*?</tr>", pools, re.S).group(0)
    cells = [_text(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
    assert cells[-2:] == ["0.12 EUR", "0.09 EUR"]  # cost, last day; unallocated
    gpus = _text(html.split('data-testid="gpus"')[1].split("</table>")[0])
    capex = f"{Decimal('0.125') * booked_in_euros:,.2f}"
    assert f"{capex} EUR / 12 months / 0.00 EUR" in gpus
    assert "2.3456 USD" in gpus  # a lease rate is a price: exact, with its currency


@pytest.fixture
def tenants(world):
    """Alpha (USD) and Euro Co (EUR, its own book) each used, this hour,
    1,125,000 input tokens at 1 per million and 531,250 output tokens at
    4: lines of exactly 1.125 and 2.125, invoiced (half to even) as 1.12
    and 2.12: 3.24, where the exact 3.25 rounded once would say 3.25."""
    hour = timezone.now().replace(minute=0, second=0, microsecond=0)
    euro = make_tenant(name="Euro Co", tier="reserved", billing_currency="EUR")
    shared = Pool.objects.create(name="shared", kind="shared")
    for tenant, tier, currency in ((world.a, "", "USD"), (euro, "reserved", "EUR")):
        book = PriceBook.objects.create(
            name=f"list {currency}",
            tier=tier,
            currency=currency,
            effective_from=hour - timedelta(days=400),
        )
        ModelPrice.objects.create(
            book=book,
            served_model=world.model,
            input_per_mtok=Decimal(1),
            cached_input_per_mtok=Decimal(1),
            output_per_mtok=Decimal(4),
        )
        UsageRollup.objects.create(
            hour=hour,
            tenant=tenant,
            served_model=world.model,
            pool=shared,
            prompt_tokens=1_125_000,
            completion_tokens=531_250,
            device_seconds=Decimal("12.5"),
            requests_ok=1,
        )
        TenantPolicy.objects.filter(tenant=tenant).update(monthly_budget=Decimal("100"))
    return {"USD": world.a, "EUR": euro}


def _section(html: str, testid: str) -> str:
    return _text(html.split(f'data-testid="{testid}">')[1].split("</p>")[0])


@pytest.mark.parametrize("currency", ["USD", "EUR"])
def test_the_tenant_page_shows_spend_as_its_invoice_estimate_rounds_it(world, tenants, currency):
    tenant = tenants[currency]
    other = tenants["EUR" if currency == "USD" else "USD"]
    member = _client(make_member(tenant).user)
    finance = _client(make_finance_user())

    for html in (
        member.get("/usage/").content.decode(),
        finance.get(f"/finance/tenants/{tenant.slug}/").content.decode(),
    ):
        spend = _section(html, "spend")
        assert spend == f"3.24 {currency} of a 100.00 {currency} budget"
        assert _section(html, "estimate").startswith(f"3.24 {currency} for ")
        assert other.billing_currency not in spend  # nothing of the other tenant's


@pytest.mark.parametrize("currency", ["USD", "EUR"])
def test_what_the_gateway_holds_carries_its_currency_in_minor_units(world, tenants, currency):
    html = _client(make_member(tenants[currency]).user).get("/usage/").content.decode()

    standing = html.split('data-testid="standing"')[1].split("</section>")[0]
    row = standing.split('data-testid="standing-budget"')[1].split("</tr>")[0]
    cells = [_text(c) for c in re.findall(r'<td class="num"[^>]*>(.*?)</td>', row, re.S)]
    # Limit, spent (exact 3.25, rounded once), reserved (not visible: none shared), left.
    assert cells[0] == f"100.00 {currency}"
    assert cells[1] == f"3.25 {currency}"
    assert cells[3] == f"96.75 {currency}"
    assert "an invoice rounds each of its lines" in _text(standing)
