from datetime import UTC, datetime

from django.core.management.base import BaseCommand
from tqdm import tqdm

from billing.invoice_run import invoice_run_create, invoice_run_execute


def _moment(value: str) -> datetime:
    return datetime.fromisoformat(value).replace(tzinfo=UTC)


class Command(BaseCommand):
    help = (
        "Invoice every tenant whose billing period ended by --as-of (UTC; default: now), "
        "with a progress bar. Safe to re-run: finalized invoices are left alone."
    )

    def add_arguments(self, parser):
        parser.add_argument("--as-of", type=_moment)
        parser.add_argument("--draft", action="store_true", help="build drafts, do not finalize")
        parser.add_argument("--queue", action="store_true", help="hand it to a Celery worker")

    def handle(self, *args, as_of=None, draft=False, queue=False, **options):
        run = invoice_run_create(as_of=as_of or datetime.now(UTC), finalize=not draft)
        if queue:
            from billing.tasks import invoice_run_task

            invoice_run_task.delay(run.pk)
            self.stdout.write(f"invoice run {run.pk} queued")
            return
        with tqdm(desc="tenants invoiced", unit="tenant") as bar:

            def progress(done: int, total: int) -> None:
                bar.total = total
                bar.update(done - bar.n)

            run = invoice_run_execute(run_id=run.pk, progress=progress)
        for warning in run.warnings:
            self.stderr.write(f"warning: {warning}")
        for failure in run.failures:
            self.stderr.write(f"failed: {failure['tenant']}: {failure['error']}")
        self.stdout.write(
            f"invoice run {run.pk}: {run.status}, {run.invoices_created} invoiced, "
            f"{run.invoices_skipped} skipped of {run.tenants_total} tenants"
        )
