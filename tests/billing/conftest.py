"""A small costed fleet with round numbers: an owned GPU costs exactly $1
an hour to depreciate (capex 8,760 over 12 months of 2026), draws 100 W
idle and 400 W busy; rates are whatever each test books."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest

from billing.costs.rates import cost_rate_create
from billing.costs.runs import allocation_run_create, allocation_run_execute
from billing.invoicing.invoices import invoice_draft_build, invoice_finalize
from billing.models import AllocationRun, ModelPrice, PriceBook
from metering.models import UsageRollup
from serving.models import Gpu, GpuSku, Node, Pool, Replica, Reservation, ServedModel
from tenants.models import Tenant
from tests.factories import make_tenant

H0 = datetime(2026, 10, 5, 12, tzinfo=UTC)
OCT = datetime(2026, 10, 1, tzinfo=UTC)
NOV = datetime(2026, 11, 1, tzinfo=UTC)


@dataclass
class World:
    sku: GpuSku
    node: Node
    model: ServedModel
    a: Tenant
    b: Tenant

    def pool(self, name: str, kind: str = "shared", owner=None, policy="spread") -> Pool:
        return Pool.objects.create(name=name, kind=kind, owner=owner, idle_cost_policy=policy)

    def gpu(self, serial: str, *, in_service=date(2026, 1, 1), months=12, capex="8760", **kw):
        if "lease_rate_per_hour" in kw:
            return Gpu.objects.create(
                serial=serial, sku=self.sku, node=self.node, in_service_date=in_service, **kw
            )
        return Gpu.objects.create(
            serial=serial,
            sku=self.sku,
            node=self.node,
            in_service_date=in_service,
            capex=Decimal(capex),
            useful_life_months=months,
            **kw,
        )

    def replica(self, name: str, pool: Pool, gpus: list[Gpu]) -> Replica:
        replica = Replica.objects.create(
            name=name, base_url=f"http://127.0.0.1/{name}", model=self.model, pool=pool
        )
        replica.gpus.set(gpus)
        return replica

    def use(self, tenant: Tenant, replica: Replica, seconds, *, hour=H0, model=None, completion=0):
        UsageRollup.objects.create(
            hour=hour,
            tenant=tenant,
            served_model=model or self.model,
            pool=replica.pool,
            replica=replica,
            device_seconds=Decimal(str(seconds)),
            completion_tokens=completion,
            requests_ok=1,
        )

    def reserve(self, tenant: Tenant, pool: Pool, gpus: int, start=H0 - timedelta(days=1)):
        return Reservation.objects.create(
            tenant=tenant, pool=pool, gpu_count=gpus, start=start, end=start + timedelta(days=30)
        )

    def rate(self, component: str, amount: str, basis: str, **kw):
        kw.setdefault("effective_from", datetime(2026, 1, 1, tzinfo=UTC))
        return cost_rate_create(component=component, basis=basis, amount=Decimal(amount), **kw)

    def price(
        self, *, version=1, since=OCT, until=None, tier="", currency="USD", **prices
    ) -> ModelPrice:
        """A price book version pricing the world's model ($1 / $0.25 / $4
        per million input / cached / output tokens unless told; the same
        figures in another `currency` make the book "list-eur", say)."""
        book = PriceBook.objects.create(
            name="list" if currency == "USD" else f"list-{currency.lower()}",
            version=version,
            tier=tier,
            currency=currency,
            effective_from=since,
            effective_to=until,
            reservation_per_gpu_hour=prices.pop("reservation", 0),
            dedicated_per_gpu_month=prices.pop("dedicated", 0),
        )
        values = {
            "input_per_mtok": Decimal("1"),
            "cached_input_per_mtok": Decimal("0.25"),
            "output_per_mtok": Decimal("4"),
        } | prices
        return ModelPrice.objects.create(book=book, served_model=self.model, **values)

    def tokens(self, tenant, *, hour, prompt=0, cached=0, completion=0, seconds=0):
        """An hour of token usage (on a pool of its own, so hours never clash)."""
        pool = self.pool(f"p-{hour:%m%d%H}-{tenant.pk}-{UsageRollup.objects.count()}")
        UsageRollup.objects.create(
            hour=hour,
            tenant=tenant,
            served_model=self.model,
            pool=pool,
            prompt_tokens=prompt,
            cached_tokens=cached,
            completion_tokens=completion,
            device_seconds=Decimal(seconds),
            requests_ok=1,
        )

    def allocate(self, start=H0, end=None, scenario=None) -> AllocationRun:
        run = allocation_run_create(
            start=start, end=end or start + timedelta(hours=1), scenario=scenario
        )
        return allocation_run_execute(run_id=run.pk)


@pytest.fixture
def world(db) -> World:
    return make_world()


def make_world() -> World:
    return World(
        sku=GpuSku.objects.create(name="T-100", power_idle_watts=100, power_busy_watts=400),
        node=Node.objects.create(name="node-1", site="lab"),
        model=ServedModel.objects.create(name="tiny"),
        a=make_tenant(name="Alpha"),
        b=make_tenant(name="Bravo"),
    )


@pytest.fixture
def stripe_fake(settings):
    """The fake Stripe server, with the settings that point our Stripe
    module at it (a 1 s client timeout, so injected timeouts are quick)."""
    from tests.stripe_fake import API_KEY, WEBHOOK_SECRET, FakeStripe

    fake = FakeStripe().start()
    settings.STRIPE_API_KEY = API_KEY
    settings.STRIPE_API_BASE = fake.url
    settings.STRIPE_WEBHOOK_SECRET = WEBHOOK_SECRET
    settings.STRIPE_TIMEOUT_SECONDS = 1.0
    yield fake
    fake.stop()


@pytest.fixture
def issued(world):
    """Alpha's and Bravo's October invoices, finalized; Alpha's November draft."""
    world.price()
    for tenant in (world.a, world.b):
        world.tokens(tenant, hour=OCT + timedelta(hours=1), completion=1_000_000)
    out = {}
    for tenant in (world.a, world.b):
        draft, _ = invoice_draft_build(tenant=tenant, period_start=OCT, period_end=NOV)
        out[tenant.slug] = invoice_finalize(invoice_id=draft.pk)
    world.tokens(world.a, hour=NOV + timedelta(hours=1), completion=1_000_000)
    out["draft"], _ = invoice_draft_build(
        tenant=world.a, period_start=NOV, period_end=NOV + timedelta(days=30)
    )
    return out


def charges_rate(*, tenant, start, end, warnings=None):
    """The period's charges as an invoice rates them (rating's inputs
    loaded, then rated)."""
    from billing.pricing.rating import charges_compute, rating_inputs

    inputs = rating_inputs(tenants=[tenant], start=start, end=end)[tenant.pk]
    return charges_compute(tenant=tenant, start=start, end=end, inputs=inputs, warnings=warnings)


@pytest.fixture(scope="module")
def validator():
    """The FinOps Foundation's FOCUS validator (tests/focus_validator.py
    installs it)."""
    from tests.focus_validator import focus_validator
    from tests.services import require

    executable = focus_validator()
    require(executable is not None, "focus-validator needs Python 3.12 or later to install")
    return executable
