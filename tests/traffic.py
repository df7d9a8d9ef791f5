"""Steady traffic from one client, as a test of a fault sends it: requests
one after another through a gateway with the official openai client, what
it saw succeed (request id and tokens) and every other answer, and the
ledger's tokens for those requests to compare."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import openai

from serving.tiny_model import MODEL_NAME

MAX_TOKENS = 4


@dataclass
class Traffic:
    """Requests one client sends, one after another, until told to stop or
    its gateway is gone: what it saw succeed, and every other answer."""

    url: str
    secret: str
    label: str
    answered: dict[str, tuple[int, int]] = field(default_factory=dict)  # id -> tokens
    answered_at: list[float] = field(default_factory=list)
    failed: list[tuple[int, str]] = field(default_factory=list)
    gone: bool = False

    def run(self, stop: threading.Event) -> threading.Thread:
        client = openai.OpenAI(
            base_url=f"{self.url}/v1", api_key=self.secret, max_retries=0, timeout=30
        )

        def loop():
            n = 0
            while not stop.is_set():
                n += 1
                try:
                    raw = client.chat.completions.with_raw_response.create(
                        model=MODEL_NAME,
                        messages=[{"role": "user", "content": f"{self.label} says {n}"}],
                        max_tokens=MAX_TOKENS,
                        extra_body={"ignore_eos": True},
                    )
                except openai.APIStatusError as exc:
                    self.failed.append((exc.status_code, str(exc.body)[:200]))
                    time.sleep(0.05)  # as after an answer: a refusal is not a reason to hurry
                    continue
                except openai.APIConnectionError:  # the gateway is gone
                    self.gone = True
                    return
                usage = raw.parse().usage
                self.answered[raw.headers["x-request-id"]] = (
                    usage.prompt_tokens,
                    usage.completion_tokens,
                )
                self.answered_at.append(time.monotonic())
                time.sleep(0.05)

        thread = threading.Thread(target=loop, name=f"traffic-{self.label}")
        thread.start()
        return thread


def ledger_tokens(request_ids) -> dict[str, tuple[int, int]]:
    from metering.models import UsageEvent

    return {
        rid: (prompt, completion)
        for rid, prompt, completion in UsageEvent.objects.filter(
            request_id__in=list(request_ids)
        ).values_list("request_id", "prompt_tokens", "completion_tokens")
    }
