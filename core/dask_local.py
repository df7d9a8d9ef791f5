"""A Dask distributed cluster of real processes on loopback: a scheduler
and workers started with the `dask` CLI's own modules, each its own
process (stopped or killed by its process id). What the tests and the
scale bench run the scaled path's hour jobs on; production runs the
scheduler and workers as Deployments (deploy/k8s/scale)."""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from core.processes import ManagedProcess, ProcessFailed, free_port

PRELOAD = "metering.log.dask_preload"


@dataclass
class DaskCluster:
    root: Path
    workers: int = 2
    env: dict[str, str] = field(default_factory=dict)
    scheduler: ManagedProcess | None = None
    worker_processes: list[ManagedProcess] = field(default_factory=list)
    port: int = 0

    @property
    def address(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def start(self, *, timeout: float = 60) -> DaskCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.scheduler = ManagedProcess(
            name="dask-scheduler",
            argv=[
                sys.executable,
                "-m",
                "distributed.cli.dask_scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--no-dashboard",
                # It unpickles the task graphs: their arguments are the project's.
                "--preload",
                PRELOAD,
            ],
            env=self.env,
            log_path=self.root / "scheduler.log",
        )
        self.scheduler.start()
        for n in range(self.workers):
            self.worker_processes.append(self._worker(n))
        for worker in self.worker_processes:
            worker.start()
        self.wait_for_workers(self.workers, timeout=timeout)
        return self

    def _worker(self, n: int) -> ManagedProcess:
        return ManagedProcess(
            name=f"dask-worker-{n}",
            argv=[
                sys.executable,
                "-m",
                "distributed.cli.dask_worker",
                self.address,
                "--host",
                "127.0.0.1",
                "--nworkers",
                "1",
                "--nthreads",
                "1",
                "--no-dashboard",
                "--no-nanny",
                "--name",
                f"w{n}",
                "--preload",
                PRELOAD,
            ],
            env=self.env,
            log_path=self.root / f"worker-{n}.log",
        )

    def wait_for_workers(self, n: int, *, timeout: float = 60) -> None:
        from distributed import Client

        deadline = time.monotonic() + timeout
        while True:
            if self.scheduler.returncode is not None:
                raise ProcessFailed(self.scheduler.exit_report(while_doing="while starting"))
            try:
                with Client(self.address, timeout=5) as client:
                    client.wait_for_workers(n, timeout=max(1, deadline - time.monotonic()))
                    return
            except (OSError, TimeoutError) as exc:
                if time.monotonic() > deadline:
                    raise ProcessFailed(
                        f"dask: {n} workers not ready after {timeout:.0f}s ({exc}); see {self.root}"
                    ) from exc
                time.sleep(0.5)

    def kill_worker(self, n: int) -> None:
        worker = self.worker_processes[n]
        os.kill(worker.pid, signal.SIGKILL)
        worker.popen.wait(timeout=10)

    def stop(self) -> None:
        for worker in self.worker_processes:
            worker.stop(timeout=10)
        if self.scheduler is not None:
            self.scheduler.stop(timeout=10)
