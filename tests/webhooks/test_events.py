"""What happens becomes an event, once, for whoever listens: the tenant's
endpoints and the operator's, never another tenant's; its owners and admins
by email unless they opted out. Each delivery is signed, logged attempt by
attempt, and can be sent again from the page. (Through a real Celery
worker with its backoff: test_delivery_worker.py.)"""

from __future__ import annotations

import hashlib
import json
import socket
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.core import mail
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from billing.invoicing.invoices import invoice_draft_build, invoice_finalize
from billing.models import Plan, Subscription
from billing.sla.notices import slo_breaches_emit
from billing.spend.budgets import budget_check
from billing.spend.corrections import spend_corrections_write
from billing.spend.wallet import credit_grant_create
from serving.services import replica_health_record
from tenants.choices import Role
from tenants.models import TenantPolicy
from tests.factories import make_finance_user, make_member
from tests.webhooks.helpers import endpoint_registered, invoice_finalized
from tests.webhooks.receiver import receiver_running
from webhooks.models import Delivery, DeliveryAttempt, Event
from webhooks.services import delivery_attempt
from webhooks.signing import secret_generate

pytestmark = pytest.mark.django_db
OCT = datetime(2026, 10, 1, tzinfo=UTC)


@pytest.fixture
def people(world):
    world.price(since=datetime(2026, 1, 1, tzinfo=UTC))
    return {
        "a": make_member(world.a, Role.OWNER, email="owner@alpha.test").user,
        "a_admin": make_member(world.a, Role.ADMIN, email="admin@alpha.test").user,
        "b": make_member(world.b, Role.OWNER, email="owner@bravo.test").user,
        "finance": make_finance_user(),
    }


def test_an_invoice_finalized_reaches_its_tenants_and_the_operators_endpoints_signed(
    api, world, people, django_capture_on_commit_callbacks
):
    with receiver_running() as ours, receiver_running() as theirs, receiver_running() as ops:
        a = endpoint_registered(api, people["a"], ours.url, "invoice.finalized")
        endpoint_registered(api, people["b"], theirs.url, "invoice.finalized")
        endpoint_registered(api, people["finance"], ops.url, "invoice.finalized", "replica.down")

        with django_capture_on_commit_callbacks(execute=True):
            invoice = invoice_finalized(world, world.a)
        [event] = Event.objects.filter(type="invoice.finalized", tenant=world.a)
        deliveries = list(Delivery.objects.filter(event=event))
        assert sorted(d.endpoint.url for d in deliveries) == sorted([ours.url, ops.url])
        for delivery in deliveries:
            attempt = delivery_attempt(delivery_id=delivery.pk)
            assert attempt.status_code == 200 and attempt.latency_ms >= 0

        assert theirs.received == []
        [got] = ours.received
        payload = Webhook(a["secret"]).verify(got.body, got.headers)
        assert got.headers["webhook-id"] == event.id
        assert payload["type"] == "invoice.finalized" and payload["tenant"] == world.a.slug
        assert payload["data"]["number"] == invoice.number
        assert payload["data"]["total"] == "4.00" and payload["data"]["currency"] == "USD"
        attempt = DeliveryAttempt.objects.get(delivery__endpoint_id=a["id"])
        assert attempt.body_sha256 == hashlib.sha256(got.body).hexdigest()
        with pytest.raises(WebhookVerificationError):  # any other secret
            Webhook(secret_generate()).verify(got.body, got.headers)
    assert Delivery.objects.filter(status="succeeded").count() == 2

    # Emitting the same thing again (a job run twice) is no event at all.
    from billing.invoicing.notices import invoice_event_emit
    from webhooks.choices import EventType

    invoice_event_emit(invoice, EventType.INVOICE_FINALIZED)
    assert Event.objects.filter(type="invoice.finalized", tenant=world.a).count() == 1


def test_a_failing_receiver_is_retried_on_the_schedule_then_given_up(
    api, world, people, settings, django_capture_on_commit_callbacks
):
    settings.WEBHOOKS = {**settings.WEBHOOKS, "RETRY_SECONDS": [5, 300]}
    with receiver_running(500) as failing:
        endpoint_registered(api, people["a"], failing.url, "invoice.finalized")
        with django_capture_on_commit_callbacks(execute=True):
            invoice_finalized(world, world.a)
        delivery = Delivery.objects.get()
        t0 = delivery.next_attempt_at
        assert delivery_attempt(delivery_id=delivery.pk, now=t0).status_code == 500
        delivery.refresh_from_db()
        assert (delivery.status, delivery.attempts) == ("pending", 1)
        assert delivery.next_attempt_at == t0 + timedelta(seconds=5)
        assert delivery_attempt(delivery_id=delivery.pk, now=t0 + timedelta(seconds=1)) is None
        delivery_attempt(delivery_id=delivery.pk, now=t0 + timedelta(seconds=5))
        delivery.refresh_from_db()
        assert delivery.next_attempt_at == t0 + timedelta(seconds=305)
        delivery_attempt(delivery_id=delivery.pk, now=t0 + timedelta(seconds=305))
        delivery.refresh_from_db()
        assert (delivery.status, delivery.attempts, delivery.next_attempt_at) == ("failed", 3, None)
        assert len(failing.received) == 3
        assert {r.headers["webhook-id"] for r in failing.received} == {delivery.event_id}


def test_redelivering_from_the_page_sends_the_same_event_again(
    api, client, world, people, django_capture_on_commit_callbacks
):
    with receiver_running() as ours:
        endpoint_registered(api, people["a"], ours.url, "invoice.finalized")
        with django_capture_on_commit_callbacks(execute=True):
            invoice_finalized(world, world.a)
        delivery = Delivery.objects.get()
        delivery_attempt(delivery_id=delivery.pk)

        client.force_login(people["a_admin"])
        page = client.get(f"/webhooks/deliveries/{delivery.pk}/").content.decode()
        assert "Delivered" in page and delivery.event_id in page
        assert client.post(f"/webhooks/deliveries/{delivery.pk}/redeliver").status_code == 303
        delivery.refresh_from_db()
        assert (delivery.status, delivery.attempts) == ("pending", 0)
        delivery_attempt(delivery_id=delivery.pk)

        assert [r.headers["webhook-id"] for r in ours.received] == [delivery.event_id] * 2
        by = delivery.log.order_by("at", "pk").values_list("by", flat=True)
        assert list(by) == ["", people["a_admin"].username]  # the retry's, then the person's

        client.force_login(people["b"])  # another tenant's delivery: not found
        assert client.get(f"/webhooks/deliveries/{delivery.pk}/").status_code == 404
        assert client.post(f"/webhooks/deliveries/{delivery.pk}/redeliver").status_code == 404
        api.force_login(people["b"])
        assert api.post(f"/api/v1/webhooks/deliveries/{delivery.pk}/redeliver").status_code == 404

        # Finance redelivers any tenant's from the page; an owner through the API.
        client.force_login(people["finance"])
        assert client.post(f"/webhooks/deliveries/{delivery.pk}/redeliver").status_code == 303
        delivery_attempt(delivery_id=delivery.pk)
        api.force_login(people["a"])
        answer = api.post(f"/api/v1/webhooks/deliveries/{delivery.pk}/redeliver")
        assert answer.status_code == 202, answer.content
        assert (answer.json()["status"], answer.json()["attempts"]) == ("pending", 0)
        delivery_attempt(delivery_id=delivery.pk)

        assert [r.headers["webhook-id"] for r in ours.received] == [delivery.event_id] * 4
        by = delivery.log.order_by("at", "pk").values_list("by", flat=True)
        assert list(by) == [
            "",
            people["a_admin"].username,
            people["finance"].username,
            people["a"].username,
        ]
        page = client.get(f"/webhooks/deliveries/{delivery.pk}/").content.decode()
        for attempt in delivery.log.all():  # status, latency and the body's hash shown
            assert attempt.body_sha256[:12] in page
            assert f'<td class="num">{attempt.status_code}</td>' in page
            assert f'<td class="num">{attempt.latency_ms}</td>' in page


def test_an_owner_chooses_their_alert_emails_on_the_webhooks_page(
    api, client, world, people, django_capture_on_commit_callbacks
):
    client.force_login(people["a"])
    answer = client.post("/webhooks/", {"action": "alerts", "emailed": ["invoice.paid"]})
    assert answer.status_code == 303
    api.force_login(people["a"])
    assert api.get("/api/v1/alerts").json()["emailed"] == ["invoice.paid"]

    with django_capture_on_commit_callbacks(execute=True):
        invoice_finalized(world, world.a)
    [email] = mail.outbox  # the admin's; the owner opted out of invoice.finalized
    assert email.to == ["admin@alpha.test"] and "issued" in email.subject


def test_a_budget_threshold_is_an_event_and_an_email_unless_opted_out(
    api, world, people, django_capture_on_commit_callbacks
):
    TenantPolicy.objects.filter(tenant=world.a).update(
        monthly_budget=Decimal(100), budget_soft_percent=50, budget_hard_percent=100
    )
    world.tokens(world.a, hour=datetime(2026, 10, 3, tzinfo=UTC), completion=60 * 250_000)
    api.force_login(people["a"])
    answer = api.put("/api/v1/alerts", {"emailed": ["invoice.paid"]}, format="json")
    assert answer.status_code == 200 and answer.json()["emailed"] == ["invoice.paid"]
    assert (
        api.put("/api/v1/alerts", {"emailed": ["replica.down"]}, format="json").status_code == 400
    )

    with django_capture_on_commit_callbacks(execute=True):
        budget_check(tenant=world.a, now=datetime(2026, 10, 20, tzinfo=UTC))

    [event] = Event.objects.filter(type="budget.threshold_crossed")
    assert event.tenant == world.a and event.data["threshold"] == "soft"
    assert event.data["spend"] == "60.00" and event.data["currency"] == "USD"
    [email] = mail.outbox
    assert email.to == ["admin@alpha.test"]  # the owner opted out
    assert "60.0% of the monthly budget used (past the 50% alert threshold)" in email.subject
    assert event.data["used_percent"] == "60.0" and event.data["percent"] == 50


def test_replica_down_is_told_to_the_operator_only(api, world, people):
    pool = world.pool("shared-a")
    replica = world.replica("r-1", pool, [])
    with receiver_running() as ops, receiver_running() as ours:
        endpoint_registered(api, people["finance"], ops.url, "replica.down")
        endpoint_registered(api, people["a"], ours.url, "invoice.paid")
        at = datetime(2026, 11, 29, 6, tzinfo=UTC)
        assert replica_health_record(replica_id=replica.pk, up=False, reason="timed out", at=at)
        assert not replica_health_record(replica_id=replica.pk, up=False, reason="again", at=at)

    [event] = Event.objects.filter(type="replica.down")
    assert event.tenant is None and event.data["replica"] == "r-1"
    assert event.data["reason"] == "timed out"
    assert [d.endpoint.url for d in Delivery.objects.filter(event=event)] == [ops.url]


def test_a_failed_job_is_told_as_job_failed_to_the_operator_only(api, world, people):
    from celery import shared_task

    @shared_task(name="tests.webhooks.breaks")
    def breaks():
        raise RuntimeError("the disk is full")

    with receiver_running() as ops, receiver_running() as theirs:
        endpoint_registered(api, people["finance"], ops.url, "job.failed")
        endpoint_registered(api, people["a"], theirs.url, "invoice.finalized")
        breaks.apply()

        [event] = Event.objects.filter(type="job.failed")
        assert event.data["task"] == "tests.webhooks.breaks"
        assert event.data["error"] == "RuntimeError: the disk is full"
        [delivery] = Delivery.objects.filter(event=event)
        assert delivery_attempt(delivery_id=delivery.pk).status_code == 200
        payload = json.loads(ops.received[0].body)
        assert payload["type"] == "job.failed" and payload["data"]["task"] == event.data["task"]
    assert theirs.received == []


def test_prepaid_credit_running_low_is_told_once_per_grant(world, people):
    since = datetime(2026, 1, 1, tzinfo=UTC)
    credit_grant_create(tenant=world.a, amount=Decimal("4.50"), granted_at=since)
    invoice_finalized(world, world.a, month=8)  # $4.00 of $4.50: 11% left
    invoice_finalized(world, world.a, month=9)  # still low: no second event

    [event] = Event.objects.filter(type="credit.low", tenant=world.a)
    assert event.data["remaining_minor"] == 50 and event.data["granted_minor"] == 450
    assert "0.50" in event.summary

    credit_grant_create(tenant=world.a, amount=Decimal("5.00"), granted_at=since)  # arms it again
    invoice_finalized(world, world.a, month=10)
    assert Event.objects.filter(type="credit.low", tenant=world.a).count() == 2


def test_prepaid_credit_running_low_mid_month_is_told_before_any_invoice(
    world, people, django_capture_on_commit_callbacks
):
    """The spend corrections (every five minutes) read the prepaid usage no
    invoice has drawn yet: credit running low is told while the month runs,
    not only when an invoice draws it; the invoice that later draws that
    usage tells nothing again."""
    start = datetime(2026, 9, 1, tzinfo=UTC)
    plan = Plan.objects.create(name="Prepaid", prepaid=True)
    Subscription.objects.create(tenant=world.a, plan=plan, start=start)
    credit_grant_create(tenant=world.a, amount=Decimal("4.50"), granted_at=start)
    # Last quarter's grant, unspent but expired: the gateway holds it to
    # nothing, and neither does the check.
    credit_grant_create(
        tenant=world.a,
        amount=Decimal("100"),
        granted_at=start - timedelta(days=90),
        expires_at=start,
    )
    world.tokens(world.a, hour=start + timedelta(hours=1), completion=500_000)  # 2.00
    spend_corrections_write(now=start + timedelta(hours=5))
    assert not Event.objects.filter(type="credit.low").exists()  # 2.50 of 4.50 left

    world.tokens(world.a, hour=start + timedelta(hours=6), completion=500_000)  # 4.00 in all
    with django_capture_on_commit_callbacks(execute=True):
        spend_corrections_write(now=start + timedelta(hours=9))
    [event] = Event.objects.filter(type="credit.low", tenant=world.a)
    assert event.data["remaining_minor"] == 50 and event.data["granted_minor"] == 450
    assert "0.50" in event.summary
    [email] = mail.outbox
    assert email.subject == event.summary
    assert email.to == ["admin@alpha.test", "owner@alpha.test"]

    spend_corrections_write(now=start + timedelta(hours=12))  # still low: told once
    draft, _ = invoice_draft_build(tenant=world.a, period_start=start, period_end=OCT)
    invoice_finalize(invoice_id=draft.pk)  # draws the same 4.00 from the grant
    assert Event.objects.filter(type="credit.low").count() == 1


def test_a_service_level_missed_over_a_day_is_told_once(ledger):
    from tests.slo import slo_day, slo_policy

    slo_policy()
    day = datetime(2026, 11, 20, tzinfo=UTC)
    slo_day(ledger, ledger.a, day)

    assert slo_breaches_emit(day=day.date()) == [ledger.a.slug]
    assert slo_breaches_emit(day=day.date()) == [ledger.a.slug]  # the same event key: no new one
    [event] = Event.objects.filter(type="slo.breached")
    assert event.tenant == ledger.a and event.data["day"] == "2026-11-20"
    assert {m["metric"] for m in event.data["missed"]} == {"availability", "ttft_p95"}
    assert "87.5" in event.summary


def test_an_attempt_connects_to_the_address_it_checked_never_a_rebound_one(
    api, world, people, settings, monkeypatch, django_capture_on_commit_callbacks
):
    """DNS rebinding: a name that answers an allowed address while it is
    checked and another (here an unroutable one) a moment later. The
    attempt connects to the address checked and never asks the name again."""
    settings.WEBHOOKS = {**settings.WEBHOOKS, "TIMEOUT_SECONDS": 2}
    with receiver_running() as ours:
        url = ours.url.replace("127.0.0.1", "localhost")
        endpoint_registered(api, people["a"], url, "invoice.finalized")
        with django_capture_on_commit_callbacks(execute=True):
            invoice_finalized(world, world.a)
        delivery = Delivery.objects.get()

        real, asked = socket.getaddrinfo, []

        def rebinding(host, port, *args, **kwargs):
            if host == "localhost":
                asked.append(host)
                host = "127.0.0.1" if len(asked) == 1 else "192.0.2.1"  # TEST-NET-1
            return real(host, port, *args, **kwargs)

        monkeypatch.setattr(socket, "getaddrinfo", rebinding)
        attempt = delivery_attempt(delivery_id=delivery.pk)

        assert attempt.status_code == 200, attempt.error
        assert asked == ["localhost"]  # the check's question, and no other
        assert [r.headers["host"] for r in ours.received] == [url.split("/")[2]]
