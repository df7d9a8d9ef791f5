"""The reconciliation page while nothing has been compared yet: it says
so, and why (no scrape of the replicas' counters, or the first window not
closed, or windows without two scrapes), never that every window agrees;
once a closed hour is compared and agrees, it says that."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from metering.choices import EventSource
from metering.ledger import usage_record_batch
from metering.reconciliation import reconciliation_run_hour
from serving.models import ReplicaMetricSample
from tests.factories import make_finance_user, make_member


def _scrape(replica, at: datetime, prompt: int, generation: int) -> None:
    ReplicaMetricSample.objects.create(
        replica=replica,
        scraped_at=at,
        up=True,
        prompt_tokens_total=prompt,
        generation_tokens_total=generation,
    )


def _serving(ledger, at: datetime) -> None:
    """A request of each tenant on the first replica, received at `at`."""
    usage_record_batch(
        events=[
            ledger.event("a-1", at=at, received_at=at),
            ledger.event("b-1", tenant=ledger.b, at=at, received_at=at),
        ],
        source=EventSource.API,
    )


@pytest.fixture
def finance(client, db):
    client.force_login(make_finance_user())
    return client


def _totals(page) -> str:
    html = page.content.decode()
    return html.split('data-testid="reconciliation-totals"')[1].split("</section>")[0]


def test_while_serving_in_the_first_hour_it_says_nothing_was_compared_yet(finance, ledger):
    now = datetime.now(UTC)
    hour = now.replace(minute=0, second=0, microsecond=0)
    elapsed = now - hour
    _scrape(ledger.replica, hour + elapsed / 3, 0, 0)
    _serving(ledger, hour + elapsed / 2)
    _scrape(ledger.replica, hour + elapsed * 2 / 3, 40, 20)

    page = finance.get("/reconciliation/")

    assert page.status_code == 200
    html = page.content.decode()
    assert "agrees" not in html and "Totals over" not in html
    said = _totals(page)
    assert "Nothing compared yet" in said and 'data-testid="nothing-compared"' in said
    assert "scraped 2 times" in said
    assert f"the first window, {hour:%H:%M} to {hour + timedelta(hours=1):%H:%M} UTC" in said
    assert "is not closed yet" in said
    assert "Nothing compared yet (see above)." in html  # the windows that disagree: none compared
    client = finance
    client.force_login(make_member(ledger.a).user)
    assert client.get("/reconciliation/").status_code == 403


def test_without_a_scrape_of_the_counters_it_says_so(finance, ledger):
    _serving(ledger, datetime.now(UTC) - timedelta(hours=3))
    # The hourly job ran over hours with no scrape: windows that compared nothing.
    reconciliation_run_hour(hour=datetime.now(UTC) - timedelta(hours=2))

    page = finance.get("/reconciliation/")

    assert page.context["totals"]["windows"] == 0
    said = _totals(page)
    assert "Nothing compared yet" in said
    assert "No scrape of the replicas' token counters in this range" in said
    assert "agrees" not in page.content.decode()


def test_a_closed_hour_with_fewer_than_two_scrapes_compared_nothing(finance, ledger):
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)
    _scrape(ledger.replica, hour + timedelta(minutes=59), 40, 20)
    reconciliation_run_hour(hour=hour)

    said = _totals(finance.get("/reconciliation/"))

    assert "Nothing compared yet" in said and f"the hour from {hour:%H:%M} has closed" in said
    assert "2 windows were computed with fewer than two scrapes to compare" in said


def test_a_closed_hour_compared_that_agrees_says_so(finance, ledger):
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    _scrape(ledger.replica, hour + timedelta(minutes=10), 100, 50)
    _serving(ledger, hour + timedelta(minutes=20))  # 20 prompt and 10 generated tokens each
    _scrape(ledger.replica, hour + timedelta(minutes=50), 140, 70)
    reconciliation_run_hour(hour=hour)  # the other replica, never scraped: compared nothing

    page = finance.get("/reconciliation/")

    assert page.context["totals"]["windows"] == 1
    said = _totals(page)
    assert "Totals over 1 window compared" in said and "Nothing compared" not in said
    assert 'data-testid="prompt-gap">0<' in said
    assert "Every window compared agrees." in page.content.decode()
