"""A Redis Cluster of real `redis-server` processes on loopback: three
masters, each with a replica, made into a cluster with `redis-cli
--cluster create`. What the tests and benches run the gateway's limits
and spend accounts on when they are about a cluster; production runs
Redis Cluster as a StatefulSet (deploy/k8s/scale). A node is killed by
its own process id; its replica is promoted after `node_timeout_ms`."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from core.processes import ManagedProcess, ProcessFailed, free_port


def redis_server_binary() -> str | None:
    return shutil.which("redis-server")


@dataclass
class RedisClusterLocal:
    root: Path
    masters: int = 3
    node_timeout_ms: int = 2000
    ports: list[int] = field(default_factory=list)
    processes: dict[int, ManagedProcess] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """The cluster's URL as LIMITS_REDIS_URL takes it: every seed node."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def start(self, *, timeout: float = 60) -> RedisClusterLocal:
        binary = redis_server_binary()
        if binary is None or shutil.which("redis-cli") is None:
            raise ProcessFailed("redis-server and redis-cli are not installed (Debian: redis)")
        self.root.mkdir(parents=True, exist_ok=True)
        self.ports = [free_port() for _ in range(self.masters * 2)]
        for port in self.ports:
            directory = self.root / str(port)
            directory.mkdir(exist_ok=True)
            self.processes[port] = ManagedProcess(
                name=f"redis-{port}",
                argv=[
                    binary,
                    "--port", str(port),
                    "--bind", "127.0.0.1",
                    "--cluster-enabled", "yes",
                    # Its bus port chosen too: port + 10000 may be taken.
                    "--cluster-port", str(free_port()),
                    "--cluster-config-file", str(directory / "nodes.conf"),
                    "--cluster-node-timeout", str(self.node_timeout_ms),
                    "--dir", str(directory),
                    "--appendonly", "yes",
                    "--save", "",
                    "--protected-mode", "no",
                ],
                log_path=self.root / f"redis-{port}.log",
            )  # fmt: skip
            self.processes[port].start()
        for port in self.ports:
            self._wait_answers(port, timeout=timeout)
        create = subprocess.run(
            [
                "redis-cli", "--cluster", "create",
                *(f"127.0.0.1:{p}" for p in self.ports),
                "--cluster-replicas", "1", "--cluster-yes",
            ],
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        if create.returncode != 0:
            raise ProcessFailed(f"redis cluster create failed: {create.stdout}{create.stderr}")
        self.wait_ok(timeout=timeout)
        return self

    def _cli(self, port: int, *args: str) -> str:
        return subprocess.run(
            ["redis-cli", "-p", str(port), *args], capture_output=True, text=True, timeout=10
        ).stdout

    def _wait_answers(self, port: int, *, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while "PONG" not in self._cli(port, "PING"):
            if self.processes[port].returncode is not None:
                raise ProcessFailed(self.processes[port].exit_report(while_doing="while starting"))
            if time.monotonic() > deadline:
                raise ProcessFailed(f"redis {port} not answering after {timeout:.0f}s")
            time.sleep(0.1)

    def wait_ok(self, *, timeout: float = 60) -> None:
        """Until every live node says the cluster is ok (all slots served)."""
        deadline = time.monotonic() + timeout
        for port in self.ports:
            if self.processes[port].returncode is not None:
                continue
            while "cluster_state:ok" not in self._cli(port, "CLUSTER", "INFO"):
                if time.monotonic() > deadline:
                    raise ProcessFailed(f"redis cluster not ok after {timeout:.0f}s")
                time.sleep(0.2)

    def master_of(self, key: str) -> int:
        """The port of the master serving `key`'s slot now."""
        from redis.crc import key_slot

        slot = key_slot(key.encode())
        for line in self._cli(self.live_port(), "CLUSTER", "NODES").splitlines():
            parts = line.split()
            if "master" not in parts[2] or "fail" in parts[2]:
                continue
            port = int(parts[1].split("@")[0].rsplit(":", 1)[1])
            for span in parts[8:]:
                low, _, high = span.partition("-")
                if low.isdigit() and int(low) <= slot <= int(high or low):
                    return port
        raise LookupError(f"no master serves slot {slot}")

    def live_port(self) -> int:
        return next(p for p in self.ports if self.processes[p].returncode is None)

    def kill(self, port: int) -> None:
        os.kill(self.processes[port].pid, signal.SIGKILL)
        self.processes[port].popen.wait(timeout=10)

    def stop(self) -> None:
        for process in self.processes.values():
            process.stop(timeout=10)
