"""NVIDIA Dynamo 1.6.1 on this machine, for development, tests and
benchmarks: its OpenAI-compatible frontend and its GPU-free mocker workers
(simulated vLLM-, SGLang- and TensorRT-LLM-style engines, aggregated or
disaggregated prefill/decode), in their own virtualenv (DYNAMO_VENV),
serving the project's tiny model's tokenizer, started on loopback and
stopped by process id. Every figure from it is simulated.

    dynamo_installed() -> bool       the virtualenv is complete (its marker)
    dynamo_install(progress=...)     create it (about a minute, 700 MB)
    dynamo_python() -> Path          its python
    WorkerGroup(engine_type, mode, count, speedup_ratio,
                max_num_seqs, kv_transfer_bandwidth)
                                     one mocker process serving `count` workers
    dynamo_start(name=, model_dir=, served_model=, workers=[...],
                 port=None, router_mode=None) -> DynamoDeployment
        .base_url, .pids, .wait_ready(timeout=), .stop(),
        .workers_found() -> {component: [worker id]}  (the ids nvext.worker_id names)
    listening_sockets(pids) -> [(address, port)]
                                     what those processes listen on (TCP)

Install quirks: `ai-dynamo` requires `aisimulate`, a stub that downloads
from an index this machine cannot reach, so `ai-dynamo` goes in last, with
--no-deps, after its other requirements (the mocker's own timing model
needs no aisimulate).
A marker file written last says the install finished; without it the
virtualenv is recreated.

No etcd and no NATS: discovery is a folder (DYN_FILE_KV, one per
deployment, removed by stop()), requests and responses go over TCP on
127.0.0.1, and events over ZMQ through a small XSUB/XPUB broker on
loopback (serving/dynamo_broker.py, run by the virtualenv's python):
without the broker the mocker's publishers bind 0.0.0.0."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

from core.processes import ManagedProcess, ProcessFailed, free_port
from serving.engines import workers_listed
from serving.launcher import venv_prepare

Progress = Callable[[str], None]

DYNAMO_VERSION = "1.6.1"
# ai-dynamo's runtime requirements less aisimulate (see the docstring).
DYNAMO_REQUIREMENTS = [
    "aiohttp>=3.14.3,<4",
    "certifi>=2026.10.19",
    "kubernetes>=32.0.1,<33",
    "msgspec>=0.19",
    "prometheus-client>=0.23.1,<1",
    "pyzmq>=26",
    "redis>=6.2,<9",
    "tqdm",
    "transformers>=4.56",
    "zstandard>=0.23,<1",
    "pyyaml",
]
INSTALLED_MARKER = ".gpu-ledger-dynamo"  # in the virtualenv; holds DYNAMO_VERSION

ENGINE_TYPES = ("vllm", "sglang", "trtllm")
MODES = ("agg", "prefill", "decode")
BROKER_SCRIPT = Path(__file__).with_name("dynamo_broker.py")


def dynamo_python() -> Path:
    return Path(settings.DYNAMO_VENV) / "bin" / "python"


def dynamo_installed() -> bool:
    """Whether DYNAMO_VENV holds a finished install of this version."""
    marker = Path(settings.DYNAMO_VENV) / INSTALLED_MARKER
    try:
        finished = marker.read_text().strip() == DYNAMO_VERSION
    except OSError:
        return False
    return finished and dynamo_python().exists()


def dynamo_install(*, progress: Progress) -> None:
    """Create the Dynamo virtualenv and install ai-dynamo (about a minute)."""
    venv = Path(settings.DYNAMO_VENV)
    action = venv_prepare(venv, setting="DYNAMO_VENV")
    log_path = settings.VAR_DIR / "log" / "dynamo-install.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    pip = [str(dynamo_python()), "-m", "pip", "install", "--disable-pip-version-check"]
    steps = [
        (f"{action} virtualenv {venv}", [sys.executable, "-m", "venv", "--clear", str(venv)]),
        (
            f"pip install ai-dynamo-runtime=={DYNAMO_VERSION} (log: {log_path})",
            [*pip, f"ai-dynamo-runtime=={DYNAMO_VERSION}"],
        ),
        ("pip install its requirements (all but aisimulate)", [*pip, *DYNAMO_REQUIREMENTS]),
        # Last, without its requirements: pip then checks none, and prints no
        # conflict over aisimulate.
        (
            f"pip install --no-deps ai-dynamo=={DYNAMO_VERSION}",
            [*pip, "--no-deps", "--no-warn-conflicts", f"ai-dynamo=={DYNAMO_VERSION}"],
        ),
    ]
    with log_path.open("ab") as log:
        for message, argv in steps:
            progress(message)
            subprocess.run(argv, check=True, stdout=log, stderr=subprocess.STDOUT)
    check = subprocess.run(
        [str(dynamo_python()), "-c", "import dynamo.frontend.main, dynamo.mocker.main, zmq"],
        capture_output=True,
        timeout=300,
    )
    if check.returncode != 0:
        raise RuntimeError(f"Dynamo installed but does not import; see {log_path}")
    (venv / INSTALLED_MARKER).write_text(DYNAMO_VERSION + "\n")


@dataclass(frozen=True)
class WorkerGroup:
    """One mocker process serving `count` simulated workers alike: the
    engine it imitates (vllm, sglang, trtllm), aggregated or one side of a
    disaggregated pair (agg, prefill, decode), how much faster than the
    real engine's timing it runs (1 = real time), and optionally its batch
    limit and the KV transfer bandwidth (GB/s) between prefill and decode."""

    engine_type: str = "vllm"
    mode: str = "agg"
    count: int = 1
    speedup_ratio: float = 1.0
    max_num_seqs: int | None = None
    kv_transfer_bandwidth: float | None = None

    def __post_init__(self) -> None:
        if self.engine_type not in ENGINE_TYPES:
            raise ValueError(f"engine_type {self.engine_type!r}: one of {ENGINE_TYPES}")
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r}: one of {MODES}")
        if self.count < 1:
            raise ValueError("count: at least 1")

    def argv(self, *, model_dir: Path, served_model: str) -> list[str]:
        return [
            str(dynamo_python()),
            "-m",
            "dynamo.mocker",
            "--model-path",
            str(model_dir),
            "--model-name",
            served_model,
            *PLANES,
            "--speedup-ratio",
            str(self.speedup_ratio),
            "--num-workers",
            str(self.count),
            "--engine-type",
            self.engine_type,
            "--disaggregation-mode",
            self.mode,
            *(["--max-num-seqs", str(self.max_num_seqs)] if self.max_num_seqs else []),
            *(
                ["--kv-transfer-bandwidth", str(self.kv_transfer_bandwidth)]
                if self.kv_transfer_bandwidth is not None
                else []
            ),
        ]


# Discovery in a folder, requests over TCP, events over ZMQ: no etcd, no NATS.
PLANES = (
    "--discovery-backend",
    "file",
    "--request-plane",
    "tcp",
    "--event-plane",
    "zmq",
)


@dataclass
class DynamoDeployment:
    """A running frontend on 127.0.0.1:`port` with its broker and mocker
    processes (each in its own session), and the discovery folder they share."""

    name: str
    port: int
    served_model: str
    workers: list[WorkerGroup]
    discovery_dir: Path
    processes: list[ManagedProcess] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes if p.pid is not None]

    def wait_ready(self, *, timeout: float) -> None:
        """Until the frontend lists the model and has found every worker of
        every group (the listing alone does not say that every worker,
        prefill ones included, was found); ProcessFailed at once if a
        process exits, with the end of its log."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for process in self.processes:
                if process.returncode is not None:
                    raise ProcessFailed(process.exit_report(while_doing="while starting"))
            found = {c: len(ids) for c, ids in self.workers_found().items()}
            if found == self.workers_expected() and self._model_listed():
                return
            time.sleep(0.5)
        raise ProcessFailed(
            f"Dynamo {self.name} not ready after {timeout:.0f}s (workers expected "
            f"{self.workers_expected()}, found {self.workers_found()}); see its logs "
            + ", ".join(str(p.log_path) for p in self.processes)
        )

    def workers_expected(self) -> dict[str, int]:
        """Workers per Dynamo component: prefill workers serve `prefill`,
        aggregated and decode workers `backend` (the mocker's endpoints)."""
        expected: dict[str, int] = {}
        for group in self.workers:
            component = "prefill" if group.mode == "prefill" else "backend"
            expected[component] = expected.get(component, 0) + group.count
        return expected

    def workers_found(self) -> dict[str, list[str]]:
        """The ids of the workers the frontend has found, per component, as
        its /health lists them (serving.engines.workers_listed): the ids an
        answer's nvext.worker_id names."""
        found: dict[str, list[str]] = {}
        for worker in workers_listed(self._get_json("/health") or {}):
            found.setdefault(worker.component, []).append(worker.instance)
        return found

    def _model_listed(self) -> bool:
        listed = self._get_json("/v1/models") or {}
        return any(m.get("id") == self.served_model for m in listed.get("data", []))

    def _get_json(self, path: str) -> dict | None:
        try:
            with urllib.request.urlopen(f"{self.base_url}{path}", timeout=2) as answer:  # noqa: S310 (loopback)
                body = json.loads(answer.read())
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, ValueError):
            return None
        return body if isinstance(body, dict) else None

    def stop(self, *, timeout: float = 15) -> None:
        """Stop the whole deployment: the workers at once (SIGKILL: a worker
        that ends gracefully removes its discovery entries, and Dynamo
        1.6.1's frontend logs an ERROR, "Failed to send file watch event",
        for each; the deployment goes whole, so nothing needs them
        removed), then the frontend and the broker (SIGTERM, SIGKILL what
        lingers; on SIGTERM or SIGINT alike the frontend logs one ERROR of
        its own shutdown, "monitor_instance_source: The Sender is dropped"),
        then the discovery folder. Safe to call twice."""
        running = [p for p in reversed(self.processes) if p.popen and p.returncode is None]
        workers = [p for p in running if p.name.rsplit("-", 1)[-1] not in ("frontend", "broker")]
        self._terminated(workers, timeout=timeout, sig=signal.SIGKILL)
        self._terminated([p for p in running if p not in workers], timeout=timeout)
        shutil.rmtree(self.discovery_dir, ignore_errors=True)

    @staticmethod
    def _terminated(
        processes: list[ManagedProcess], *, timeout: float, sig: int = signal.SIGTERM
    ) -> None:
        """`sig` to each process group at once, SIGKILL what lingers past
        `timeout`, and whatever a leader left behind in its group."""
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
        deadline = time.monotonic() + timeout
        for process in processes:
            try:
                process.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.popen.wait(timeout=5)
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)


def dynamo_start(
    *,
    name: str,
    model_dir: Path,
    served_model: str,
    workers: list[WorkerGroup],
    port: int | None = None,
    router_mode: str | None = None,
) -> DynamoDeployment:
    """Start the broker, the frontend and one mocker process per group
    (not yet ready: call wait_ready). `router_mode` is the frontend's
    --router-mode (round-robin, kv, ...); None leaves Dynamo's default."""
    if not workers:
        raise ValueError("a deployment needs at least one worker group")
    # The frontend keeps the first model card of each kind of worker and
    # rejects workers whose card differs (each engine type has its own KV
    # block size), while still listing them in /health.
    engine_types = {(g.mode, g.engine_type) for g in workers}
    for mode in MODES:
        alike = sorted(engine for m, engine in engine_types if m == mode)
        if len(alike) > 1:
            raise ValueError(
                f"{mode} workers of one deployment imitate one engine type, not {alike}: "
                "Dynamo's frontend would serve with the first and reject the others"
            )
    root = settings.VAR_DIR / "dynamo"
    root.mkdir(parents=True, exist_ok=True)
    discovery_dir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root))
    xsub, xpub = free_port(), free_port()
    while xpub == xsub:
        xpub = free_port()
    deployment = DynamoDeployment(
        name=name,
        port=port or free_port(),
        served_model=served_model,
        workers=list(workers),
        discovery_dir=discovery_dir,
    )
    env = {
        "DYN_FILE_KV": str(discovery_dir),
        "DYN_TCP_RPC_HOST": "127.0.0.1",
        "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
        "DYN_SYSTEM_HOST": "127.0.0.1",
        "DYN_LOG": "warn",
        # Model cards in the discovery folder, as without a system port it
        # does anyway (the setting only silences a warning saying so).
        "DYN_SELF_HOST_METADATA": "0",
        "DYN_ZMQ_BROKER_URL": f"xsub=tcp://127.0.0.1:{xsub} , xpub=tcp://127.0.0.1:{xpub}",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    python = str(dynamo_python())
    parts: list[tuple[str, list[str]]] = [
        ("broker", [python, "-I", str(BROKER_SCRIPT), str(xsub), str(xpub)]),
        (
            "frontend",
            [
                python,
                "-m",
                "dynamo.frontend",
                "--http-host",
                "127.0.0.1",
                "--http-port",
                str(deployment.port),
                *PLANES,
                *(["--router-mode", router_mode] if router_mode else []),
            ],
        ),
    ]
    parts += [
        (
            f"{group.mode}{index}",
            group.argv(model_dir=model_dir, served_model=served_model),
        )
        for index, group in enumerate(workers)
    ]
    log_dir = settings.VAR_DIR / "log"
    try:
        for part, argv in parts:
            process = ManagedProcess(
                name=f"dynamo-{name}-{part}",
                argv=argv,
                env=env,
                log_path=log_dir / f"dynamo-{name}-{part}.log",
            )
            process.start()
            deployment.processes.append(process)
    except BaseException:
        deployment.stop()
        raise
    return deployment


def listening_sockets(pids: Iterable[int]) -> list[tuple[str, int]]:
    """The TCP sockets (address, port) listened on by the processes `pids`
    and every process in the sessions they lead (a process started in its
    own session and what it spawned), from /proc; sorted, without repeats."""
    leaders = set(pids)
    members = {pid for pid in leaders if Path(f"/proc/{pid}").exists()}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                # Fields after the command (which may hold spaces): state, ppid, pgrp, session.
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(stat[3]) in leaders:
                    members.add(int(entry.name))
    inodes: set[str] = set()
    tables: set[Path] = set()
    for pid in members:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:["):
                        inodes.add(target[len("socket:[") : -1])
            # The tables of the process's own network namespace.
            tables |= {Path(f"/proc/{pid}/net/tcp"), Path(f"/proc/{pid}/net/tcp6")}
    found: set[tuple[str, int]] = set()
    for table in tables:
        with contextlib.suppress(OSError):
            for line in table.read_text().splitlines()[1:]:
                columns = line.split()
                local, state, inode = columns[1], columns[3], columns[9]
                if state == "0A" and inode in inodes:  # 0A: LISTEN
                    found.add(_address(local))
    return sorted(found)


def _address(local: str) -> tuple[str, int]:
    """/proc/net/tcp's hex address:port (the address in 32-bit words, each
    in the machine's byte order) as (address, port)."""
    hex_address, hex_port = local.split(":")
    raw = bytes.fromhex(hex_address)
    words = b"".join(
        int.from_bytes(raw[i : i + 4], sys.byteorder).to_bytes(4, "big")
        for i in range(0, len(raw), 4)
    )
    return str(ipaddress.ip_address(words)), int(hex_port, 16)
