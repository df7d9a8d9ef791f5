import signal
import sys

import uvicorn
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors import Multiprocess

from gateway.operator import OperatorRun, OperatorServer, operator_port_parse

# How the gateway's server runs (bench/bare_relay.py runs the same).
SERVER_OPTIONS = {
    "loop": "uvloop",
    "http": "httptools",
    "lifespan": "on",
    "access_log": False,
    "log_level": "warning",
    # Longer than clients' idle-connection expiry (httpx: 5 s), so a client
    # never sends on a connection the gateway is closing.
    "timeout_keep_alive": 75,
    # Nothing reads the client's address: no rewriting it from
    # X-Forwarded-* on every request (uvicorn's default middleware).
    "proxy_headers": False,
    "server_header": False,  # no "server: uvicorn" on every answer
}


class _Stopped(BaseException):
    """SIGTERM or SIGINT, relayed past uvicorn (which raises the signal again
    once it has shut down gracefully) so the operator listener's directory
    is removed before the process ends by that signal."""

    def __init__(self, signum: int) -> None:
        self.signum = signum


def _stop(signum, _frame) -> None:
    raise _Stopped(signum)


class Command(BaseCommand):
    help = (
        "Run the OpenAI-compatible gateway (uvicorn, uvloop, httptools) on --host/--port, "
        "and its operator listener (/metrics, the detailed /healthz) on "
        "--operator-host/--operator-port."
    )

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8080)
        parser.add_argument("--workers", type=int, default=1)
        parser.add_argument(
            "--operator-host",
            default=None,
            help="where /metrics and the detailed /healthz listen "
            "(default: GATEWAY_OPERATOR_HOST, 127.0.0.1); never reachable by tenants",
        )
        parser.add_argument(
            "--operator-port",
            default=None,
            help="their port (default: GATEWAY_OPERATOR_PORT, 9090); not --port",
        )

    def handle(
        self,
        *args,
        host: str,
        port: int,
        workers: int,
        operator_host: str | None,
        operator_port: str | None,
        **options,
    ):
        operator_address = _operator_address(operator_host, operator_port, tenant_port=port)
        if workers < 1:
            raise CommandError(f"--workers must be at least 1, not {workers}")
        run = OperatorRun.create(workers=workers)
        stopped, failed = None, False
        try:
            try:
                operator = OperatorServer(operator_address, run=run)
            except OSError as exc:
                raise CommandError(
                    f"the operator listener cannot listen on {operator_address[0]} port "
                    f"{operator_address[1]} ({exc.strerror or exc}): stop what holds it or "
                    "choose another with --operator-port or GATEWAY_OPERATOR_PORT"
                ) from None
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, _stop)
            try:
                failed = _serve(operator, host=host, port=port, workers=workers)
            finally:
                operator.close()
        except _Stopped as signalled:
            stopped = signalled.signum
        finally:
            run.close()
        if stopped is not None:  # end as the signal would have: a supervisor reads it
            signal.signal(stopped, signal.SIG_DFL)
            signal.raise_signal(stopped)
        if failed:
            sys.exit(STARTUP_FAILURE)


def _operator_address(host: str | None, port: str | None, *, tenant_port: int) -> tuple[str, int]:
    """The operator listener's address: the options, else the settings.
    Refused, naming both, when empty, not a port, or the tenants' port."""
    host = (settings.GATEWAY["OPERATOR_HOST"] if host is None else host).strip()
    if not host:  # an empty host would bind every interface, tenants' included
        raise CommandError(
            "--operator-host / GATEWAY_OPERATOR_HOST is empty: name the address the "
            "operator listener binds (127.0.0.1 by default)"
        )
    try:
        number = operator_port_parse(settings.GATEWAY["OPERATOR_PORT"] if port is None else port)
    except ValueError as bad:
        raise CommandError(f"--operator-port / GATEWAY_OPERATOR_PORT {bad}") from None
    if number == tenant_port:
        raise CommandError(
            f"--operator-port and --port are both {number}: /metrics and the detailed "
            "health need a port of their own, which tenants cannot reach"
        )
    return host, number


def _serve(operator: OperatorServer, *, host: str, port: int, workers: int) -> bool:
    """Bind the tenants' port, start the operator listener, then serve
    (uvicorn's own run, with the socket bound first: a worker that answers
    the operator listener is then already reachable by tenants). True if
    the gateway failed to start."""
    config = uvicorn.Config(
        "gateway.app:application",
        host=host,
        port=port,
        workers=workers,
        timeout_graceful_shutdown=30,
        **SERVER_OPTIONS,
    )
    sock = config.bind_socket()  # a busy port: uvicorn says so and exits 1
    operator.start()
    try:
        if workers > 1:
            supervisor = Multiprocess(config, sockets=[sock])
            supervisor.run()
            return any(p.exitcode == STARTUP_FAILURE for p in supervisor.processes)
        server = uvicorn.Server(config)
        server.run(sockets=[sock])
        return not server.started
    finally:
        sock.close()
