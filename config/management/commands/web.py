"""The web app's server (uvicorn, the ASGI app) for containers: started
through manage.py, so the settings are loaded in the supervising process
and a missing one stops the container at once with its one line (plain
`uvicorn --workers N` loads them only in its workers, which it restarts)."""

import uvicorn
from django.conf import settings
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Run the web app (dashboard, REST API, admin) with uvicorn."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--workers", type=int, default=1)

    def handle(self, *args, host: str, port: int, workers: int, **options):
        uvicorn.run(
            "config.asgi:application",
            host=host,
            port=port,
            workers=workers,
            # X-Forwarded-Proto and -For believed only from the TLS proxies
            # (config.proxies); Django reads the scheme uvicorn settled on.
            proxy_headers=True,
            forwarded_allow_ips=settings.WEB_TRUSTED_PROXIES,
            access_log=False,
            timeout_graceful_shutdown=30,
        )
