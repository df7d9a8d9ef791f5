from datetime import UTC, datetime, timedelta

from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from billing.choices import RunStatus
from billing.costs.runs import allocation_run_create, allocation_run_execute
from billing.models import CostScenario
from billing.tasks import allocation_run_enqueue
from core.commands import moment_option, refusals_as_command_errors


class Command(BaseCommand):
    help = (
        "Allocate GPU cost over [--start, --end) (UTC dates or hours; default: yesterday), "
        "booked or for --scenario, with a progress bar. Safe to re-run."
    )

    def add_arguments(self, parser):
        parser.add_argument("--start", type=moment_option)
        parser.add_argument("--end", type=moment_option)
        parser.add_argument("--scenario", help="a scenario's name (default: the booked results)")
        parser.add_argument("--queue", action="store_true", help="hand it to a Celery worker")

    def handle(self, *args, start=None, end=None, scenario=None, queue=False, **options):
        today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        start = start or today - timedelta(days=1)
        try:
            end = end or start + timedelta(days=1)
        except OverflowError:
            raise CommandError(f"--start {start:%Y-%m-%d}: too late for the calendar") from None
        chosen = None
        if scenario:
            chosen = CostScenario.objects.filter(name=scenario).first()
            if chosen is None:
                raise CommandError(f"--scenario: no scenario named {scenario!r}")
        asked = f"{start:%Y-%m-%d %H:%M:%S} to {end:%Y-%m-%d %H:%M:%S} UTC"
        with refusals_as_command_errors(asked=asked):
            run = allocation_run_create(start=start, end=end, scenario=chosen)
        if queue:
            allocation_run_enqueue(run.pk)
            run.refresh_from_db()
            if run.status == RunStatus.FAILED:
                raise CommandError(f"run {run.pk}: {run.error}")
            self.stdout.write(f"run {run.pk} queued: {run}")
            return
        with tqdm(total=run.hours_total, desc="hours allocated", unit="h") as bar:
            run = allocation_run_execute(
                run_id=run.pk, progress=lambda done, total: bar.update(done - bar.n)
            )
        for warning in run.warnings:
            self.stderr.write(f"warning: {warning}")
        self.stdout.write(f"run {run.pk}: {run.status}, {run.hours_done} hours")
