"""History reproduces (issue 59, item 3): a tenant moved from the shared to
the dedicated tier mid-month keeps the hours before the move priced under
shared's book; only the hours after it are dedicated's. The move is made
where an operator makes it, on the tenant's admin page."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import time_machine

from billing.invoicing.invoices import invoice_draft_build
from tenants.models import Tenant, TierChange
from tests.tenants.test_admin_budget import _change

D = Decimal
NOV = datetime(2026, 11, 1, tzinfo=UTC)
DEC = datetime(2026, 12, 1, tzinfo=UTC)
MOVE = datetime(2026, 11, 15, 9, 30, tzinfo=UTC)


def _move(admin_client, tenant: Tenant, tier: str, *, at: datetime) -> None:
    with time_machine.travel(at, tick=False):
        done = _change(admin_client, f"/admin/tenants/tenant/{tenant.pk}/change/", tier=tier)
    assert done.status_code == 302, done.content.decode()[-2000:]


def test_a_mid_month_tier_move_prices_each_hour_under_the_tier_it_was_served_in(
    world, admin_client
):
    """1M output tokens before the move at shared's 4 USD/M, 1M after it at
    dedicated's 6 USD/M: 10.00 USD, not 12.00 (the whole month at dedicated)."""
    world.price(tier="shared", since=NOV - timedelta(days=60))
    world.price(version=2, tier="dedicated", since=NOV - timedelta(days=60), output_per_mtok=D(6))
    world.tokens(world.a, hour=datetime(2026, 11, 10, 12, tzinfo=UTC), completion=1_000_000)
    world.tokens(world.a, hour=datetime(2026, 11, 20, 12, tzinfo=UTC), completion=1_000_000)

    _move(admin_client, world.a, "dedicated", at=MOVE)

    [change] = TierChange.objects.filter(tenant=world.a)
    assert (change.from_tier, change.tier, change.effective_from) == ("shared", "dedicated", MOVE)
    draft, _ = invoice_draft_build(tenant=world.a, period_start=NOV, period_end=DEC)
    lines = sorted((line.description, line.amount_minor) for line in draft.lines.all())
    assert lines == [
        ("tiny: output tokens, dedicated tier", 600),
        ("tiny: output tokens, shared tier", 400),
    ]
    assert draft.subtotal_minor == 1000


def test_a_tenant_that_never_moved_reads_as_before(world):
    """No move, no tier named on its lines, and its tier's book prices all."""
    world.price(tier="shared", since=NOV - timedelta(days=60))
    world.tokens(world.b, hour=datetime(2026, 11, 10, 12, tzinfo=UTC), completion=1_000_000)
    draft, _ = invoice_draft_build(tenant=world.b, period_start=NOV, period_end=DEC)
    assert [(x.description, x.amount_minor) for x in draft.lines.all()] == [
        ("tiny: output tokens", 400)
    ]


def test_moving_back_and_forth_keeps_every_stretch(world, admin_client):
    """shared, then dedicated from the 10th, then shared again from the 20th:
    the middle stretch alone is dedicated's."""
    world.price(tier="shared", since=NOV - timedelta(days=60))
    world.price(version=2, tier="dedicated", since=NOV - timedelta(days=60), output_per_mtok=D(6))
    for day in (5, 15, 25):
        world.tokens(world.a, hour=datetime(2026, 11, day, tzinfo=UTC), completion=1_000_000)
    _move(admin_client, world.a, "dedicated", at=datetime(2026, 11, 10, tzinfo=UTC))
    _move(admin_client, world.a, "shared", at=datetime(2026, 11, 20, tzinfo=UTC))

    draft, _ = invoice_draft_build(tenant=world.a, period_start=NOV, period_end=DEC)
    assert draft.subtotal_minor == 400 + 600 + 400
