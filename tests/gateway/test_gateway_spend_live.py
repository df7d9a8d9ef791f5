"""Spend control as finance staff and tenants live it, through a real
gateway process whose caller cache would keep a tenant's terms for five
minutes: a prepaid tenant is served until its credit runs out and refused
with 402 insufficient_credit; credit granted (or a budget raised) over the
API is held from the next request, well within a second, because the
gateway is told as the change commits; and the ledger's correction of the
gateway's counter is applied and its drift shown on reconciliation and in
/metrics."""

from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import httpx
import openai
import pytest
from django.test import Client

from billing.models import CreditGrant, ModelPrice, Plan, PriceBook, SpendCorrection, Subscription
from billing.spend.accounts import redis_spend_state
from billing.spend.corrections import spend_corrections_write
from billing.spend.terms import spend_terms
from metering.models import UsageEvent, UsageRollup
from serving.tiny_model import MODEL_NAME
from tests.factories import make_finance_user
from tests.fleet import (
    Fleet,
    fleet_done,
    fleet_model,
    gateway_worker,
    ledger_events_clear,
    metering_run_all,
    start_gateway,
    stop_gateway,
    wait_for_fleet,
    wait_for_records,
    wait_for_records_written,
)
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.test_gateway_fair_queue import post
from tests.services import redis_url, require

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
D = Decimal
LONG_CACHE = {"GATEWAY_KEY_CACHE_SECONDS": "300", "GATEWAY_TERMS_CACHE_SECONDS": "300"}


def drained(read, *, seconds: float = 8.0):
    """`read()` (an account's state in Redis) once nothing is reserved on
    it: a gateway's spend slice gives its free part back after idling
    (billing.spend.slices.IDLE_SECONDS), its charges drawn within
    DRAW_SECONDS. The last state read, if that takes longer."""
    deadline = time.monotonic() + seconds
    state = read()
    while state is not None and state.reserved and time.monotonic() < deadline:
        time.sleep(0.1)
        state = read()
    time.sleep(0.2)  # the last draw's charges
    return read()


@contextmanager
def live_fleet(**env):
    proc, url = start_gateway(env={**LONG_CACHE, **env})
    try:
        yield Fleet(gateway=url, model=fleet_model())
        fleet_done(url)
    finally:
        stop_gateway(proc)
        ledger_events_clear()


@pytest.fixture
def fake():
    upstream = FakeUpstream().start()
    upstream.usage_as_asked = True  # prompt tokens = its characters, output = max_tokens
    yield upstream
    upstream.stop()


@pytest.fixture
def finance():
    client = Client()
    client.force_login(make_finance_user())
    return client


def price_book(fleet: Fleet, **prices) -> None:
    """One price book in force since January for the fleet's model, free
    but for `prices`."""
    book = PriceBook.objects.create(name="list", effective_from=datetime(2026, 1, 1, tzinfo=UTC))
    free = {"input_per_mtok": 0, "cached_input_per_mtok": 0, "output_per_mtok": 0}
    ModelPrice.objects.create(book=book, served_model=fleet.model, **{**free, **prices})


def priced(fleet: Fleet) -> None:
    """$0.001 a prompt token, $0.002 an output token: "hello" with
    max_tokens=5 may cost 0.092 (82 prompt tokens at most) and costs 0.015."""
    price_book(
        fleet, input_per_mtok=D(1000), cached_input_per_mtok=D(1000), output_per_mtok=D(2000)
    )


def prepaid(tenant, credit: str) -> None:
    plan = Plan.objects.create(name=f"Prepaid {tenant.slug}", prepaid=True)
    start = datetime.now(UTC) - timedelta(days=1)
    Subscription.objects.create(tenant=tenant, plan=plan, start=start)
    CreditGrant.objects.create(tenant=tenant, amount=D(credit), granted_at=start)


def served_again_within(fleet: Fleet, name: str, *, seconds: float) -> float:
    """How long after now the tenant's requests are served again."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        if post(fleet.gateway, fleet.secrets[name]).status_code == 200:
            return time.monotonic() - started
        time.sleep(0.02)
    raise AssertionError(f"{name} still refused {seconds} s after the change")


def test_a_model_without_a_price_is_409_and_the_openai_client_asks_once(fake):
    """A budgeted tenant may use only priced models; no wait prices one, so
    the 409 tells the official client (which retries 409s by itself) not to."""
    with live_fleet() as fleet:
        tenant = fleet.add_tenant("capped", monthly_budget=D("1"), budget_hard_percent=100)
        fleet.add_replica("fake", fake.base_url, "shared", max_inflight=4)
        fleet.ready()  # no price book in force
        client = openai.OpenAI(
            base_url=f"{fleet.gateway}/v1", api_key=fleet.secrets["capped"], max_retries=2
        )
        with pytest.raises(openai.ConflictError) as refused:
            client.chat.completions.create(
                model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=5
            )
        error = refused.value.body
        assert (error["code"], error["param"]) == ("model_not_priced", "model")
        assert f"`{MODEL_NAME}` has no price" in error["message"]
        assert refused.value.response.headers["x-should-retry"] == "false"
        wait_for_records_written(fleet.gateway)
        assert UsageEvent.objects.filter(tenant=tenant, http_status=409).count() == 1
        assert fake.requests == []


def test_prepaid_credit_runs_out_and_a_grant_lifts_the_refusal_at_once(fake, finance, settings):
    settings.REDIS_URL = ""  # as the gateway's: one process, its counters in its memory
    with live_fleet() as fleet:
        tenant = fleet.add_tenant("payg")
        fleet.add_replica("fake", fake.base_url, "shared", max_inflight=4)
        priced(fleet)
        prepaid(tenant, "0.1")
        fleet.ready()

        assert post(fleet.gateway, fleet.secrets["payg"]).status_code == 200  # 0.015
        refused = post(fleet.gateway, fleet.secrets["payg"])
        assert refused.status_code == 402
        error = refused.json()["error"]
        assert (error["code"], error["param"]) == ("insufficient_credit", "max_tokens")
        assert "0.085 USD left (credit of 0.1 " in error["message"]
        assert "may cost up to 0.092 USD" in error["message"]
        assert len(fake.requests) == 1  # never forwarded

        # Bad input: a clear 400 naming the field, and no grant written.
        for amount in ("-1", "ten", "0"):
            bad = finance.post(
                "/api/v1/credit-grants",
                {"tenant": tenant.slug, "amount": amount},
                content_type="application/json",
            )
            assert bad.status_code == 400 and bad.json()["error"]["field"] == "amount"
        assert CreditGrant.objects.filter(tenant=tenant).count() == 1

        granted = finance.post(
            "/api/v1/credit-grants",
            {"tenant": tenant.slug, "amount": "1.00"},
            content_type="application/json",
        )
        assert granted.status_code == 201, granted.content
        assert served_again_within(fleet, "payg", seconds=1.0) < 1.0

        health = gateway_worker(fleet.gateway)
        assert health["listening_for_changes"] is True

        # The tenant reads where it stands: credit 1.1; without shared
        # counters (no Redis) spent is the ledger's, reserved not visible.
        standing = Client().get(
            "/api/v1/spend", HTTP_AUTHORIZATION=f"Bearer {fleet.secrets['payg']}"
        )
        assert standing.status_code == 200, standing.content
        (account,) = standing.json()
        assert (account["kind"], D(account["limit"]), account["reserved"]) == (
            "prepaid",
            D("1.1"),
            None,
        )


def test_a_budget_raised_over_the_api_applies_from_the_next_request(fake, finance):
    with live_fleet() as fleet:
        tenant = fleet.add_tenant("capped", monthly_budget=D("0.1"), budget_hard_percent=100)
        fleet.add_replica("fake", fake.base_url, "shared", max_inflight=4)
        priced(fleet)
        fleet.ready()
        assert post(fleet.gateway, fleet.secrets["capped"]).status_code == 200
        assert post(fleet.gateway, fleet.secrets["capped"]).status_code == 402

        url = f"/api/v1/tenants/{tenant.slug}/budget"
        for value, field in (("-5", "monthly_budget"), ("lots", "monthly_budget")):
            bad = finance.put(url, {"monthly_budget": value}, content_type="application/json")
            assert bad.status_code == 400 and bad.json()["error"]["field"] == field
        bad = finance.put(
            url,
            {"monthly_budget": "1", "budget_soft_percent": 90, "budget_hard_percent": 80},
            content_type="application/json",
        )
        assert bad.status_code == 400 and bad.json()["error"]["field"] == "budget_soft_percent"
        tenant.policy.refresh_from_db()
        assert tenant.policy.monthly_budget == D("0.1")  # nothing half written

        raised = finance.put(url, {"monthly_budget": "1"}, content_type="application/json")
        assert raised.status_code == 200 and raised.json()["monthly_budget"] == "1.0000"
        assert served_again_within(fleet, "capped", seconds=1.0) < 1.0


def test_the_ledger_corrects_the_gateways_counter_and_the_drift_shows(fake, finance):
    with live_fleet() as fleet:
        tenant = fleet.add_tenant("capped", monthly_budget=D("0.2"), budget_hard_percent=100)
        fleet.add_replica("fake", fake.base_url, "shared", max_inflight=4)
        priced(fleet)
        fleet.ready()
        assert post(fleet.gateway, fleet.secrets["capped"]).status_code == 200  # 0.015
        wait_for_records_written(fleet.gateway)
        now = datetime.now(UTC)
        metering_run_all()
        # Usage the gateway never saw reaches the ledger (another gateway's
        # lost settlement, usage imported): 50 output tokens, 0.1.
        UsageRollup.objects.create(
            hour=now.replace(minute=0, second=0, microsecond=0),
            tenant=tenant,
            served_model=fleet.model,
            pool=fleet.pools["shared"],
            completion_tokens=50,
            requests_ok=1,
        )
        # The gateway's counter says 0.015 spent: 0.185 left fits 0.092.
        (correction,) = spend_corrections_write(now=now + timedelta(hours=2))
        assert correction.ledger == D("0.115")
        deadline = time.monotonic() + 5
        while correction.applied_at is None and time.monotonic() < deadline:
            time.sleep(0.05)
            correction.refresh_from_db()
        assert correction.drift == D("-0.1")  # the counter had 0.1 less than the ledger
        # Corrected: 0.115 spent, 0.085 left, and the same request no longer fits.
        refused = post(fleet.gateway, fleet.secrets["capped"])
        assert refused.status_code == 402
        assert "0.085 USD left of 0.2" in refused.json()["error"]["message"]
        assert SpendCorrection.objects.count() == 1
        # Written once per cut: the next run at the same cut writes nothing.
        assert spend_corrections_write(now=now + timedelta(hours=2)) == []

        page = finance.get("/reconciliation/")
        assert page.status_code == 200
        row = page.content.decode().split('data-testid="spend-drift"')[1].split("</table>")[0]
        assert tenant.slug in row and "-0.100000" in row
        metrics = Client().get("/metrics").content.decode()
        assert (
            f'billing_spend_counter_drift{{account="budget",tenant="{tenant.slug}"}} -0.1'
            in metrics
        )


@contextmanager
def shared_gateways(count: int, env: dict[str, str] | None = None):
    """`count` gateway processes sharing one Redis (their own key prefix)."""
    url = redis_url()
    require(url is not None, "no Redis for gateways sharing spend accounts")
    env = {
        **LONG_CACHE,
        **(env or {}),
        "REDIS_URL": url,
        "GATEWAY_REDIS_PREFIX": f"test-{uuid.uuid4().hex}",
    }
    started = [start_gateway(env=env) for _ in range(count)]
    urls = [u for _, u in started]
    try:
        yield Fleet(gateway=urls[0], model=fleet_model()), urls, env["GATEWAY_REDIS_PREFIX"]
        fleet_done(*urls)
    finally:
        for proc, _ in started:
            stop_gateway(proc)
        ledger_events_clear()


def cheap_output(fleet: Fleet) -> None:
    """Prompt tokens free, $0.001 an output token: max_tokens=5 may cost,
    and costs, 0.005."""
    price_book(fleet, output_per_mtok=D(1000))


async def flood(urls: list[str], secret: str, *, clients: int, each: int) -> list[httpx.Response]:
    """`clients` concurrent clients, `each` requests apiece, alternating gateways."""

    async def client(n: int) -> list[httpx.Response]:
        out = []
        async with httpx.AsyncClient(timeout=60) as http:
            for k in range(each):
                out.append(
                    await http.post(
                        f"{urls[(n + k) % len(urls)]}/v1/chat/completions",
                        headers={"Authorization": f"Bearer {secret}"},
                        json={
                            "model": MODEL_NAME,
                            "messages": [{"role": "user", "content": "hello"}],
                            "max_tokens": 5,
                        },
                    )
                )
        return out

    return [r for rs in await asyncio.gather(*(client(n) for n in range(clients))) for r in rs]


@pytest.mark.parametrize("held_by", ["budget", "prepaid"])
def test_fifty_clients_on_two_gateways_never_pass_the_limit(fake, held_by):
    """The race LiteLLM loses (its budgets are bypassed under concurrency,
    and multiply by the replica count): here the rated spend, re-derived
    from the ledger afterwards, is exactly the limit and never past it."""
    fake.delay = 0.05  # requests overlap, on both gateways
    with shared_gateways(2) as (fleet, urls, _):
        if held_by == "budget":
            tenant = fleet.add_tenant("racer", monthly_budget=D("0.05"), budget_hard_percent=100)
        else:
            tenant = fleet.add_tenant("racer")
            prepaid(tenant, "0.05")
        fleet.add_replica("fake", fake.base_url, "shared", max_inflight=64)
        cheap_output(fleet)
        for url in urls:
            wait_for_fleet(url, replicas=1)

        answers = asyncio.run(flood(urls, fleet.secrets["racer"], clients=50, each=3))

        ok = [r for r in answers if r.status_code == 200]
        refused = [r for r in answers if r.status_code != 200]
        assert len(ok) == 10  # 0.05 / 0.005, not one more
        code = "budget_exceeded" if held_by == "budget" else "insufficient_credit"
        assert {r.status_code for r in refused} == {402}
        assert {r.json()["error"]["code"] for r in refused} == {code}
        assert len(fake.requests) == 10
        for url in urls:
            wait_for_records_written(url)
        metering_run_all()
        now = datetime.now(UTC)
        (account,) = spend_terms(tenant=tenant, now=now).accounts
        assert account.spent == D("0.05")  # by the ledger: the limit, exactly


def test_an_aborted_stream_settles_to_what_was_streamed(fake):
    fake.usage_as_asked = fake.stream_as_asked = True
    fake.chunk_seconds = 0.05  # 200 tokens: ten seconds of stream
    with shared_gateways(1) as (fleet, _, prefix):
        tenant = fleet.add_tenant("quitter", monthly_budget=D("1"), budget_hard_percent=100)
        fleet.add_replica("fake", fake.base_url, "shared", max_inflight=4)
        cheap_output(fleet)
        fleet.ready()
        with (
            httpx.Client(timeout=30) as http,
            http.stream(
                "POST",
                f"{fleet.gateway}/v1/chat/completions",
                headers={"Authorization": f"Bearer {fleet.secrets['quitter']}"},
                json={
                    "model": MODEL_NAME,
                    "messages": [{"role": "user", "content": "hello"}],
                    "max_tokens": 200,
                    "stream": True,
                },
            ) as stream,
        ):
            request_id = stream.headers["x-request-id"]
            read = 0
            for line in stream.iter_lines():
                read += line.startswith("data: ")
                if read == 5:
                    break  # and the client goes away
        # The client went away: what it was sent is what the request costs.
        record = wait_for_records([request_id])[request_id]
        assert record.status == "aborted" and 0 < record.completion_tokens < 200
        (account,) = spend_terms(tenant=tenant, now=datetime.now(UTC)).accounts
        state = drained(lambda: redis_spend_state(redis_url(), account.key, prefix=prefix))
        assert state.reserved == 0  # the 0.2 worst case let go
        assert state.spent == D(record.completion_tokens) / 1000


def test_with_a_five_minute_key_cache_a_revoked_key_and_an_expired_one_are_refused_at_once(fake):
    """The key cache may keep a caller for minutes (thousands of tenants
    would otherwise cost a read each every few seconds): a revocation is
    heard as it commits, and a key is never kept past its expiry."""
    from django.utils import timezone

    from tenants.services import api_key_revoke
    from tests.factories import make_key

    with live_fleet() as fleet:
        tenant = fleet.add_tenant("keys")
        fleet.add_replica("fake", fake.base_url, "shared", max_inflight=4)
        fleet.ready()
        expires = timezone.now() + timedelta(seconds=3)
        _, expiring = make_key(tenant, name="short-lived", expires_at=expires)
        assert post(fleet.gateway, fleet.secrets["keys"]).status_code == 200
        assert post(fleet.gateway, expiring).status_code == 200  # cached until its expiry

        api_key_revoke(tenant=tenant, key_id=tenant.api_keys.get(name="test key").pk)
        started = time.monotonic()
        while (refused := post(fleet.gateway, fleet.secrets["keys"])).status_code == 200:
            assert time.monotonic() - started < 1.0, "a revoked key still served after 1 s"
            time.sleep(0.02)
        assert refused.status_code == 401 and "revoked" in refused.json()["error"]["message"]

        while timezone.now() < expires - timedelta(seconds=0.5):
            assert post(fleet.gateway, expiring).status_code == 200
            time.sleep(0.2)
        time.sleep((expires - timezone.now()).total_seconds() + 0.05)
        late = post(fleet.gateway, expiring)
        assert late.status_code == 401 and "expired" in late.json()["error"]["message"]
