"""A write that committed never answers 500 because its follow-up could
not be queued: with the broker down, marking an invoice uncollectible
answers 200 and leaves its Stripe sync pending, and the Stripe sweep
queues it once the broker is back; the invoice run finalizes what it
finalized and says so; a run the broker refused is marked failed with the
reason instead of staying queued."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from kombu import Connection

from billing.choices import InvoiceStatus, RunStatus, StripeSync
from billing.invoicing import invoices
from billing.invoicing.invoices import invoice_draft_build, invoice_finalize
from billing.models import AllocationRun, Invoice, InvoiceRun
from billing.tasks import invoice_stripe_sync_task, stripe_sweep_task
from config.celery_app import app
from tests.billing.conftest import NOV, OCT
from tests.celery_worker import broker_at
from tests.conftest import client_for_user
from tests.factories import make_finance_user, make_tenant

UNREACHABLE = "redis://127.0.0.1:1/0"  # nothing listens on port 1
pytestmark = pytest.mark.django_db(transaction=True)  # on_commit runs as in production


@pytest.fixture
def memory_broker():
    with broker_at("memory://"):
        yield


def _queued(task_name: str) -> list[list]:
    """The args of every `task_name` message waiting in the in-memory
    broker's default queue (taken off it)."""
    found = []
    with Connection("memory://") as conn:
        queue = conn.SimpleQueue(app.conf.task_default_queue)
        while True:
            try:
                message = queue.get(block=False)
            except queue.Empty:
                break
            if message.headers["task"] == task_name:
                found.append(message.payload[0])
            message.ack()
        queue.close()
    return found


def test_marking_uncollectible_with_the_broker_down_answers_200_and_the_sweep_queues_it(
    memory_broker, stripe_fake, world, issued
):
    alpha, bravo = issued[world.a.slug], issued[world.b.slug]
    _queued(invoice_stripe_sync_task.name)  # the syncs the finalizing queued
    client = client_for_user(make_finance_user())

    with broker_at(UNREACHABLE):
        response = client.post(
            f"/api/v1/invoices/{alpha.pk}/status", {"status": "uncollectible"}, format="json"
        )

    assert response.status_code == 200, response.content
    assert response.json()["status"] == "uncollectible"
    assert response.json()["stripe_sync"] == "pending"
    alpha.refresh_from_db()
    assert (alpha.status, alpha.stripe_sync) == (InvoiceStatus.UNCOLLECTIBLE, StripeSync.PENDING)
    assert alpha.stripe_error.startswith("not queued: OperationalError")
    assert Invoice.objects.get(pk=bravo.pk).status == InvoiceStatus.FINALIZED

    # The broker is back: the sweep queues what waits (both, as neither
    # reached Stripe yet), and the queued sync brings Stripe in step.
    assert stripe_sweep_task.apply().get() == 2
    assert sorted(_queued(invoice_stripe_sync_task.name)) == sorted([[alpha.pk], [bravo.pk]])
    assert invoice_stripe_sync_task.apply(args=[alpha.pk]).get() == StripeSync.SYNCED
    alpha.refresh_from_db()
    assert (alpha.stripe_sync, alpha.stripe_status, alpha.stripe_error) == (
        StripeSync.SYNCED,
        "uncollectible",
        "",
    )
    assert stripe_fake.invoices[alpha.stripe_invoice_id]["status"] == "uncollectible"


def test_the_invoice_run_with_the_broker_down_reports_what_it_did(
    memory_broker, stripe_fake, world, monkeypatch
):
    """Four tenants: two invoiced, one already invoiced (skipped), one
    whose rating fails; plus one with nothing to bill."""
    world.price()
    carol, dave, erin = (
        make_tenant(name="Carol"),
        make_tenant(name="Dave"),
        make_tenant(name="Erin"),
    )
    for tenant in (world.a, world.b, carol, dave):
        world.tokens(tenant, hour=OCT + timedelta(hours=2), completion=1_000_000)
    draft, _ = invoice_draft_build(tenant=carol, period_start=OCT, period_end=NOV)
    invoice_finalize(invoice_id=draft.pk)  # Carol is invoiced already
    real = invoices.draft_compose

    def rating_fails_for_dave(*, tenant, **kwargs):
        if tenant.pk == dave.pk:
            raise ValueError("no price for Dave's model")
        return real(tenant=tenant, **kwargs)

    monkeypatch.setattr(invoices, "draft_compose", rating_fails_for_dave)  # the one path
    out, err = StringIO(), StringIO()

    with broker_at(UNREACHABLE):
        call_command("invoice", "--as-of", "2026-11-02", stdout=out, stderr=err)

    finalized = Invoice.objects.filter(period_start=OCT, period_end=NOV).exclude(tenant=carol)
    assert sorted(finalized.values_list("tenant__slug", "status", "stripe_sync")) == [
        (world.a.slug, "finalized", "pending"),
        (world.b.slug, "finalized", "pending"),
    ]
    assert "5 tenants: 2 finalized, 0 drafts, 2 skipped" in out.getvalue()
    assert "1 failed" in out.getvalue()
    assert f"failed: {dave.slug}: ValueError: no price for Dave's model" in err.getvalue()
    assert not Invoice.objects.filter(tenant__in=[dave, erin]).exists()


def test_a_run_the_broker_refuses_is_marked_failed_not_left_queued(world):
    client = client_for_user(make_finance_user())
    start = OCT + timedelta(days=3)

    with broker_at(UNREACHABLE):
        response = client.post(
            "/api/v1/costs/runs",
            {"start": start.isoformat(), "end": (start + timedelta(days=1)).isoformat()},
            format="json",
        )

    assert response.status_code == 202, response.content
    run = AllocationRun.objects.get(pk=response.json()["id"])
    assert run.status == RunStatus.FAILED
    assert run.error.startswith("not queued: OperationalError")


def test_a_command_asked_to_queue_says_when_the_broker_refuses(world):
    with broker_at(UNREACHABLE), pytest.raises(CommandError, match="not queued: Operational"):
        call_command("invoice", "--queue", stdout=StringIO())

    (run,) = InvoiceRun.objects.all()
    assert run.status == RunStatus.FAILED
    assert run.failures[0]["error"].startswith("not queued: OperationalError")
