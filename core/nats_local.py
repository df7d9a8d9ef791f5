"""A NATS JetStream cluster of real `nats-server` processes on loopback:
what the tests, the scale bench and a developer's scaled stack run the
usage log on (production runs NATS as a StatefulSet, deploy/k8s/scale).

Each node is its own process with its own client, cluster and monitoring
ports and its own store directory; the nodes route to each other in a
`cluster {}` block, so a stream with three replicas keeps a majority
through the loss of any one node. A node is stopped or killed by its own
process id, and started again on its old store (it catches up from the
leader)."""

from __future__ import annotations

import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from core.processes import ManagedProcess, ProcessFailed, free_port, url_answers

CLUSTER_NAME = "gpu-ledger"


def nats_server_binary() -> str | None:
    return shutil.which("nats-server") or (
        "/usr/sbin/nats-server" if os.path.exists("/usr/sbin/nats-server") else None
    )


@dataclass
class NatsNode:
    name: str
    client_port: int
    cluster_port: int
    monitor_port: int
    store: Path
    config: Path
    process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.client_port}"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    def jetstream_ready(self) -> bool:
        """The node serves and its JetStream has caught up with the meta group."""
        return url_answers(f"http://127.0.0.1:{self.monitor_port}/healthz", timeout=1)


@dataclass
class NatsCluster:
    root: Path
    size: int = 3
    nodes: list[NatsNode] = field(default_factory=list)

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    @property
    def url(self) -> str:
        """Every node, comma-separated: the USAGE_LOG_URL a client is given."""
        return ",".join(self.urls)

    def start(self, *, timeout: float = 30) -> NatsCluster:
        binary = nats_server_binary()
        if binary is None:
            raise ProcessFailed("nats-server is not installed (Debian's package: nats-server)")
        self.root.mkdir(parents=True, exist_ok=True)
        ports = [(free_port(), free_port(), free_port()) for _ in range(self.size)]
        routes = ", ".join(f"nats-route://127.0.0.1:{cluster}" for _, cluster, _ in ports)
        for n, (client, cluster, monitor) in enumerate(ports, start=1):
            name = f"n{n}"
            store = self.root / name
            config = self.root / f"{name}.conf"
            config.write_text(
                f"server_name: {name}\n"
                f"listen: 127.0.0.1:{client}\n"
                f"http: 127.0.0.1:{monitor}\n"
                f"jetstream {{ store_dir: {str(store)!r}, max_memory_store: 64MB, "
                f"max_file_store: 4GB }}\n"
                f"cluster {{ name: {CLUSTER_NAME}, listen: 127.0.0.1:{cluster}, "
                f"routes: [{routes}] }}\n"
            )
            node = NatsNode(name, client, cluster, monitor, store, config)
            node.process = ManagedProcess(
                name=f"nats-{name}",
                argv=[binary, "-c", str(config)],
                log_path=self.root / f"{name}.log",
            )
            self.nodes.append(node)
        for node in self.nodes:
            node.process.start()
        self.wait_ready(timeout=timeout)
        return self

    def wait_ready(self, *, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            if not node.alive:
                continue
            while not node.jetstream_ready():
                if node.process.returncode is not None:
                    raise ProcessFailed(node.process.exit_report(while_doing="while starting"))
                if time.monotonic() > deadline:
                    raise ProcessFailed(
                        f"nats {node.name} not ready after {timeout:.0f}s; see "
                        f"{node.process.log_path}"
                    )
                time.sleep(0.1)

    def node(self, name: str) -> NatsNode:
        return next(node for node in self.nodes if node.name == name)

    def kill(self, name: str) -> None:
        """SIGKILL one node (its store stays, as a crashed machine's disk)."""
        node = self.node(name)
        os.kill(node.process.pid, signal.SIGKILL)
        node.process.popen.wait(timeout=10)

    def restart(self, *names: str, timeout: float = 30) -> None:
        """Start stopped or killed nodes again on their own stores (all of
        them first, then wait: one node alone never finds a meta leader)."""
        nodes = [self.node(name) for name in names]
        for node in nodes:
            node.process.start()
        deadline = time.monotonic() + timeout
        for node in nodes:
            while not node.jetstream_ready():
                if node.process.returncode is not None:
                    raise ProcessFailed(node.process.exit_report(while_doing="while restarting"))
                if time.monotonic() > deadline:
                    raise ProcessFailed(f"nats {node.name} not back after {timeout:.0f}s")
                time.sleep(0.1)

    def stop(self) -> None:
        for node in self.nodes:
            if node.process is not None:
                node.process.stop(timeout=10)
