"""A draft's page at its month's edges, on a clock moved there: it offers
"finalize early" until its period ends (23:59:59 on the last day) and plain
finalizing from the 1st at 00:00 (this read the machine's day once, and
failed on every 1st of the month: issue 59, item 0)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from billing.invoicing.invoices import invoice_draft_build
from tests.billing.conftest import NOV
from tests.factories import make_finance_user
from tests.metering.test_month_edges import EDGES, NEXT_MONTH


@pytest.mark.parametrize(
    ("instant", "early"),
    [
        (EDGES["the last day at 23:59:59"], True),
        (EDGES["the 1st at 00:00"], False),
    ],
    ids=["before its end", "at its end"],
)
def test_a_drafts_page_offers_finalize_early_only_before_its_period_ends(
    client, world, pinned_clock, instant, early
):
    world.price()
    world.tokens(world.a, hour=NOV + timedelta(hours=1), completion=1_000_000)
    draft, _ = invoice_draft_build(tenant=world.a, period_start=NOV, period_end=NEXT_MONTH)
    pinned_clock.move_to(instant, tick=False)
    client.force_login(make_finance_user())

    page = client.get(f"/invoices/{draft.pk}/").content.decode()

    assert ('data-testid="action-finalize-early"' in page) is early
    assert ('data-testid="action-finalized"' in page) is not early
