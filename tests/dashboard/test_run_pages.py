"""Finance staff start an allocation run from the cost page and an invoice
run from the invoices page: queued to a worker, watched in the page's run
table; bad input is a 400 naming the field with nothing queued; nobody else
may start one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from billing import tasks
from billing.models import AllocationRun, InvoiceRun, PoolHourCost
from tests.factories import make_finance_user, make_member


@pytest.fixture
def sent(monkeypatch) -> dict[str, list[int]]:
    """What would reach the broker, per task (the worker is tested elsewhere)."""
    queued: dict[str, list[int]] = {"allocation": [], "invoice": []}
    monkeypatch.setattr(tasks.allocation_run_task, "delay", queued["allocation"].append)
    monkeypatch.setattr(tasks.invoice_run_task, "delay", queued["invoice"].append)
    return queued


def test_finance_allocates_days_from_the_cost_page(
    world, client, sent, django_capture_on_commit_callbacks
):
    now_hour = timezone.now().astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    yesterday = (now_hour - timedelta(days=1)).replace(hour=0)
    pool = world.pool("shared-eu", policy="platform")
    replica = world.replica("r1", pool, [world.gpu("g1")])
    world.use(world.a, replica, 900, hour=yesterday + timedelta(hours=5))
    client.force_login(make_finance_user())

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            "/costs/runs",
            {"first_day": f"{yesterday:%Y-%m-%d}", "last_day": f"{now_hour:%Y-%m-%d}"},
        )

    assert response.status_code == 302 and response["Location"] == "/costs/"
    (run,) = AllocationRun.objects.all()
    # Whole days from yesterday 00:00, cut at the current hour (nothing later to book).
    assert (run.start, run.end, run.status) == (yesterday, now_hour, "queued")
    assert sent["allocation"] == [run.pk]
    tasks.allocation_run_task(run.pk)  # what the worker does with it
    page = client.get("/costs/").content.decode()
    assert f"Allocation run {run.pk} queued" in page
    assert f"{run.hours_total}/{run.hours_total} h" in page
    assert PoolHourCost.objects.filter(hour=yesterday + timedelta(hours=5), pool=pool).exists()


@pytest.mark.parametrize(
    ("form", "field"),
    [
        ({"first_day": "", "last_day": "2026-11-01"}, "first_day"),
        ({"first_day": "2026-11-02", "last_day": "11/01/2026"}, "last_day"),
        ({"first_day": "2026-11-02", "last_day": "2026-11-01"}, "last_day"),
        ({"first_day": "2999-01-01", "last_day": "2999-01-02"}, "first_day"),
        ({"first_day": "2024-01-01", "last_day": "2026-11-01"}, "last_day"),  # over 366 days
    ],
)
def test_a_bad_allocation_form_names_the_field_and_queues_nothing(world, client, sent, form, field):
    client.force_login(make_finance_user())

    response = client.post("/costs/runs", form)

    assert response.status_code == 400
    error = response.content.decode().split('data-testid="run-error">')[1].split("<")[0]
    assert error.startswith(f"{field}: ")
    assert not AllocationRun.objects.exists() and sent["allocation"] == []
    assert f'value="{form["first_day"]}"' in response.content.decode()  # the form kept


def test_finance_runs_invoices_from_the_invoices_page(
    world, client, sent, django_capture_on_commit_callbacks
):
    client.force_login(make_finance_user())

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post("/invoices/runs", {"as_of": "2026-11-02", "drafts": "on"})

    assert response.status_code == 302 and response["Location"] == "/invoices/"
    (run,) = InvoiceRun.objects.all()
    assert run.as_of == datetime(2026, 11, 2, tzinfo=UTC) and run.finalize is False
    assert sent["invoice"] == [run.pk]
    tasks.invoice_run_task(run.pk)
    page = client.get("/invoices/").content.decode()
    assert f"Invoice run {run.pk} queued (drafts" in page and f"#{run.pk} (drafts)" in page

    for as_of in ("yesterday", "2099-01-01"):  # the second picks a period not begun
        bad = client.post("/invoices/runs", {"as_of": as_of})
        assert bad.status_code == 400
        assert 'data-testid="run-error">as_of: ' in bad.content.decode()
    assert InvoiceRun.objects.count() == 1 and sent["invoice"] == [run.pk]


@pytest.mark.parametrize("path", ["/costs/runs", "/invoices/runs"])
def test_only_finance_starts_runs(world, client, sent, path):
    client.force_login(make_member(world.a, role="owner").user)

    response = client.post(path, {"first_day": "2026-11-01", "last_day": "2026-11-01"})

    assert response.status_code == 403
    assert not AllocationRun.objects.exists() and not InvoiceRun.objects.exists()
    client.logout()
    assert client.post(path, {}).status_code == 302  # to the sign-in page
    assert client.get(path).status_code in (302, 405)
