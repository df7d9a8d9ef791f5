"""Register an inference server the platform did not start (a container,
another host; vLLM or another engine) as a replica in a pool, once it
answers; used by docker-compose."""

import time

import httpx
from django.core.management.base import BaseCommand, CommandError

from core.commands import refusals_as_command_errors
from serving.choices import Engine, PoolKind
from serving.engines import engine_spec
from serving.models import Gpu, ServedModel
from serving.services import pool_ensure, replica_register


class Command(BaseCommand):
    help = "Register (or update) a replica by name, waiting until its engine says it is ready."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("base_url", help="e.g. http://vllm:8000 (without /v1)")
        parser.add_argument("--model", required=True, help="the served model's name")
        parser.add_argument("--pool", default="shared")
        parser.add_argument("--pool-kind", default=PoolKind.SHARED, choices=PoolKind.values)
        parser.add_argument("--gpu", action="append", default=[], help="a GPU serial (repeat)")
        parser.add_argument("--engine", default=Engine.VLLM, choices=Engine.values)
        parser.add_argument("--wait", type=float, default=600, help="seconds to wait for /health")

    def handle(self, *args, name, base_url, model, pool, pool_kind, gpu, wait, engine, **options):
        gpus = list(Gpu.objects.filter(serial__in=gpu))
        missing = set(gpu) - {g.serial for g in gpus}
        if missing:
            raise CommandError(f"--gpu: no GPU with serial {', '.join(sorted(missing))}")
        ready_url = base_url.rstrip("/") + engine_spec(engine).health_path
        deadline = time.monotonic() + wait
        while True:
            try:
                answered = httpx.get(ready_url, timeout=5).status_code
            except httpx.HTTPError:
                answered = None  # not up yet: ask again
            if answered == 200:
                break
            if time.monotonic() > deadline:
                raise CommandError(f"{ready_url} did not answer within {wait:.0f} s")
            time.sleep(2)
        served, _ = ServedModel.objects.get_or_create(name=model)
        # The replica's role is both; an existing disaggregated pool refuses it.
        with refusals_as_command_errors(options={"role": "--pool"}):
            replica = replica_register(
                name=name,
                base_url=base_url.rstrip("/"),
                model=served,
                pool=pool_ensure(name=pool, kind=pool_kind),
                gpus=gpus,
                engine=engine,
            )
        self.stdout.write(
            f"replica {replica.name} ({replica.get_engine_display()}) up in pool {pool}: "
            f"{replica.base_url}"
        )
