from django.core.management.base import BaseCommand

from serving.local_replicas import replicas_stop


class Command(BaseCommand):
    help = "Stop the local vLLM replicas started by vllm_up (by process id)."

    def add_arguments(self, parser):
        parser.add_argument("names", nargs="*", help="replica names (default: all)")

    def handle(self, *args, names: list[str], **options):
        for name, stopped in replicas_stop(names=names or None):
            self.stdout.write(f"{name}: {'stopped' if stopped else 'was not running'}")
