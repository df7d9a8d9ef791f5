"""An invoice for a billing period that has not ended is finalized only
when asked to "finalize early" with a reason, recorded on the invoice
(who, when, why) and shown on its page; otherwise it is refused with a 409
naming the period's end, leaving the draft a draft and no number taken.
The same rule through the invoice page, the API, the run form, the runs
API and `manage.py invoice --as-of`. A draft's amount due is its total
and its dates say when it will be issued and due."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import IntegrityError, InternalError, transaction
from django.utils import timezone

from billing import tasks
from billing.invoicing.invoices import invoice_draft_build
from billing.invoicing.runs import invoice_run_create, invoice_run_execute
from billing.models import CreditApplication, CreditGrant, Invoice, InvoiceRun, Issuer
from tests.conftest import client_for_user
from tests.factories import make_finance_user

INVOICES = "/api/v1/invoices"


def _month_start(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


@pytest.fixture
def running(world):
    """This month (not ended) for Alpha (USD) and Bravo, priced, used,
    and drafted; Alpha has prepaid credit that finalizing would spend."""
    start = _month_start(timezone.now())
    end = _month_start(start + timedelta(days=32))
    world.price(since=start - timedelta(days=62))
    for tenant, tokens in ((world.a, 1_000_000), (world.b, 2_000_000)):
        world.tokens(tenant, hour=start, completion=tokens)  # $4.00 and $8.00
    CreditGrant.objects.create(tenant=world.a, amount=1, granted_at=start - timedelta(days=1))
    drafts = {}
    for tenant in (world.a, world.b):
        drafts[tenant.slug], _ = invoice_draft_build(
            tenant=tenant, period_start=start, period_end=end
        )
    return {"start": start, "end": end, **drafts}


def _next_number() -> int:
    return Issuer.objects.get(is_default=True).next_invoice_number


def _still_drafts(*drafts) -> bool:
    return all(
        (i.status, i.number, i.sequence, i.finalized_early_reason) == ("draft", "", None, "")
        for i in Invoice.objects.filter(pk__in=[d.pk for d in drafts])
    )


def _ends(end: datetime) -> str:
    return f"it ends {end:%Y-%m-%d %H:%M} UTC"


def test_the_page_refuses_to_finalize_a_running_period_and_finalizes_early_with_a_reason(
    client, world, running
):
    alpha, bravo = running[world.a.slug], running[world.b.slug]
    finance = make_finance_user(username="fiona")
    client.force_login(finance)
    before = _next_number()

    page = client.get(f"/invoices/{alpha.pk}/").content.decode()
    assert (
        'data-testid="finalize-early-form"' in page and 'data-testid="action-finalized"' not in page
    )
    assert f"The period ends {running['end']:%Y-%m-%d %H:%M} UTC." in page

    refused = client.post(f"/invoices/{alpha.pk}/action", {"action": "finalized"})
    assert refused.status_code == 409
    assert _ends(running["end"]) in refused.content.decode()
    no_reason = client.post(
        f"/invoices/{alpha.pk}/action",
        {"action": "finalized", "finalize_early": "1", "reason": "   "},
    )
    assert no_reason.status_code == 400
    assert "reason: finalizing early needs a reason" in no_reason.content.decode()
    # Nothing numbered, no credit spent, still drafts.
    assert _next_number() == before and _still_drafts(alpha, bravo)
    assert not CreditApplication.objects.exists()

    done = client.post(
        f"/invoices/{alpha.pk}/action",
        {"action": "finalized", "finalize_early": "1", "reason": "contract ends on the 23rd"},
    )

    assert done.status_code == 302
    alpha.refresh_from_db()
    assert alpha.status == "finalized" and alpha.number == f"INV-{before:06d}"
    assert (alpha.finalized_early_by, alpha.finalized_early_reason) == (
        "fiona",
        "contract ends on the 23rd",
    )
    assert alpha.total_minor == 300  # $4.00 less the $1.00 prepaid credit
    assert _still_drafts(bravo) and _next_number() == before + 1
    for url in (f"/invoices/{alpha.pk}/", f"/invoices/{alpha.pk}/?download=1"):
        shown = client.get(url).content.decode()
        assert 'data-testid="finalized-early"' in shown
        assert f"{alpha.finalized_at:%Y-%m-%d %H:%M} UTC before the billing period ended" in shown
        assert "by fiona: contract ends on the 23rd" in shown
    # Recorded for good: the database refuses to change it.
    with pytest.raises((IntegrityError, InternalError), match="finalized"), transaction.atomic():
        Invoice.objects.filter(pk=alpha.pk).update(finalized_early_reason="")
    # The tenant sees it on its invoice too; another tenant does not see it at all.
    from tests.factories import make_member

    client.force_login(make_member(world.a).user)
    assert (
        "by fiona: contract ends on the 23rd"
        in client.get(f"/invoices/{alpha.pk}/").content.decode()
    )
    client.force_login(make_member(world.b).user)
    assert client.get(f"/invoices/{alpha.pk}/").status_code == 404


def test_the_api_refuses_with_409_names_the_reason_field_and_finalizes_early(world, running):
    alpha, bravo = running[world.a.slug], running[world.b.slug]
    finance = client_for_user(make_finance_user(username="felix"))
    url = f"{INVOICES}/{alpha.pk}/status"
    before = _next_number()

    refused = finance.post(url, {"status": "finalized"}, format="json")
    assert refused.status_code == 409
    error = refused.json()["error"]
    assert error["code"] == "period_not_ended" and _ends(running["end"]) in error["message"]
    missing = finance.post(url, {"status": "finalized", "finalize_early": True}, format="json")
    assert missing.status_code == 400 and missing.json()["error"]["field"] == "reason"
    blank = finance.post(
        url, {"status": "finalized", "finalize_early": True, "reason": " "}, format="json"
    )
    assert blank.status_code == 400 and blank.json()["error"]["field"] == "reason"
    wrong = finance.post(
        url, {"status": "void", "finalize_early": True, "reason": "x"}, format="json"
    )
    assert wrong.status_code == 400 and wrong.json()["error"]["field"] == "finalize_early"
    assert _next_number() == before and _still_drafts(alpha, bravo)

    done = finance.post(
        url,
        {"status": "finalized", "finalize_early": True, "reason": "tenant leaves"},
        format="json",
    )

    assert done.status_code == 200
    body = done.json()
    assert body["status"] == "finalized" and body["number"] == f"INV-{before:06d}"
    assert (body["finalized_early_by"], body["finalized_early_reason"]) == (
        "felix",
        "tenant leaves",
    )
    assert _still_drafts(bravo)


def test_a_period_that_has_ended_finalizes_as_usual_and_records_nothing(world, running):
    """Last month has ended: no reason needed, and one given is not recorded."""
    last_start = _month_start(running["start"] - timedelta(days=1))
    world.tokens(world.a, hour=last_start, completion=1_000_000)
    draft, _ = invoice_draft_build(
        tenant=world.a, period_start=last_start, period_end=running["start"]
    )
    finance = client_for_user(make_finance_user())

    done = finance.post(
        f"{INVOICES}/{draft.pk}/status",
        {"status": "finalized", "finalize_early": True, "reason": "not needed"},
        format="json",
    ).json()

    assert done["status"] == "finalized" and done["finalized_early_reason"] == ""
    assert _still_drafts(running[world.b.slug])


def test_a_drafts_amount_due_is_its_total_and_its_dates_say_when_it_is_issued(
    client, world, running, settings
):
    settings.BILLING = {**settings.BILLING, "NET_DAYS": 14}
    alpha = running[world.a.slug]
    client.force_login(make_finance_user())

    page = client.get(f"/invoices/{alpha.pk}/").content.decode()

    total = page.split('data-testid="invoice-total">')[1].split("<")[0]
    due = page.split('data-testid="invoice-due">')[1].split("<")[0]
    assert total == due == "4.00 USD"
    dates = page.split('data-testid="invoice-dates">')[1].split("</div>\n</div>")[0]
    expected_due = running["end"] + timedelta(days=14)
    assert "Draft: not issued yet; issued when finalized" in dates
    assert f"Expected issue {running['end']:%Y-%m-%d}, when the period ends" in dates
    assert f"due 14 days after issue ({expected_due:%Y-%m-%d} if issued then)" in dates
    listed = client_for_user(make_finance_user()).get(f"{INVOICES}/{alpha.pk}").json()
    assert listed["amount_due_minor"] == listed["total_minor"] == 400
    rows = client.get("/invoices/").content.decode()
    assert rows.count("4.00 USD") == 2  # total and amount due of Alpha's draft


def test_the_command_refuses_a_future_as_of_unless_finalizing_early(world, running, capsys):
    after_end = f"{running['end'] + timedelta(days=1):%Y-%m-%d}"
    before = _next_number()

    with pytest.raises(CommandError) as refused:
        call_command("invoice", "--as-of", after_end)
    assert _ends(running["end"]) in str(refused.value)
    assert '--finalize-early --reason "..."' in str(refused.value)
    with pytest.raises(CommandError, match="--reason: finalizing early needs a reason"):
        call_command("invoice", "--as-of", after_end, "--finalize-early")
    with pytest.raises(CommandError, match="cannot go with --draft"):
        call_command(
            "invoice", "--as-of", after_end, "--draft", "--finalize-early", "--reason", "x"
        )
    with pytest.raises(CommandError, match=r"--as-of: .* which has not begun"):
        call_command("invoice", "--as-of", "2099-01-01", "--draft")
    assert not InvoiceRun.objects.exists()
    assert _next_number() == before and _still_drafts(running[world.a.slug], running[world.b.slug])

    call_command("invoice", "--as-of", after_end, "--draft")  # drafts so far: allowed
    assert _still_drafts(*Invoice.objects.all()) and Invoice.objects.count() == 2

    call_command(
        "invoice", "--as-of", after_end, "--finalize-early", "--reason", "closing the books early"
    )

    out = capsys.readouterr().out
    assert "2 finalized, 0 drafts" in out
    invoices = Invoice.objects.filter(period_start=running["start"]).order_by("sequence")
    assert [i.sequence for i in invoices] == [before, before + 1]
    assert {i.finalized_early_reason for i in invoices} == {"closing the books early"}
    assert all(i.finalized_early_by.endswith("(manage.py invoice)") for i in invoices)
    run = InvoiceRun.objects.get(finalize=True)
    assert run.finalize_early_reason == "closing the books early"


def test_the_run_form_and_the_runs_api_share_the_rule(
    world, running, client, monkeypatch, django_capture_on_commit_callbacks
):
    queued: list[int] = []
    monkeypatch.setattr(tasks.invoice_run_task, "delay", queued.append)
    finance = make_finance_user(username="frank")
    client.force_login(finance)
    api = client_for_user(finance)
    after_end = running["end"] + timedelta(days=1)
    before = _next_number()

    page = client.post("/invoices/runs", {"as_of": f"{after_end:%Y-%m-%d}"})
    assert page.status_code == 409 and _ends(running["end"]) in page.content.decode()
    page = client.post(
        "/invoices/runs", {"as_of": f"{after_end:%Y-%m-%d}", "finalize_early": "on", "reason": ""}
    )
    assert page.status_code == 400
    assert 'data-testid="run-error">reason: finalizing early needs a reason' in (
        page.content.decode()
    )
    refused = api.post("/api/v1/invoice-runs", {"as_of": after_end.isoformat()}, format="json")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "period_not_ended"
    no_reason = api.post(
        "/api/v1/invoice-runs",
        {"as_of": after_end.isoformat(), "finalize_early": True},
        format="json",
    )
    assert no_reason.status_code == 400 and no_reason.json()["error"]["field"] == "reason"
    drafts_early = api.post(
        "/api/v1/invoice-runs",
        {"as_of": after_end.isoformat(), "finalize": False, "finalize_early": True, "reason": "x"},
        format="json",
    )
    assert drafts_early.status_code == 400
    assert drafts_early.json()["error"]["field"] == "finalize_early"
    assert not InvoiceRun.objects.exists() and queued == []

    with django_capture_on_commit_callbacks(execute=True):
        page = client.post(
            "/invoices/runs",
            {"as_of": f"{after_end:%Y-%m-%d}", "finalize_early": "on", "reason": "audit"},
        )
    assert page.status_code == 302
    (run,) = InvoiceRun.objects.all()
    assert (run.finalize_early_reason, run.finalize_early_by, queued) == (
        "audit",
        "frank",
        [run.pk],
    )
    tasks.invoice_run_task(run.pk)  # what the worker does with it
    finalized = Invoice.objects.filter(period_start=running["start"], status="finalized")
    assert finalized.count() == 2 and _next_number() == before + 2
    assert {(i.finalized_early_by, i.finalized_early_reason) for i in finalized} == {
        ("frank", "audit")
    }
    assert "early</span>" in client.get("/invoices/").content.decode()


def test_a_run_that_would_finalize_a_running_period_fails_it_and_takes_no_number(world, running):
    """Past the checks at creation (the demo's current-period run, asked to
    finalize): every tenant of that period fails with the period's end."""
    before = _next_number()
    run = invoice_run_create(as_of=timezone.now())

    run = invoice_run_execute(run_id=run.pk, current_period=True)

    assert run.status == "failed" and len(run.failures) == 2
    assert all(_ends(running["end"]) in f["error"] for f in run.failures)
    assert _next_number() == before
    assert _still_drafts(running[world.a.slug], running[world.b.slug])
