"""The record stage: what became of a request, as the ledger's row
(handed to the recorder, gateway.recorder, which never blocks the
response), and its request metrics. Every request gets one row, whatever
became of it (a disaggregated one, one per phase)."""

from __future__ import annotations

from datetime import datetime

from gateway.answers import respond_refused
from gateway.callers import Caller
from gateway.errors import Refused
from gateway.exchange import Exchange, Rejected
from gateway.outcome import Outcome, ms, now
from gateway.perf_metrics import PerfMetrics
from gateway.prompt_count import prompt_counted
from gateway.recorder import Recorder
from gateway.telemetry import queue_wait_observe, request_observe
from gateway.worker_rows import WorkerOf, worker_rows
from metering.choices import Phase, Timing
from serving.choices import RequestStatus
from serving.records import CompletedRequest


class Recording:
    """Where the pipeline's rows go, and what fills them in."""

    def __init__(
        self, recorder: Recorder, perf_metrics: PerfMetrics, *, worker_of: WorkerOf
    ) -> None:
        self.recorder = recorder
        self.perf_metrics = perf_metrics  # TensorRT-LLM's timings, read apart
        self.worker_of = worker_of  # the workers behind a frontend (Dynamo's)

    async def answered(self, ex: Exchange, outcome: Outcome | None, last_error: str) -> None:
        """Record what the replica answered (already relayed to the client),
        or answer 503 when no replica could take the request."""
        record = ex.record
        if outcome is None:
            record.status, record.http_status, record.error = RequestStatus.ERROR, 503, last_error
            self.finish(record, ex.caller)
            message = f"no model server could take the request ({last_error})"
            # A replica back up, or one more added, is heard of at once
            # (core.changes), and a suspect one is tried again when it is
            # the only one left.
            refused = Refused(503, "no_replica", message, retry_after=1)
            await respond_refused(ex.send, refused, [ex.rid_header])
            return
        await self.outcome(record, ex.caller, outcome)

    async def rejected(self, ex: Exchange, rejected: Rejected, *, queued: bool) -> None:
        """A request that ran nowhere: recorded as rejected (no replica, no
        tokens: nothing billed, nothing attributed), then answered.
        `queued`: its time in the queue is the record's (fair queuing on)."""
        record = ex.record
        record.status = RequestStatus.REJECTED
        record.http_status, record.error = rejected.status, rejected.error
        record.replica_id = record.pool_id = None
        wait = ex.wait
        if wait is not None and queued:
            record.gateway_queue_ms = ms(wait.waited * 1000)
            if wait.entered:
                queue_wait_observe(ex.caller.priority, wait.waited)
        self.finish(record, ex.caller, model_label=rejected.model_label)
        if rejected.refused is not None:
            await respond_refused(ex.send, rejected.refused, [ex.rid_header])

    async def outcome(
        self, record: CompletedRequest, caller: Caller, outcome: Outcome, *, observe: bool = True
    ) -> None:
        """Record what a replica did with the request (or a phase of it:
        `observe` False for a phase the request's metrics count elsewhere)."""
        outcome = await prompt_counted(outcome)
        timings = outcome.timings
        if outcome.perf_metrics_url and not timings.any:  # TensorRT-LLM's, kept apart
            timings = await self.perf_metrics.timings(outcome.perf_metrics_url, outcome.engine_id)
        usage = outcome.usage
        record.status, record.http_status, record.error = (
            outcome.status,
            outcome.http_status,
            outcome.error,
        )
        record.sent_at, record.first_token_at = outcome.sent_at, outcome.first_token_at
        record.prompt_tokens = usage.get("prompt_tokens") or 0
        record.completion_tokens = usage.get("completion_tokens") or 0
        record.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        record.queue_ms = ms(timings.queue_ms)
        record.ttft_ms = ms(timings.ttft_ms)
        record.generation_ms = ms(timings.generation_ms)
        # Whose clock its timeline is: the engine's, or the gateway's own
        # window (an engine that said nothing of its timing).
        record.timing = Timing.ENGINE if timings.any else Timing.GATEWAY
        record.ended_at = outcome.upstream_ended_at or now()
        for row in worker_rows(record, timings.workers, self.worker_of):
            counted = observe and row.phase != Phase.PREFILL
            self.finish(row, caller, ended_at=row.ended_at, observe=counted)

    def finish(
        self,
        record: CompletedRequest,
        caller: Caller,
        model_label: str | None = None,
        *,
        ended_at: datetime | None = None,
        observe: bool = True,
    ) -> None:
        record.ended_at = ended_at or now()
        self.recorder.add(record)
        if observe:
            request_observe(record, tenant=caller.tenant_slug, model_label=model_label)
