"""The pieces of the main job beyond the web server: local vLLM replicas in
the demo pools, the gateway, a Celery worker and beat, the demo workload,
and the pipeline that turns it into attributed usage, allocated cost,
draft invoices and a month-to-date margin report."""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.utils import timezone

from core.calendar import day_start, month_start
from core.processes import ManagedProcess, ProcessFailed, free_port

GATEWAY_PORT = 8080
GATEWAY_OPERATOR_PORT = 9090  # the gateway's /metrics and detailed /healthz (loopback)


class WorkloadFailed(RuntimeError):
    """The demo workload got not one answer through the gateway."""


def vllm_replicas_start(*, pools: dict, progress, embedder=None) -> list:
    """One local replica of the tiny model per demo pool, registered into
    it on the pool's demo GPUs, and the embedding replica (tiny-embed) where
    `embedder` places it; returns the started replicas."""
    from serving.local_replicas import Placement, replicas_launch

    placements = [
        Placement(name=seeded.replica.name, port=free_port(), pool=seeded.pool, gpus=seeded.gpus)
        for seeded in pools.values()
    ]
    if embedder is not None:
        placements.append(
            Placement(
                name=embedder.replica.name,
                port=free_port(),
                pool=embedder.pool,
                gpus=embedder.gpus,
                embed=True,
            )
        )
    return replicas_launch(placements=placements, progress=progress)


def dynamo_demo_start(*, progress):
    """NVIDIA Dynamo serving the tiny model in the demo's Dynamo pool: its
    frontend and two mocker workers (a disaggregated prefill and decode
    pair, simulated GPUs), installed on first use; returns the deployment
    (stopped by the caller) and the workers registered."""
    from demo.seeds.fleet import dynamo_demo_seed, dynamo_workers_place
    from serving.dynamo import WorkerGroup, dynamo_install, dynamo_installed, dynamo_start
    from serving.tiny_model import MODEL_NAME, tiny_model_write

    if not dynamo_installed():
        progress("installing NVIDIA Dynamo (its own virtualenv, about a minute)")
        dynamo_install(progress=progress)
    model_dir = tiny_model_write(directory=settings.VAR_DIR / "models" / MODEL_NAME)
    deployment = dynamo_start(
        name="demo",
        model_dir=model_dir,
        served_model=MODEL_NAME,
        workers=[WorkerGroup(mode="prefill"), WorkerGroup(mode="decode")],
    )
    try:
        deployment.wait_ready(timeout=120)
        workers = dynamo_workers_place(dynamo_demo_seed(base_url=deployment.base_url))
    except BaseException:
        deployment.stop()
        raise
    return deployment, workers


def services_start(
    *,
    log_dir: Path,
    processes: list[ManagedProcess],
    gateway_port: int = GATEWAY_PORT,
    gateway_operator_port: int = GATEWAY_OPERATOR_PORT,
) -> None:
    """The gateway, a Celery worker, the webhook deliveries' worker and
    Celery beat, each its own process,
    added to `processes` before it starts (so the caller stops whatever
    started, even when the gateway then fails its readiness check). The
    gateway is ready when its operator port's /healthz answers 200 (every
    worker started) with its instance token."""
    python = sys.executable
    gateway_argv = [python, "manage.py", "gateway", "--port", str(gateway_port)]
    gateway_argv += ["--operator-host", "127.0.0.1", "--operator-port", str(gateway_operator_port)]
    started = [
        ManagedProcess(
            name="gateway",
            argv=gateway_argv,
            log_path=log_dir / "gateway.log",
            ready_url=f"http://127.0.0.1:{gateway_operator_port}/healthz",
            ready_echoes_instance=True,
        ),
        ManagedProcess(
            name="worker",
            argv=[python, "-m", "celery", "-A", "config", "worker", "--pool=solo", "-l", "INFO"],
            log_path=log_dir / "worker.log",
        ),
        # Deliveries on their own queue (settings.WEBHOOKS_QUEUE): threads, as
        # an attempt mostly waits on a tenant's endpoint.
        ManagedProcess(
            name="webhooks-worker",
            argv=[
                python,
                "-m",
                "celery",
                "-A",
                "config",
                "worker",
                "-Q",
                settings.WEBHOOKS_QUEUE,
                "-n",
                "webhooks@%h",
                "--pool=threads",
                "--concurrency=4",
                "-l",
                "INFO",
            ],
            log_path=log_dir / "webhooks-worker.log",
        ),
        ManagedProcess(
            name="beat",
            argv=[python, "-m", "celery", "-A", "config", "beat", "-l", "INFO"],
            log_path=log_dir / "beat.log",
        ),
    ]
    for process in started:
        processes.append(process)
        process.start()
    started[0].wait_ready(timeout=60)
    for process in started[1:]:
        if process.returncode is not None:
            raise ProcessFailed(process.exit_report(while_doing="while starting"))


def workload(*, gateway_url: str, operator_url: str, seconds: float):
    """The demo workload's result (serving.workload.WorkloadResult); raises
    WorkloadFailed when not one request succeeded, with how many were
    refused or failed and the first error. `operator_url`: the gateway's
    operator listener (its detailed /healthz)."""
    from serving.tiny_model import MODEL_NAME
    from serving.workload import workload_run

    keys = json.loads(Path(settings.DEMO_KEYS_FILE).read_text())
    gateway_fleet_seen(operator_url)
    result = workload_run(gateway_url=gateway_url, keys=keys, model=MODEL_NAME, seconds=seconds)
    if result.total("ok") == 0:
        raise WorkloadFailed(
            f"no request through the gateway at {gateway_url} succeeded: "
            f"{result.total('refused')} refused, {result.total('failed')} failed; "
            f"first error: {result.first_error or 'none (no request was sent)'}"
        )
    return result


def gateway_fleet_seen(operator_url: str, *, timeout: float = 30) -> None:
    """Until every worker of the gateway routes to a replica (each reads
    the fleet again as one is registered: core.changes). Whatever answers
    there that is not a gateway is left for the workload to report."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            workers = httpx.get(f"{operator_url}/healthz", timeout=5).json()["workers"]
            if all(w["replicas"] > 0 for w in workers):
                return
        except (httpx.HTTPError, ValueError, LookupError, TypeError):
            return
        time.sleep(0.2)


def records_flushed(operator_url: str, *, timeout: float = 30) -> None:
    """Until no worker of the gateway holds an unwritten usage record."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        workers = httpx.get(f"{operator_url}/healthz", timeout=5).json()["workers"]
        if all(w["record_backlog"] == 0 for w in workers):
            return
        time.sleep(0.2)


def pipeline_run() -> dict:
    """Attribute and roll up what the workload left, allocate today's cost,
    draft this period's invoices, compute the month-to-date margins and
    plan (every pool's and model's demand forecast), and re-rate the closed
    periods' finalized invoices (the reproduction check); with the seconds
    each stage took."""
    from billing.choices import ReportKind
    from billing.costs.runs import allocation_run_create, allocation_run_execute
    from billing.invoicing.reproduction import reproduction_check
    from billing.invoicing.runs import invoice_run_create, invoice_run_execute
    from billing.reports.margin_reports import margin_report_build, margin_report_request
    from metering.jobs import metering_run
    from planning.runs import plan_run_create, plan_run_execute

    seconds: dict[str, float] = {}  # ok-float: timings

    def timed(stage: str, work):
        started = time.perf_counter()
        result = work()
        seconds[stage] = time.perf_counter() - started
        return result

    now = timezone.now()
    grace = timedelta(seconds=settings.METERING["ATTRIBUTION_GRACE_SECONDS"])
    metered = timed("attribution", lambda: metering_run(now=now + grace + timedelta(hours=1)))
    next_hour = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    # Today's hours so far (a run stops at the current hour); just after
    # midnight, yesterday's.
    first = day_start(now - timedelta(hours=1))
    allocation = timed(
        "allocation",
        lambda: allocation_run_execute(run_id=allocation_run_create(start=first, end=next_hour).pk),
    )
    drafts = timed(
        "invoices",
        lambda: invoice_run_execute(
            run_id=invoice_run_create(as_of=now, finalize=False).pk, current_period=True
        ),
    )
    report = timed(
        "margins",
        lambda: margin_report_build(
            report_id=margin_report_request(
                kind=ReportKind.MONTH_TO_DATE, start=month_start(now), end=next_hour
            ).pk
        ),
    )
    plan = timed("plan", lambda: plan_run_execute(run_id=plan_run_create(as_of=now).pk))
    # The history's finalized invoices, re-rated: what was billed (invariant 9).
    reproduced = timed("reproduction", reproduction_check)
    from metering.models import UsageEvent

    example = (
        UsageEvent.objects.filter(status="ok", synthetic=False)
        .select_related("tenant")
        .order_by("-received_at")
        .first()
    )
    return {
        "example": example,
        "windows": metered.windows,
        "allocation": allocation.status,
        "drafts": drafts.invoices_created,
        "margin": report.totals,
        "plan": plan,
        "reproduction": reproduced,
        "seconds": seconds,
    }
