"""The dispatch-and-relay stage: one attempt at one replica, in its
engine's dialect, its answer relayed to the client as it comes
(gateway.upstream). Before anything reaches the client a failing replica
raises UpstreamUnavailable, and the pipeline tries another."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from gateway.exchange import Exchange
from gateway.fleet import ReplicaInfo
from gateway.outcome import Cut, Outcome, Send
from gateway.payload import PATHS, extension_unasked
from gateway.upstream import UpstreamCall, UpstreamTimeouts, call_collected, call_stream, call_unary
from gateway.upstream_http import UpstreamClient
from serving.engines import EngineSpec, engine_spec


class Relay:
    """The process's client to its replicas, and how long it waits on them."""

    def __init__(self, session: UpstreamClient, timeouts: UpstreamTimeouts) -> None:
        self.session = session
        self.timeouts = timeouts

    def call(
        self,
        ex: Exchange,
        replica: ReplicaInfo,
        *,
        engine: EngineSpec,
        body: bytes,
        send: Send | None = None,
        cut: Cut | None = None,
        on_output: Callable[[int], None] | None = None,
    ) -> UpstreamCall:
        """One attempt at `replica` (not sent): what goes there, and where
        its answer goes (`send`: by default the client)."""
        return UpstreamCall(
            session=self.session,
            url=replica.base_url + PATHS[ex.kind],
            body=body,
            engine=engine,
            request_id=ex.record.request_id,
            timeouts=self.timeouts,
            send=send or ex.send,
            extra_headers=[ex.rid_header],
            on_output=on_output,
            cut=cut,
            kind=ex.kind,
            prompt_tokens_estimate=ex.prepared.prompt_tokens_estimate,
            strip=extension_unasked(engine, ex.prepared.body),
        )

    async def upstream(
        self,
        ex: Exchange,
        replica: ReplicaInfo,
        *,
        cut: Cut | None,
        on_output: Callable[[int], None] | None = None,
        body: Callable[..., bytes] | None = None,
    ) -> Outcome:
        """One attempt at one replica (UpstreamUnavailable: try another).
        `body(engine, as_stream=...)`: what to send (by default the request
        as prepared for the replica's engine)."""
        prepared = ex.prepared
        engine = engine_spec(replica.engine)
        body = body or prepared.upstream_body
        sent = body(engine, as_stream=False)
        call = self.call(ex, replica, engine=engine, body=sent, cut=cut, on_output=on_output)
        if not prepared.stream and prepared.generates and (cut or engine.perf_metrics_path):
            # It may be stopped while it runs, or its engine's timings are
            # found by a stream's id: asked as a stream, answered whole. (An
            # embedding has no stream: it runs once through, briefly.)
            streamed = body(engine, as_stream=True)
            outcome = await call_collected(replace(call, body=streamed), kind=ex.kind)
        elif prepared.stream:
            ex.disconnected.start()  # a stream relayed to a client gone is stopped
            outcome = await call_stream(
                call,
                client_wants_usage=prepared.client_wants_usage,
                client_wants_continuous_usage=prepared.client_wants_continuous_usage,
                disconnected=ex.disconnected,
            )
        else:
            outcome = await call_unary(call)
        if engine.perf_metrics_path and outcome.engine_id:
            outcome.perf_metrics_url = replica.base_url + engine.perf_metrics_path
        return outcome
