from datetime import UTC, datetime

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from metering.archive import ArchiveMismatch, archive_due, month_archive
from metering.retention import RetentionTooShort, horizon_start, retention_check


class Command(BaseCommand):
    help = (
        "Archive the raw ledger's months past the retention horizon "
        "(METERING_RETENTION_MONTHS, or --months): each month exported to Parquet under "
        "METERING_ARCHIVE_URL (or --to), read back and checked, its idempotency keys "
        "pruned, its partition dropped; with a progress bar per step. What the monthly "
        "metering.ledger_archive job does. --dry-run lists the months due."
    )

    def add_arguments(self, parser):
        parser.add_argument("--months", type=int, help="the horizon, in whole months")
        parser.add_argument("--to", help="a directory or URL for the files")
        parser.add_argument("--dry-run", action="store_true", help="list what is due")

    def handle(self, *args, months=None, to=None, dry_run=False, **options):
        if months is not None:
            try:
                retention_check(months, name="--months")
            except RetentionTooShort as short:
                raise CommandError(str(short)) from None
        now = datetime.now(UTC)
        if months is not None:
            settings.METERING = {**settings.METERING, "RETENTION_MONTHS": months}
        due = archive_due(now=now)
        horizon = horizon_start(now)
        if not due:
            self.stdout.write(f"nothing received before {horizon:%Y-%m-%d} left to archive")
            return
        names = ", ".join(f"{m:%Y-%m}" for m in due)
        if dry_run:
            self.stdout.write(f"due (received before {horizon:%Y-%m-%d}): {names}")
            return
        for month in due:
            bars: dict[str, tqdm] = {}

            def progress(step, done, total, bars=bars, month=month):
                bar = bars.get(step)
                if bar is None:
                    bar = bars[step] = tqdm(total=total, desc=f"{month:%Y-%m} {step}")
                bar.update(done - bar.n)

            try:
                archive = month_archive(month=month, base_url=to, progress=progress)
            except ArchiveMismatch as mismatch:
                raise CommandError(str(mismatch)) from None
            finally:
                for bar in bars.values():
                    bar.close()
            self.stdout.write(
                f"{month:%Y-%m}: {archive.rows} events ({archive.prompt_tokens} prompt, "
                f"{archive.completion_tokens} completion tokens), {archive.bytes} bytes, "
                f"sha256 {archive.sha256}, in {archive.url}; {archive.keys_pruned} keys pruned, "
                "partition dropped"
            )
