"""The pages' forms say exactly what the pages said before they were forms:
the first error as "field: message", a filter that is missing or unknown
falls back to the page's default."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.http import QueryDict
from django.utils import timezone

from core.calendar import OUT_OF_RANGE
from dashboard.forms import (
    AllocationRunForm,
    InvoiceActionForm,
    InvoiceFilterForm,
    InvoiceRunForm,
    PeriodFilterForm,
    form_error,
)


def _data(**fields) -> QueryDict:
    data = QueryDict(mutable=True)
    data.update(fields)
    return data


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({}, "first_day: a day as YYYY-MM-DD is needed"),
        (
            {"first_day": " 2026-11-02 ", "last_day": "tomorrow"},
            "last_day: a day as YYYY-MM-DD is needed",
        ),
        (
            {"first_day": "2026-11-02", "last_day": "2026-11-01"},
            "last_day: must be on or after first_day",
        ),
        (
            {"first_day": "2099-01-01", "last_day": "2099-01-02"},
            "first_day: must be before the current hour",
        ),
        (
            {"first_day": "2999-01-01", "last_day": "2999-01-02"},
            f"first_day: {OUT_OF_RANGE}",
        ),
        (
            {"first_day": "2026-11-01", "last_day": "9999-12-31"},
            f"last_day: {OUT_OF_RANGE}",
        ),
    ],
)
def test_a_refused_allocation_form_names_its_first_error(fields, error):
    form = AllocationRunForm(_data(**fields))

    assert not form.is_valid()
    assert form_error(form) == error


def test_an_allocation_form_is_whole_days_cut_at_the_current_hour():
    now_hour = timezone.now().astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    today = now_hour.replace(hour=0)
    form = AllocationRunForm(
        _data(first_day=f"{today - timedelta(days=2):%Y-%m-%d}", last_day=f"{today:%Y-%m-%d}")
    )

    assert form.is_valid()
    assert (form.cleaned_data["start"], form.cleaned_data["end"]) == (
        today - timedelta(days=2),
        now_hour,
    )


def test_an_invoice_run_form_reads_its_day_and_checkboxes():
    empty = InvoiceRunForm(_data())
    assert empty.is_valid()
    assert empty.cleaned_data == {
        "as_of": None,
        "drafts": False,
        "finalize_early": False,
        "reason": "",
    }

    form = InvoiceRunForm(
        _data(as_of="2026-11-02", drafts="on", finalize_early="on", reason=" why ")
    )
    assert form.is_valid()
    assert form.cleaned_data == {
        "as_of": datetime(2026, 11, 2, tzinfo=UTC),
        "drafts": True,
        "finalize_early": True,
        "reason": " why ",
    }
    bad = InvoiceRunForm(_data(as_of="02/11/2026"))
    assert not bad.is_valid() and form_error(bad) == "as_of: a day as YYYY-MM-DD is needed"


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"action": "refund"}, "action: unknown action 'refund'"),
        ({}, "action: unknown action ''"),
        (
            {"action": "credit_note", "amount": " abc"},
            "amount: 'abc' is not a number (plain digits, e.g. 1450.00)",
        ),
        ({"action": "credit_note", "amount": "-1"}, "amount: must not be negative (no minus here)"),
        ({"action": "credit_note", "amount": "0"}, "amount: must be a positive amount"),
        (
            {"action": "credit_note", "amount": "1.234"},
            "amount: EUR has 2 decimal places: 1.234 has 3",
        ),
    ],
)
def test_a_refused_invoice_action_names_its_first_error(fields, error):
    form = InvoiceActionForm(_data(**fields), currency="EUR")

    assert not form.is_valid()
    assert form_error(form) == error


def test_an_invoice_action_form_cleans_a_credit_note_to_minor_units():
    form = InvoiceActionForm(
        _data(action="credit_note", amount="1,001.50", reason="outage"), currency="EUR"
    )

    assert form.is_valid()
    assert (form.cleaned_data["amount"], form.cleaned_data["reason"]) == (100150, "outage")
    status = InvoiceActionForm(_data(action="void", amount="junk"), currency="EUR")
    assert status.is_valid() and status.cleaned_data["amount"] is None


@pytest.mark.parametrize(
    ("query", "days"), [("", 7), ("days=30", 30), ("days=31", 7), ("days=", 7)]
)
def test_a_period_filter_falls_back_to_the_page_default(query, days):
    periods = {"7": 7, "30": 30, "90": 90}

    assert PeriodFilterForm(QueryDict(query), periods=periods, default=7).days_value() == days


@pytest.mark.parametrize(
    ("query", "status"), [("", None), ("status=paid", "paid"), ("status=lost", None)]
)
def test_an_invoice_filter_is_one_status_or_every_invoice(query, status):
    assert InvoiceFilterForm(QueryDict(query)).status_value() == status
