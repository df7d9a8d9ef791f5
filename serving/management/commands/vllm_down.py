from django.core.management.base import BaseCommand

from serving.choices import ReplicaStatus
from serving.launcher import replica_stop, state_read, state_write
from serving.models import Replica


class Command(BaseCommand):
    help = "Stop the local vLLM replicas started by vllm_up (by process id)."

    def add_arguments(self, parser):
        parser.add_argument("names", nargs="*", help="replica names (default: all)")

    def handle(self, *args, names: list[str], **options):
        replicas = state_read()
        chosen = [r for r in replicas if not names or r.name in names]
        for replica in chosen:
            stopped = replica_stop(replica.pid)
            Replica.objects.filter(name=replica.name).update(status=ReplicaStatus.DOWN)
            self.stdout.write(f"{replica.name}: {'stopped' if stopped else 'was not running'}")
        state_write([r for r in replicas if r not in chosen])
