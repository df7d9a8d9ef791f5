"""`migrate`, once the database answers: the migrate one-shot of compose and
Kubernetes starts beside PostgreSQL, and not every engine holds it back
until the database is healthy (podman-compose on podman < 4.6 ignores
`condition: service_healthy`; a Kubernetes Job has no such condition)."""

import time

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import OperationalError, connection


class Command(BaseCommand):
    help = "Wait until the database accepts connections (up to --wait seconds), then migrate."

    def add_arguments(self, parser):
        parser.add_argument(
            "--wait", type=float, default=120, help="seconds (default: %(default)s)"
        )

    def handle(self, *args, wait: float, **options):
        if wait < 0:
            raise CommandError("--wait: must be 0 or more seconds")
        deadline = time.monotonic() + wait
        while True:
            try:
                connection.ensure_connection()
                break
            except OperationalError as error:
                if time.monotonic() >= deadline:
                    reason = (str(error).strip().splitlines() or ["no answer"])[0]
                    raise CommandError(
                        f"the database did not answer within {wait:.0f} s: {reason}"
                    ) from None
                first = (str(error).strip().splitlines() or ["no answer"])[0]
                self.stderr.write(f"waiting for the database: {first[:160]}")
                connection.close()
                time.sleep(1)
        call_command("migrate", interactive=False, verbosity=options["verbosity"])
