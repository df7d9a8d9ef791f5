from django.core.management.base import BaseCommand

from core.commands import refusals_as_command_errors
from tenants.services import service_key_create


class Command(BaseCommand):
    help = (
        "Create a platform service key (usage:write) for another serving tier to "
        "POST usage events. The secret is printed once and never stored."
    )

    def add_arguments(self, parser):
        parser.add_argument("name", help="what the key is for, e.g. 'eu-west vLLM fleet'")

    def handle(self, *args, name: str, **options):
        with refusals_as_command_errors(options={"name": "name"}):
            key, secret = service_key_create(name=name)
        self.stderr.write(f"created {key.display_prefix} ({key.name}); the secret follows, once:")
        self.stdout.write(secret)
