"""SLOs are judged under the policy in force when the requests were served
(issue 59, item 3): a tenant moved from the shared tier (TTFT p95 target
200 ms) to the dedicated one (150 ms) mid-October has each stretch judged
against its own tier's target, the credit a percent of that stretch's
usage only. Before, the whole month was judged against dedicated's target:
the days served on shared earned a credit shared never promised. The move
is made on the tenant's admin page."""

from __future__ import annotations

from datetime import UTC, datetime

from billing.choices import LineKind
from billing.invoicing.invoices import invoice_draft_build
from tests.billing.conftest import NOV, OCT
from tests.billing.pricing.test_tier_history import _move
from tests.slo import slo_day, slo_policy

TTFT_ONLY = (("ttft_p95", None, "5"),)


def test_each_stretch_of_a_tier_move_is_judged_against_its_own_tiers_target(
    world, ledger, admin_client
):
    world.price(since=datetime(2026, 8, 1, tzinfo=UTC))  # one list for every tier
    slo_policy(name="shared", tier="shared", availability=None, ttft="200", rules=TTFT_ONLY)
    slo_policy(name="dedicated", tier="dedicated", availability=None, ttft="150", rules=TTFT_ONLY)
    alpha = ledger.a
    for day in (5, 25):  # TTFT p95 190.5 ms each day (tests/slo.py), 4.00 USD of output
        at = datetime(2026, 10, day, 12, tzinfo=UTC)
        slo_day(ledger, alpha, at, prefix=f"oct{day}")
        world.tokens(alpha, hour=at, completion=1_000_000)
    _move(admin_client, alpha, "dedicated", at=datetime(2026, 10, 15, tzinfo=UTC))
    alpha.refresh_from_db()  # as the invoice run reads it: dedicated now

    invoice, why = invoice_draft_build(tenant=alpha, period_start=OCT, period_end=NOV)
    assert invoice is not None, why
    credits = [
        (line.description, line.amount_minor)
        for line in invoice.lines.filter(kind=LineKind.SLA_CREDIT)
    ]
    # 190.5 ms met shared's 200 ms before the move; after it, missed
    # dedicated's 150 ms: 5% of the 4.00 USD served on dedicated (was 5%
    # of all 8.00, the whole month judged as dedicated).
    assert credits == [
        (
            "SLA credit: TTFT p95 190.5 ms > 150 ms target: 5% of usage charges (4.00 USD) "
            "(2026-10-15 00:00 to 2026-11-01 00:00 UTC)",
            -20,
        )
    ]
    assert invoice.total_minor == 800 - 20
