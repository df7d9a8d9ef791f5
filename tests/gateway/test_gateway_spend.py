"""A hard budget held per request at the gateway (issue 18): a request is
forwarded only if its worst case fits what is left of the budget, refused
402 naming what is left and what it might cost otherwise, and settles to
what its tokens cost, priced by billing's rating code."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from billing.models import ModelPrice, PriceBook
from billing.pricing.rating import RateCard
from billing.pricing.spend_terms import SpendTerms
from gateway.queueing import Refused
from gateway.spend import LocalSpend, SpendGuard
from serving.models import ServedModel
from serving.tiny_model import MODEL_NAME
from tests.fleet import wait_for_records
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.test_gateway_fair_queue import post

pytestmark = [pytest.mark.slow]
D = Decimal


@pytest.fixture
def fake():
    upstream = FakeUpstream().start()
    yield upstream
    upstream.stop()


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
        limit=D(5),
        spent=D(0),
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
