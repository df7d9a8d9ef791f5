"""manage.py fx_rates_import FILE: FX rates from a CSV of reference rates
(the ECB's eurofxref-hist.csv, or `date,base,quote,rate[,source]`), from a
file on disk only. All or nothing: a bad row names its line and column and
nothing is written."""

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from billing.fx_rates import FxRowError, fx_csv_rows, fx_rates_save


class Command(BaseCommand):
    help = (
        "Import FX rates from a CSV file: the ECB's layout (Date,USD,JPY,... per EUR) or "
        "date,base,quote,rate[,source]. All rows or none; a rate already stored for the "
        "same pair and day is kept when equal and refused when different (unless --replace)."
    )

    def add_arguments(self, parser):
        parser.add_argument("path", type=Path, help="the CSV file")
        parser.add_argument("--source", default="", help="recorded on each rate")
        parser.add_argument(
            "--currencies",
            default="",
            help="only these (comma-separated ISO codes), e.g. USD,GBP; default: all",
        )
        parser.add_argument("--replace", action="store_true", help="change rates already stored")

    def handle(self, *args, path: Path, source="", currencies="", replace=False, **options):
        try:
            text = path.read_text(encoding="utf-8-sig")
        except OSError as exc:
            raise CommandError(f"{path}: {exc.strerror or exc}") from None
        lines = text.splitlines()
        wanted = {c.strip().upper() for c in currencies.split(",") if c.strip()} or None
        try:
            with tqdm(total=max(len(lines) - 1, 0), desc="lines read", unit=" lines") as bar:
                rows = fx_csv_rows(lines, source=source, currencies=wanted, progress=bar.update)
            with tqdm(total=len(rows), desc="rates written", unit=" rates") as bar:
                result = fx_rates_save(rows=rows, replace=replace, progress=bar.update)
        except FxRowError as exc:
            raise CommandError(
                f"{path}, line {exc.where}, {exc.field}: {exc.message} (nothing imported)"
            ) from None
        self.stdout.write(
            f"{len(rows)} rates read: {result.created} created, {result.updated} replaced, "
            f"{result.unchanged} already there"
        )
