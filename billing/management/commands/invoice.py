import getpass
from datetime import UTC, datetime

from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from billing.choices import RunStatus
from billing.errors import BillingInputError, InvoicePeriodOpenError
from billing.invoicing.finalizing import finalize_early_request
from billing.invoicing.runs import invoice_run_create, invoice_run_execute, invoice_run_summary
from billing.tasks import invoice_run_enqueue
from core.commands import moment_option


def _shell_user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no login name in this environment
        return "unknown user"


class Command(BaseCommand):
    help = (
        "Invoice every tenant whose billing period ended by --as-of (UTC; default: now), "
        "with a progress bar. Safe to re-run: finalized invoices are left alone. An --as-of "
        "later than now picks periods that have not ended: refused unless --draft, or "
        '--finalize-early --reason "..." (recorded on each invoice).'
    )

    def add_arguments(self, parser):
        parser.add_argument("--as-of", type=moment_option)
        parser.add_argument("--draft", action="store_true", help="build drafts, do not finalize")
        parser.add_argument("--queue", action="store_true", help="hand it to a Celery worker")
        parser.add_argument(
            "--finalize-early",
            action="store_true",
            help="finalize periods that have not ended yet (needs --reason)",
        )
        parser.add_argument("--reason", default="", help="why finalize early (recorded)")

    def handle(self, *args, as_of=None, draft=False, queue=False, **options):
        run = self._run_create(as_of or datetime.now(UTC), draft=draft, **options)
        if queue:
            invoice_run_enqueue(run.pk)
            run.refresh_from_db()
            if run.status == RunStatus.FAILED:
                raise CommandError(f"invoice run {run.pk}: {run.failures[0]['error']}")
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
        done = invoice_run_summary(run=run)
        self.stdout.write(
            f"invoice run {run.pk}: {run.status}; {run.tenants_total} tenants: "
            f"{done['finalized']} finalized, {done['drafts']} drafts, "
            f"{done['skipped']} skipped (already invoiced or nothing to bill), "
            f"{done['failed']} failed"
        )

    def _run_create(self, as_of: datetime, *, draft: bool, finalize_early=False, reason="", **_):
        """The run, or a CommandError saying why not (nothing written)."""
        if reason and not finalize_early:
            raise CommandError("--reason goes with --finalize-early")
        try:
            early = None
            if finalize_early:
                if draft:
                    raise CommandError("--finalize-early finalizes: it cannot go with --draft")
                early = finalize_early_request(
                    reason=reason, by=f"{_shell_user()} (manage.py invoice)"
                )
            return invoice_run_create(as_of=as_of, finalize=not draft, early=early)
        except BillingInputError as error:
            raise CommandError(f"--{error.field.replace('_', '-')}: {error.message}") from None
        except InvoicePeriodOpenError as error:
            raise CommandError(
                f"--as-of {as_of:%Y-%m-%d %H:%M} UTC: {error}; to finalize it now anyway, "
                f'add --finalize-early --reason "...", or build drafts with --draft'
            ) from None
