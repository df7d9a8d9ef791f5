from django.core.management.base import BaseCommand
from tqdm import tqdm

from metering.jobs import metering_run


class Command(BaseCommand):
    help = (
        "Attribute every attribution window that is due and rebuild the rollups of "
        "every hour whose usage changed (what the metering.run task does each minute)."
    )

    def handle(self, *args, **options):
        with tqdm(desc="attribution windows", unit="window") as bar:

            def progress(done: int, total: int) -> None:
                bar.total = total
                bar.update(done - bar.n)

            run = metering_run(progress=progress)
        self.stdout.write(
            f"{run.windows} windows attributed ({run.still_pending} pending again), "
            f"{len(run.hours)} hours rolled up"
        )
