"""The finance pages' forms keep the API's rules (issue 40, item 3): the
page and the API call the same service, which refuses bad input naming
the field before anything is written, so both say the same thing. An
invoice run as of year 1 is not queued (its worker failed in the
calendar maths and the run said "running" for ever), an allocation of
year 1 is not booked, a credit note's reason of 100,000 characters is a
400, not a 500 from the database."""

from __future__ import annotations

import html
from datetime import UTC, date, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from billing import tasks
from billing.models import AllocationRun, CreditNote, Invoice, InvoiceRun, Issuer
from tenants.models import Tenant
from tests.billing.conftest import NOV, OCT
from tests.conftest import client_for_user
from tests.factories import make_finance_user

OUT_OF_RANGE = "must be between 2000-01-01 and 2100-01-01 (UTC), inclusive"


@pytest.fixture
def sent(monkeypatch) -> list[int]:
    """Runs that would reach the broker."""
    queued: list[int] = []
    monkeypatch.setattr(tasks.allocation_run_task, "delay", queued.append)
    monkeypatch.setattr(tasks.invoice_run_task, "delay", queued.append)
    return queued


@pytest.fixture
def finance(db, client):
    """The finance user's page client and API client."""
    user = make_finance_user()
    client.force_login(user)
    return client, client_for_user(user)


def _page_error(response, testid: str) -> str:
    page = response.content.decode()
    return html.unescape(page.split(f'data-testid="{testid}">')[1].split("<")[0])


def _api_error(response) -> tuple[str, str]:
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    return error["field"], error["message"]


@pytest.mark.parametrize("as_of", ["0001-01-01", "1999-12-31", "9999-12-31"])
def test_an_invoice_run_outside_the_supported_span_is_refused_by_page_and_api(
    world, finance, sent, as_of
):
    page, api = finance

    response = page.post("/invoices/runs", {"as_of": as_of, "drafts": "on"})

    assert response.status_code == 400
    assert _page_error(response, "run-error") == f"as_of: {OUT_OF_RANGE}"
    assert f'value="{as_of}"' in response.content.decode()  # what was typed is kept
    refused = api.post(
        "/api/v1/invoice-runs", {"as_of": f"{as_of}T00:00:00Z", "finalize": False}, format="json"
    )
    assert _api_error(refused) == ("as_of", f"as_of: {OUT_OF_RANGE}")
    assert not InvoiceRun.objects.exists() and sent == []


def test_the_invoice_command_says_what_the_page_says(world):
    with pytest.raises(CommandError) as refused:
        call_command("invoice", "--as-of", "0001-01-01", "--draft", stdout=StringIO())

    assert str(refused.value) == f"--as-of: {OUT_OF_RANGE}"
    assert not InvoiceRun.objects.exists()


def test_the_edges_of_the_span_are_an_invoice_run(world, finance, sent):
    page, _ = finance

    response = page.post("/invoices/runs", {"as_of": "2000-01-01", "drafts": "on"})

    assert response.status_code == 302
    assert InvoiceRun.objects.get().as_of == datetime(2000, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("first_day", ["0001-01-01", "1999-12-31"])
def test_an_allocation_of_year_one_is_refused_by_page_and_api(world, finance, sent, first_day):
    page, api = finance
    last_day = (date.fromisoformat(first_day) + timedelta(days=1)).isoformat()

    response = page.post("/costs/runs", {"first_day": first_day, "last_day": last_day})

    assert response.status_code == 400
    assert _page_error(response, "run-error") == f"first_day: {OUT_OF_RANGE}"
    assert f'value="{first_day}"' in response.content.decode()
    refused = api.post(
        "/api/v1/costs/runs",
        {"start": f"{first_day}T00:00:00Z", "end": f"{last_day}T00:00:00Z"},
        format="json",
    )
    assert _api_error(refused) == ("start", f"start: {OUT_OF_RANGE}")
    assert not AllocationRun.objects.exists() and sent == []


def test_an_allocation_to_the_last_supported_day_is_cut_at_the_current_hour(
    world, finance, sent, django_capture_on_commit_callbacks
):
    """The form used to add a day to the last day: 9999-12-31 overflowed (500).
    The last day the API takes is the last one the form takes, and the
    run stops at the current hour, as the API's do."""
    page, _ = finance
    now_hour = timezone.now().astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    yesterday = now_hour.replace(hour=0) - timedelta(days=1)

    with django_capture_on_commit_callbacks(execute=True):
        response = page.post(
            "/costs/runs", {"first_day": f"{yesterday:%Y-%m-%d}", "last_day": "2100-01-01"}
        )

    assert response.status_code == 302
    run = AllocationRun.objects.get()
    assert (run.start, run.end) == (yesterday, now_hour) and sent == [run.pk]


def test_an_allocation_to_the_last_day_python_has_is_refused_as_the_api_refuses_it(
    world, finance, sent
):
    page, _ = finance
    response = page.post("/costs/runs", {"first_day": "2026-11-01", "last_day": "9999-12-31"})

    assert response.status_code == 400
    assert _page_error(response, "run-error") == f"last_day: {OUT_OF_RANGE}"
    assert not AllocationRun.objects.exists() and sent == []


@pytest.fixture
def two_currencies(world):
    """Alpha's October invoice in USD and Bravo's in EUR, finalized."""
    from billing.invoicing.invoices import invoice_draft_build, invoice_finalize

    Tenant.objects.filter(pk=world.b.pk).update(billing_currency="EUR")
    world.b.refresh_from_db()
    world.price()
    world.price(currency="EUR")  # Bravo's book
    issued = {}
    for tenant in (world.a, world.b):
        world.tokens(tenant, hour=OCT + timedelta(hours=1), completion=1_000_000)
        draft, _ = invoice_draft_build(tenant=tenant, period_start=OCT, period_end=NOV)
        issued[tenant.billing_currency] = invoice_finalize(invoice_id=draft.pk)
    return issued


@pytest.mark.parametrize("currency", ["USD", "EUR"])
def test_a_credit_note_with_a_100k_character_reason_is_a_400_from_page_and_api(
    finance, two_currencies, currency
):
    page, api = finance
    invoice = two_currencies[currency]
    assert invoice.currency == currency
    numbering = list(Issuer.objects.values_list("pk", "next_credit_note_number"))
    reason = "r" * 100_000

    response = page.post(
        f"/invoices/{invoice.pk}/action",
        {"action": "credit_note", "amount": "1", "reason": reason},
    )

    assert response.status_code == 400
    assert _page_error(response, "action-error") == "reason: at most 300 characters"
    refused = api.post(
        f"/api/v1/invoices/{invoice.pk}/credit-notes",
        {"amount_minor": 100, "reason": reason},
        format="json",
    )
    assert _api_error(refused) == ("reason", "reason: at most 300 characters")
    assert not CreditNote.objects.exists()
    assert list(Issuer.objects.values_list("pk", "next_credit_note_number")) == numbering
    assert set(Invoice.objects.values_list("status", flat=True)) == {"finalized"}

    # 300 characters is a credit note, on that invoice only.
    response = page.post(
        f"/invoices/{invoice.pk}/action",
        {"action": "credit_note", "amount": "1", "reason": "r" * 300},
    )
    assert response.status_code == 302
    (note,) = CreditNote.objects.all()
    assert (note.invoice_id, note.amount_minor, len(note.reason)) == (invoice.pk, 100, 300)
