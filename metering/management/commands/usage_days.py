from datetime import UTC, datetime

from django.core.management.base import BaseCommand, CommandError
from django.db.models import Min
from tqdm import tqdm

from core.calendar import month_starts_between, months_add
from core.commands import moment_option
from metering.days import usage_days_check, usage_days_repair
from metering.models import UsageRollup


def _sums(sums: tuple | None) -> str:
    if sums is None:
        return "nothing"
    prompt, cached, completion, seconds, rows = sums
    return (
        f"{prompt} prompt ({cached} cached) and {completion} completion tokens, "
        f"{seconds.normalize():f} device-seconds, {rows} hourly rows"
    )


class Command(BaseCommand):
    help = (
        "Check the daily usage totals (what invoices read) against their hourly rollups "
        "over [--since, --until) (UTC; default: from the first rollup to now), month by "
        "month with a progress bar; --repair rebuilds each drifted day from its hours "
        "(what the daily metering.usage_days_check job does for the last two months). "
        "Exits 1 on drift left unrepaired."
    )

    def add_arguments(self, parser):
        parser.add_argument("--since", type=moment_option)
        parser.add_argument("--until", type=moment_option)
        parser.add_argument("--repair", action="store_true", help="rebuild drifted days")

    def handle(self, *args, since=None, until=None, repair=False, **options):
        until = until or datetime.now(UTC)
        since = since or UsageRollup.objects.aggregate(first=Min("hour"))["first"]
        if since is None or since >= until:
            self.stdout.write("no hourly rollups in the stretch: nothing to check")
            return
        months = [m for m in month_starts_between(since, until) if m < until]
        drifted = []
        for month in tqdm(months, desc="months checked", unit="month"):
            start, end = max(month, since), min(months_add(month, 1), until)
            found = (usage_days_repair if repair else usage_days_check)(start=start, end=end)
            for day in found:
                self.stdout.write(
                    f"{day.day:%Y-%m-%d} tenant {day.tenant_id} model {day.served_model_id}: "
                    f"the day holds {_sums(day.held)}; its hours sum to {_sums(day.summed)}"
                )
            drifted += found
        verdict = "rebuilt from their hours" if repair else "left as they are"
        self.stdout.write(f"{len(drifted)} drifted days in {len(months)} months, {verdict}")
        if drifted and not repair:
            raise CommandError("daily totals differ from their hours: run with --repair")
