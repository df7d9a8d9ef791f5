import uvicorn
from django.core.management.base import BaseCommand

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


class Command(BaseCommand):
    help = "Run the OpenAI-compatible gateway (uvicorn, uvloop, httptools)."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8080)
        parser.add_argument("--workers", type=int, default=1)

    def handle(self, *args, host: str, port: int, workers: int, **options):
        uvicorn.run(
            "gateway.app:application",
            host=host,
            port=port,
            workers=workers,
            timeout_graceful_shutdown=30,
            **SERVER_OPTIONS,
        )
