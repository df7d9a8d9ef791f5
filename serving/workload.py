"""The demo's multi-tenant workload, sent through the gateway with the
official openai client: chatty short requests, a long-context batch
tenant, bursts, and a high-priority tenant, for `seconds`. Each tenant
uses its own demo API key; refusals (429 over a limit) are counted, not
retried, as a real client would see them. The result keeps the first
error, so a run where nothing succeeded can say why."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

# About 1,000 characters: long for the tiny model's 2,048-token context.
LONG_PROMPT = " ".join(f"Region {n}: quarterly figures steady, margin flat." for n in range(20))


@dataclass(frozen=True)
class Shape:
    slug: str
    threads: int
    prompt: str
    max_tokens: int
    pause: float = 0.0  # seconds between requests of one thread
    burst: int = 0  # if set: this many at once, every `pause` seconds
    stream: bool = False


SHAPES = [
    Shape("hooli", threads=3, prompt="Hi! Quick question about my order.", max_tokens=8),
    Shape("stark", threads=1, prompt=LONG_PROMPT, max_tokens=48),
    Shape("umbrella", threads=1, prompt="Summarise this note.", max_tokens=16, pause=8, burst=6),
    Shape("initech", threads=1, prompt="Search: GPU pricing", max_tokens=16, stream=True),
    Shape("acme", threads=1, prompt="Plan the robot's next move.", max_tokens=24),
    Shape("globex", threads=1, prompt="Classify this transaction.", max_tokens=12),
]


@dataclass
class WorkloadResult:
    """Per tenant: requests answered ("ok"), refused (4xx) and failed, and
    tokens; and the first error any request met."""

    per_tenant: dict[str, dict[str, int]] = field(default_factory=dict)
    first_error: str = ""

    def total(self, outcome: str) -> int:
        return sum(counts.get(outcome, 0) for counts in self.per_tenant.values())


def workload_run(
    *, gateway_url: str, keys: dict[str, str], model: str, seconds: float
) -> WorkloadResult:
    """Send the demo shapes through the gateway for `seconds`."""
    import logging

    import openai

    for name in ("httpx", "httpx2", "openai"):  # not a line per request
        logging.getLogger(name).setLevel(logging.WARNING)
    results: dict[str, Counter] = {shape.slug: Counter() for shape in SHAPES if shape.slug in keys}
    deadline = time.monotonic() + seconds
    lock = threading.Lock()
    first_error: list[str] = []

    def count(slug: str, outcome: str, error: Exception) -> None:
        with lock:
            results[slug][outcome] += 1
            if not first_error:
                first_error.append(f"{slug}: {type(error).__name__}: {error}"[:500])

    def one(client, shape: Shape) -> None:
        try:
            if shape.stream:
                stream = client.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": shape.prompt}],
                    max_tokens=shape.max_tokens,
                    stream=True,
                    stream_options={"include_usage": True},
                )
                usage = None
                for chunk in stream:
                    usage = chunk.usage or usage
            else:
                usage = client.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": shape.prompt}],
                    max_tokens=shape.max_tokens,
                ).usage
            with lock:
                results[shape.slug]["ok"] += 1
                results[shape.slug]["tokens"] += usage.total_tokens if usage else 0
        except openai.APIStatusError as exc:
            count(shape.slug, "refused" if exc.status_code < 500 else "failed", exc)
        except Exception as exc:  # no connection, or an answer that is not the API's
            count(shape.slug, "failed", exc)

    def loop(shape: Shape) -> None:
        client = openai.OpenAI(
            base_url=f"{gateway_url}/v1", api_key=keys[shape.slug], max_retries=0, timeout=120
        )
        while time.monotonic() < deadline:
            if shape.burst:
                burst = [
                    threading.Thread(target=one, args=(client, shape)) for _ in range(shape.burst)
                ]
                for t in burst:
                    t.start()
                for t in burst:
                    t.join()
            else:
                one(client, shape)
            if shape.pause:
                time.sleep(min(shape.pause, max(deadline - time.monotonic(), 0)))

    threads = [
        threading.Thread(target=loop, args=(shape,), daemon=True)
        for shape in SHAPES
        if shape.slug in keys
        for _ in range(shape.threads)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=seconds + 180)
    return WorkloadResult(
        per_tenant={slug: dict(counts) for slug, counts in results.items()},
        first_error=first_error[0] if first_error else "",
    )
