from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm


class Command(BaseCommand):
    help = (
        "The scaled path's raw-event store (USAGE_STORE_URL). `maintain`: what the hourly "
        "metering.store_maintain job does, now, with a progress bar: every closed hour "
        "compacted to a few large files, the table's log checkpointed, files no commit refers "
        "to any more vacuumed past USAGE_STORE_VACUUM_HOURS, hours past "
        "USAGE_STORE_RETENTION_MONTHS deleted."
    )

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["maintain"])

    def handle(self, *args, action, **options):
        if not settings.USAGE_LOG["URL"]:
            raise CommandError("USAGE_LOG_URL is not set: this deployment keeps no raw-event store")
        from metering.log.maintenance import store_maintain

        bar = tqdm(total=0, unit="hour", desc="compacting", disable=None)

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.n = done
            bar.refresh()

        try:
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
