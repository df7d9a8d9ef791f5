from io import StringIO

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from demo.history import demo_history_fill
from demo.seeds.billing import cost_rates_demo_seed, prices_demo_seed
from demo.seeds.fleet import grid_intensity_demo_seed


class Command(BaseCommand):
    help = (
        "Fill earlier months of the demo world so charts show trends: synthetic hourly usage "
        "(rows marked synthetic) for each demo tenant up to the start of today, its GPU cost "
        "allocated, finalized invoices for the closed months and a margin report per month. "
        "Seeds the demo world first if needed. Safe to re-run."
    )

    def add_arguments(self, parser):
        parser.add_argument("--months", type=int, default=3, help="whole months before this one")
        parser.add_argument("--seed", type=int, default=7)

    def handle(self, *args, months: int, seed: int, **options):
        if months < 0:
            raise CommandError(f"--months: must be 0 or more, not {months}")
        call_command("seed_demo", stdout=self.stdout if options["verbosity"] > 1 else StringIO())
        cost_rates_demo_seed()
        grid_intensity_demo_seed()
        prices_demo_seed()
        bars: dict[str, tqdm] = {}

        def progress(step: str, done: int, total: int) -> None:
            bar = bars.get(step)
            if bar is None:
                for earlier in bars.values():
                    earlier.close()
                bar = bars[step] = tqdm(desc=step, total=total, unit="")
            bar.total = total
            bar.update(done - bar.n)

        try:
            report = demo_history_fill(months=months, seed=seed, progress=progress)
        finally:
            for bar in bars.values():
                bar.close()
        self.stdout.write(
            f"synthetic history {report.start:%Y-%m-%d} to {report.end:%Y-%m-%d}: "
            f"{report.rows} usage rows, allocation {report.allocation or 'skipped'}, "
            f"{report.invoices} invoices, {report.reports} margin reports"
        )
