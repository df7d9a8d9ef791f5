"""The scaled usage path's real parts for tests: a three-node NATS
JetStream cluster on loopback ports of the test's own (never the
machine's 4222), ledger writers as `manage.py usage_writer` processes,
and what the raw-event store holds, read as its readers read it."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings

from core.nats_local import NatsCluster, nats_server_binary
from core.processes import ManagedProcess, database_url_for_subprocess
from metering.log.stream import LogConfig
from tests.services import require

# What the ledger's path writes of a history (its raw rows and idempotency
# keys, and what is derived from them): emptied between one path's run and
# the other's in the tests that compare them.
LEDGER_TABLES = (
    "metering_requestshares",
    "metering_attributionshare",
    "metering_attributionwindow",
    "metering_usagerollup",
    "metering_replicaloadhour",
    "metering_dirtyhour",
    "metering_usageevent",
    "metering_usagekey",
)


def ledger_truncate() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(LEDGER_TABLES)}")


def log_env(cluster: NatsCluster, store: Path, **extra: str) -> dict[str, str]:
    """What a gateway and a writer are given for the scaled path."""
    return {
        "USAGE_LOG_URL": cluster.url,
        "USAGE_STORE_URL": str(store),
        "USAGE_LOG_PARTITIONS": "4",
        "USAGE_WRITER_LEASE_SECONDS": "3",
        "USAGE_WRITER_COMMIT_SECONDS": "0.5",
        "USAGE_WRITER_DEAD_LETTER_DIR": str(store.parent / "dead-letter"),
        **extra,
    }


def log_settings(cluster: NatsCluster, store: Path) -> dict:
    """settings.USAGE_LOG as a process given log_env has it."""
    return {
        **settings.USAGE_LOG,
        "URL": cluster.url,
        "STORE_URL": str(store),
        "PARTITIONS": 4,
        "LEASE_SECONDS": 3.0,
        "COMMIT_SECONDS": 0.5,
        "DEAD_LETTER_DIR": str(store.parent / "dead-letter"),
    }


def log_config(cluster: NatsCluster, store: Path) -> LogConfig:
    """The config a process given log_env reads."""
    return LogConfig.from_settings(log_settings(cluster, store))


@pytest.fixture
def nats_cluster(tmp_path):
    require(nats_server_binary() is not None, "nats-server is not installed (Debian: nats-server)")
    cluster = NatsCluster(tmp_path / "nats").start()
    yield cluster
    cluster.stop()


def start_writer(env: dict[str, str], name: str, log_dir: Path) -> ManagedProcess:
    writer = ManagedProcess(
        name=f"usage-writer-{name}",
        argv=[sys.executable, "manage.py", "usage_writer", "--id", name],
        env={
            "DATABASE_URL": database_url_for_subprocess(),
            "DJANGO_SETTINGS_MODULE": "config.settings.test",
            **env,
        },
        log_path=log_dir / f"usage-writer-{name}.log",
    )
    writer.start()
    return writer


def stream_info(config: LogConfig):
    """The stream's state as its leader reports it (None: not made yet)."""
    import nats
    from nats.js.errors import NotFoundError

    async def ask():
        nc = await nats.connect(servers=config.servers)
        try:
            return await nc.jetstream(timeout=10).stream_info(config.stream)
        except NotFoundError:
            return None
        finally:
            await nc.close()

    return asyncio.run(ask())


def wait_for_stream(config: LogConfig) -> None:
    """Until a writer has made the stream (a gateway only publishes)."""
    wait_for(
        lambda: (info := stream_info(config)) is not None and info.cluster.leader,
        timeout=60,
        what="the usage log's stream, with a leader",
    )


def wait_for(check, *, timeout: float, what: str, every: float = 0.3):
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"{what} not after {timeout:.0f} s"
        time.sleep(every)


def stored(store) -> dict[str, tuple[int, int]]:
    """request id -> (prompt, completion tokens) of every event the store holds."""
    events = store.events().to_pylist()
    return {e["request_id"]: (e["prompt_tokens"], e["completion_tokens"]) for e in events}


def spooled(gateway) -> int:
    """Records a gateway holds that the log has not acknowledged."""
    from tests.fleet import gateway_health

    return sum(w["record_backlog"] for w in gateway_health(gateway)["workers"])


class Steady:
    """Both tenants' clients sending one request after another through
    each gateway, from start() until stop(): what they saw answered."""

    def __init__(self, world, gateways) -> None:
        import threading

        from tests.traffic import Traffic

        self._stop = threading.Event()
        self.traffic = [
            Traffic(url, world.secrets[tenant], f"{tenant}@{n}")
            for tenant in ("a", "b")
            for n, url in enumerate(gateways)
        ]
        self._threads = []

    def start(self) -> Steady:
        self._threads = [t.run(self._stop) for t in self.traffic]
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)

    @property
    def answered(self) -> dict[str, tuple[int, int]]:
        found: dict[str, tuple[int, int]] = {}
        for t in self.traffic:
            found.update(t.answered)
        return found

    @property
    def failed(self) -> list:
        return [f for t in self.traffic for f in t.failed]


@pytest.fixture
def dask_cluster(tmp_path):
    from core.dask_local import DaskCluster

    cluster = DaskCluster(
        tmp_path / "dask", workers=2, env={"DJANGO_SETTINGS_MODULE": "config.settings.test"}
    ).start()
    yield cluster
    cluster.stop()


def history_records(world, n: int, *, seed: int, start, hours: int = 2) -> list:
    """`n` completed requests over `hours` from `start` on both replicas
    from both tenants, as a gateway records them: engine timings in whole
    milliseconds from a few values (so that requests tie in a window's
    split, which is where the order rows are taken in shows), some
    streamed, some cached, some aborted, a few rejected."""
    import random
    from datetime import timedelta
    from decimal import Decimal

    from serving.records import CompletedRequest

    rng = random.Random(seed)
    replicas = list(world.replicas.values())
    tenants = list(world.tenants.values())
    span_ms = hours * 3600 * 1000
    records = []
    for i in range(n):
        replica = replicas[i % len(replicas)]
        tenant = tenants[rng.randrange(len(tenants))]
        if i % 6 < 2:  # every third request on a replica a twin of the one before
            received = start + timedelta(milliseconds=rng.randrange(span_ms - 120_000))
            queue, ttft, generation = (rng.choice((0, 5, 20, 100)) for _ in range(3))
            generation = generation * 10 + rng.choice((40, 400, 4000))
            prompt = rng.choice((20, 200, 2000))
            delay = rng.choice((0, 1, 3))
        status = rng.choices(("ok", "aborted", "rejected"), weights=(90, 7, 3))[0]
        sent = received + timedelta(milliseconds=delay)
        ended = sent + timedelta(milliseconds=queue + ttft + generation + 1)
        served = status != "rejected"
        records.append(
            CompletedRequest(
                request_id=f"h{seed}-{i:07d}",
                tenant_id=tenant.id,
                api_key_id=None,
                model=world.model.name,
                received_at=received,
                ended_at=ended,
                status=status,
                http_status=200 if served else 429,
                replica_id=replica.id if served else None,
                pool_id=replica.pool_id if served else None,
                priority=rng.choice((0, 0, 1)),
                stream=rng.random() < 0.5,
                prompt_tokens=prompt if served else 0,
                cached_tokens=(prompt // 2 if i % 5 == 0 else 0) if served else 0,
                completion_tokens=(300 if prompt == 20 else 16) if served else 0,
                sent_at=sent if served else None,
                first_token_at=sent + timedelta(milliseconds=queue + ttft) if served else None,
                queue_ms=Decimal(queue) if served else None,
                ttft_ms=Decimal(ttft) if served else None,
                generation_ms=Decimal(generation) if served else None,
                timing="engine" if served else "gateway",
                # A platform refusal (the queue's) or the tenant's own limit:
                # SLO availability counts the first only.
                error=""
                if served
                else ("queue_timeout: no slot" if i % 2 else "rate_limited: rpm"),
            )
        )
    return records
