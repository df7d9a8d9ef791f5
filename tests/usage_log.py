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


def log_env(cluster: NatsCluster, store: Path, **extra: str) -> dict[str, str]:
    """What a gateway and a writer are given for the scaled path."""
    return {
        "USAGE_LOG_URL": cluster.url,
        "USAGE_STORE_URL": str(store),
        "USAGE_LOG_PARTITIONS": "4",
        "USAGE_WRITER_LEASE_SECONDS": "3",
        "USAGE_WRITER_COMMIT_SECONDS": "0.5",
        **extra,
    }


def log_config(cluster: NatsCluster, store: Path) -> LogConfig:
    """The config a process given log_env reads."""
    return LogConfig.from_settings(
        {
            **settings.USAGE_LOG,
            "URL": cluster.url,
            "STORE_URL": str(store),
            "PARTITIONS": 4,
            "LEASE_SECONDS": 3.0,
            "COMMIT_SECONDS": 0.5,
        }
    )


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
