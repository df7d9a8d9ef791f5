from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand

from demo.seeds.tenants import demo_seed


class Command(BaseCommand):
    help = "Create the demo world (idempotent). API key secrets go to a mode-600 file."

    def add_arguments(self, parser):
        parser.add_argument(
            "--secrets-file",
            type=Path,
            default=settings.DEMO_KEYS_FILE,
            help="where the demo API keys are written (default: %(default)s)",
        )

    def handle(self, *args, secrets_file: Path, **options):
        report = demo_seed(secrets_path=secrets_file, password=settings.DEMO_PASSWORD)
        self.stdout.write(
            f"demo seed: {report.tenants_created} tenants, {report.users_created} users, "
            f"{report.keys_created} API keys created ({report.keys_replaced} replaced); "
            f"keys in {secrets_file}"
        )
