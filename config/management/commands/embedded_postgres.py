from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from config.embedded_postgres import (
    embedded_postgres_start,
    embedded_postgres_status,
    embedded_postgres_stop,
)


class Command(BaseCommand):
    help = "Start, stop or show the embedded PostgreSQL (used when DATABASE_URL is unset)."

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["start", "stop", "status"])

    def handle(self, *args, action: str, **options):
        data_dir = settings.EMBEDDED_POSTGRES_DIR
        if action == "start":
            socket_dir, port = embedded_postgres_start(data_dir=data_dir)
            self.stdout.write(f"running: socket {socket_dir}/.s.PGSQL.{port}")
        elif action == "stop":
            stopped = embedded_postgres_stop(data_dir=data_dir)
            self.stdout.write("stopped" if stopped else "was not running")
        else:
            pid = embedded_postgres_status(data_dir=data_dir)
            if pid is None:
                raise CommandError(f"not running (data in {data_dir})")
            self.stdout.write(f"running, pid {pid} (data in {data_dir})")
