"""A hard budget held per request at the gateway: a request is
forwarded only if its worst case fits what is left of the budget, refused
402 naming what is left and what it might cost otherwise, and settles to
what its tokens cost, priced by billing's rating code."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from billing.models import ModelPrice, PriceBook
from billing.pricing.rate_card import RateCard
from billing.spend.accounts import LocalSpend
from billing.spend.terms import SpendAccount, SpendTerms
from gateway.errors import Refused
from gateway.spend import SpendGuard
from serving.models import ServedModel
from serving.tiny_model import MODEL_NAME
from tests.fleet import wait_for_records
from tests.gateway.test_gateway_fair_queue import post

pytestmark = [pytest.mark.slow]
D = Decimal


def test_a_request_that_might_pass_the_budget_is_refused_before_it_runs(fleet, fake):
    fake.usage_as_asked = True  # prompt tokens = its characters, output = max_tokens
    fleet.add_tenant("capped", monthly_budget=D("0.1"), budget_hard_percent=100)
    fleet.add_replica("fake", fake.base_url, "shared", max_inflight=4)
    book = PriceBook.objects.create(name="list", effective_from=datetime(2026, 1, 1, tzinfo=UTC))
    ModelPrice.objects.create(
        book=book,
        served_model=ServedModel.objects.get(name=MODEL_NAME),
        input_per_mtok=D(1000),  # 0.001 a token
        cached_input_per_mtok=D(1000),
        output_per_mtok=D(2000),  # 0.002 a token
    )
    fleet.ready()

    # Worst case: 82 prompt tokens (2 x (5 bytes + 4 template) + 64) and 5 output:
    # 0.092 of 0.1. It runs and costs 5 x 0.001 + 5 x 0.002 = 0.015.
    first = post(fleet.gateway, fleet.secrets["capped"], "hello", max_tokens=5)
    assert first.status_code == 200
    # 0.085 left: the same worst case no longer fits.
    second = post(fleet.gateway, fleet.secrets["capped"], "hello", max_tokens=5)
    assert second.status_code == 402
    error = second.json()["error"]
    assert error["code"] == "budget_exceeded" and error["param"] == "max_tokens"
    assert "0.085 USD left of 0.1" in error["message"]
    assert "may cost up to 0.092 USD" in error["message"]
    assert len(fake.requests) == 1  # never forwarded
    ids = [r.headers["x-request-id"] for r in (first, second)]
    records = wait_for_records(ids)
    assert records[ids[0]].completion_tokens == 5
    refused = records[ids[1]]
    assert (refused.http_status, refused.status, refused.completion_tokens) == (402, "rejected", 0)
    assert refused.error.startswith("budget_exceeded: ")


def test_a_tenant_with_a_budget_may_not_use_an_unpriced_model():
    terms = SpendTerms(
        tenant_id=1,
        period_start=datetime(2026, 11, 1, tzinfo=UTC),
        period_end=datetime(2026, 12, 1, tzinfo=UTC),
        currency="EUR",
        accounts=(
            SpendAccount("budget", "t1:budget:x", datetime(2026, 11, 1, tzinfo=UTC), D(5), D(0)),
        ),
        cards={
            "priced": RateCard(
                steps={"input": ((0, D(1)),), "cached_input": ((0, D(1)),), "output": ((0, D(2)),)}
            )
        },
        volume={},
    )
    guard = SpendGuard(LocalSpend(), lease_seconds=60)

    async def reserve(model):
        return await guard.reserve(
            terms,
            model=model,
            request_id="r",
            prompt_tokens_max=10,
            output_tokens_max=10,
            choices=2,
        )

    refused = asyncio.run(reserve("unpriced"))
    assert isinstance(refused, Refused)
    assert (refused.status, refused.code, refused.param) == (409, "model_not_priced", "model")
    assert "`unpriced`" in refused.message
    held = asyncio.run(reserve("priced"))
    assert not isinstance(held, Refused)


@pytest.mark.parametrize(
    ("output_field", "param", "advice"),
    [
        ("max_tokens", "max_tokens", "lower max_tokens, or raise the budget"),
        ("max_output_tokens", "max_output_tokens", "lower max_output_tokens, or raise"),
        (None, "input", "send less input, or raise the budget"),  # an embedding
    ],
)
def test_a_402_names_the_field_that_bounds_the_requests_cost(output_field, param, advice):
    since = datetime(2026, 11, 1, tzinfo=UTC)
    terms = SpendTerms(
        tenant_id=1,
        period_start=since,
        period_end=datetime(2026, 12, 1, tzinfo=UTC),
        currency="EUR",
        accounts=(SpendAccount("budget", "t1:budget:y", since, D("0.00001"), D(0)),),
        cards={"m": RateCard(steps={k: ((0, D(1)),) for k in ("input", "cached_input", "output")})},
        volume={},
    )
    guard = SpendGuard(LocalSpend(), lease_seconds=60)
    refused = asyncio.run(
        guard.reserve(
            terms,
            model="m",
            request_id="r",
            prompt_tokens_max=100,
            output_tokens_max=0 if output_field is None else 100,
            choices=1,
            output_field=output_field,
        )
    )
    assert isinstance(refused, Refused)
    assert (refused.status, refused.code, refused.param) == (402, "budget_exceeded", param)
    assert advice in refused.message


class GoneAfterFirst(LocalSpend):
    """Spend accounts that become unreachable after the first reservation."""

    async def reserve(self, *args, **kwargs):
        if getattr(self, "reached", False):
            raise ConnectionError("Redis is gone")
        self.reached = True
        return await super().reserve(*args, **kwargs)


def gpu_terms(limit: str) -> SpendTerms:
    card = RateCard(
        steps={"input": ((0, D(0)),), "cached_input": ((0, D(0)),), "output": ((0, D(0)),)},
        per_gpu_second=D("0.01"),
    )
    since = datetime(2026, 11, 1, tzinfo=UTC)
    return SpendTerms(
        tenant_id=1,
        period_start=since,
        period_end=datetime(2026, 12, 1, tzinfo=UTC),
        currency="EUR",
        accounts=(SpendAccount("budget", "t1:budget:gpu", since, D(limit), D(0)),),
        cards={"m": card},
        volume={},
    )


@pytest.mark.parametrize(
    ("store", "limit", "stopped"),
    [
        (LocalSpend, "1", None),  # renewed: runs on
        (LocalSpend, "0.005", (402, "budget_exceeded")),  # one grant fits, two do not
        (GoneAfterFirst, "1", (503, "spend_unavailable")),  # cannot renew: fails closed
    ],
)
def test_a_running_requests_gpu_grant_is_renewed_or_the_request_stopped(store, limit, stopped):
    """Grants of 0.2 s of a two-GPU replica at 0.01 a GPU-second (0.004
    each), renewed 0.1 s before they run out; stopped 0.05 s before the
    last runs out when a renewal does not fit or cannot be asked."""
    guard = SpendGuard(store(), lease_seconds=60, grant_seconds=0.2)

    async def scenario():
        hold = await guard.reserve(
            gpu_terms(limit),
            model="m",
            request_id="r",
            prompt_tokens_max=1,
            output_tokens_max=1,
            choices=1,
            gpus=2,
        )
        assert hold.gpu.granted == pytest.approx(0.4)
        async with guard.running(hold, tenant_id=1, replica_id=7, gpus=2) as cut:
            for _ in range(60):  # 0.6 s, unless it is stopped
                await asyncio.sleep(0.01)
                if cut.fired:
                    break
        return hold, cut

    hold, cut = asyncio.run(scenario())
    if stopped is None:
        assert not cut.fired and hold.gpu.granted >= 1.2 - 1e-9  # 0.6 s of 2 GPUs, held ahead
        return
    assert (cut.refused.status, cut.refused.code) == stopped
    assert "stopped after the 0.4 GPU-seconds it held" in cut.refused.message
    assert 0.28 < hold.gpu.share < 0.4  # stopped before its grant ran out
