from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from core.commands import moment_option


class Command(BaseCommand):
    help = (
        "The scaled path's raw-event store (USAGE_STORE_URL). `maintain`: what the hourly "
        "metering.store_maintain job does, now, with a progress bar: every closed hour "
        "compacted to a few large files, the table's log checkpointed, files no commit refers "
        "to any more vacuumed past USAGE_STORE_VACUUM_HOURS, hours past "
        "USAGE_STORE_RETENTION_MONTHS deleted. `import-ledger`: switching an existing "
        "deployment to the scaled path, the raw rows its PostgreSQL ledger holds copied into "
        "the store, hour by hour with a progress bar (before --until, default now's hour); "
        "stopped and run again, it goes on after the last hour it committed."
    )

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["maintain", "import-ledger"])
        parser.add_argument("--until", type=moment_option, help="import-ledger: before this hour")

    def handle(self, *args, action, until=None, **options):
        if not settings.USAGE_LOG["URL"]:
            raise CommandError("USAGE_LOG_URL is not set: this deployment keeps no raw-event store")
        bar = tqdm(
            total=0,
            unit="hour",
            desc="compacting" if action == "maintain" else "importing",
            disable=None,
        )

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.n = done
            bar.refresh()

        try:
            if action == "import-ledger":
                self._import(until, progress)
                return
            from metering.log.maintenance import store_maintain

            done = store_maintain(progress=progress)
        finally:
            bar.close()
        self.stdout.write(
            f"{len(done.compacted)} hours compacted ({done.files_before} files to "
            f"{done.files_after}), {done.vacuumed} files vacuumed, "
            f"{len(done.deleted_hours)} hours deleted"
            + (
                f", {done.conflicts} deferred (a writer's commit came first)"
                if done.conflicts
                else ""
            )
        )

    def _import(self, until, progress) -> None:
        from metering.log.ledger_import import ledger_import

        done = ledger_import(until=until, progress=progress)
        resumed = (
            f" (resumed after {done.resumed_after:%Y-%m-%d %H:00})" if done.resumed_after else ""
        )
        self.stdout.write(f"{done.events} events of {done.hours} hours imported{resumed}")
