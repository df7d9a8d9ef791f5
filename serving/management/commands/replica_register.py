"""Register a vLLM server the platform did not start (a container, another
host) as a replica in a pool, once it answers; used by docker-compose."""

import time

import httpx
from django.core.management.base import BaseCommand, CommandError

from serving.choices import PoolKind
from serving.models import Gpu, ServedModel
from serving.services import pool_ensure, replica_register


class Command(BaseCommand):
    help = "Register (or update) a vLLM replica by name, waiting until its /health answers."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("base_url", help="e.g. http://vllm:8000 (without /v1)")
        parser.add_argument("--model", required=True, help="the served model's name")
        parser.add_argument("--pool", default="shared")
        parser.add_argument("--pool-kind", default=PoolKind.SHARED, choices=PoolKind.values)
        parser.add_argument("--gpu", action="append", default=[], help="a GPU serial (repeat)")
        parser.add_argument("--wait", type=float, default=600, help="seconds to wait for /health")

    def handle(self, *args, name, base_url, model, pool, pool_kind, gpu, wait, **options):
        gpus = list(Gpu.objects.filter(serial__in=gpu))
        missing = set(gpu) - {g.serial for g in gpus}
        if missing:
            raise CommandError(f"--gpu: no GPU with serial {', '.join(sorted(missing))}")
        deadline = time.monotonic() + wait
        while True:
            try:
                answered = httpx.get(f"{base_url.rstrip('/')}/health", timeout=5).status_code
            except httpx.HTTPError:
                answered = None  # not up yet: ask again
            if answered == 200:
                break
            if time.monotonic() > deadline:
                raise CommandError(f"{base_url}/health did not answer within {wait:.0f} s")
            time.sleep(2)
        served, _ = ServedModel.objects.get_or_create(name=model)
        replica = replica_register(
            name=name,
            base_url=base_url.rstrip("/"),
            model=served,
            pool=pool_ensure(name=pool, kind=pool_kind),
            gpus=gpus,
        )
        self.stdout.write(f"replica {replica.name} up in pool {pool}: {replica.base_url}")
