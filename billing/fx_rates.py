"""Entering FX rates: one at a time (admin, API), many at once (API), or
from a CSV file of reference rates (manage.py fx_rates_import), never from
the network. Two CSV layouts are read:

- the ECB's (eurofxref-hist.csv): `Date,USD,JPY,...`, one row per day,
  each cell the units of that currency per euro (base EUR), "N/A" or empty
  where there is no rate;
- a plain one: `date,base,quote,rate[,source]`, one rate per row.

A batch is all or nothing: any bad row (naming its line or index and the
field) and nothing is written. A rate already stored for the same pair and
day is left alone when equal and refused when different, unless asked to
replace (a report re-run after that uses the new rate)."""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import date
from decimal import Decimal

from django.db import transaction

from billing.models import FxRate
from billing.models.fx import FX_RATE
from core.errors import InputError
from core.plain_decimal import plain_decimal

CODE = re.compile(r"^[A-Z]{3}$")
ECB_BASE = "EUR"
ECB_SOURCE = "ECB euro foreign exchange reference rate"
MISSING = {"", "N/A", "NA", "-"}
BATCH = 2000
Progress = Callable[[int], None]


class FxRowError(Exception):
    """A bad row: `where` is its position (a CSV line number, or an index
    into a list), `field` the column or field at fault."""

    def __init__(self, where: int, field: str, message: str) -> None:
        super().__init__(message)
        self.where, self.field, self.message = where, field, message


@dataclass(frozen=True)
class FxRow:
    base: str
    quote: str
    date: date
    rate: Decimal
    source: str
    where: int  # line number or index, for errors


@dataclass
class FxSaveResult:
    created: int = 0
    updated: int = 0
    unchanged: int = 0


def fx_code_parse(text: str, *, where: int, field: str) -> str:
    code = (text or "").strip().upper()
    if not CODE.match(code):
        raise FxRowError(where, field, f"{text!r} is not a three-letter ISO 4217 currency code")
    return code


def fx_rate_parse(text: str, *, where: int, field: str) -> Decimal:
    try:
        rate = plain_decimal(
            text if isinstance(text, str | int | Decimal) else str(text),
            field=field,
            places=FX_RATE["decimal_places"],
            max_digits=FX_RATE["max_digits"],
        )
    except InputError as error:
        raise FxRowError(where, field, error.message) from None
    if rate <= 0:
        raise FxRowError(where, field, "must be a positive number")
    return rate


def fx_date_parse(text: str, *, where: int, field: str) -> date:
    try:
        return date.fromisoformat((text or "").strip())
    except ValueError:
        raise FxRowError(where, field, f"{text!r} is not a date (YYYY-MM-DD)") from None


def fx_csv_rows(
    lines: Iterable[str],
    *,
    source: str = "",
    currencies: set[str] | None = None,
    progress: Progress | None = None,
) -> list[FxRow]:
    """Every rate in a CSV file of either layout (see the module), checked;
    `currencies` keeps only pairs within them (besides the ECB's euro)."""
    reader = csv.reader(lines)
    header = next(reader, None)
    if not header:
        raise FxRowError(1, "header", "the file is empty")
    names = [h.strip() for h in header]
    lowered = [n.lower() for n in names]
    if lowered[:4] == ["date", "base", "quote", "rate"]:
        rows = _plain(reader, names, source=source, progress=progress)
    elif lowered[0] == "date" and len(names) > 1:
        rows = _ecb(reader, names, source=source or ECB_SOURCE, progress=progress)
    else:
        raise FxRowError(
            1, "header", "expected `date,base,quote,rate` or the ECB's `Date,USD,JPY,...`"
        )
    out, seen = [], {}
    for row in rows:
        if currencies and not ({row.base, row.quote} - {ECB_BASE}) <= currencies:
            continue
        key = (row.base, row.quote, row.date)
        if key in seen:
            if seen[key].rate != row.rate:
                raise FxRowError(
                    row.where,
                    "rate",
                    f"{row.base}/{row.quote} on {row.date} is also on line {seen[key].where} "
                    f"with another rate ({seen[key].rate})",
                )
            continue
        seen[key] = row
        out.append(row)
    return out


def _lines(reader, progress: Progress | None) -> Iterator[tuple[int, list[str]]]:
    for cells in reader:
        if progress:
            progress(1)
        if any(c.strip() for c in cells):
            yield reader.line_num, cells


def _plain(reader, names, *, source: str, progress) -> Iterator[FxRow]:
    has_source = len(names) > 4 and names[4].lower() == "source"
    for line, cells in _lines(reader, progress):
        if len(cells) < 4:
            raise FxRowError(line, names[len(cells)], "missing")
        base = fx_code_parse(cells[1], where=line, field="base")
        quote = fx_code_parse(cells[2], where=line, field="quote")
        if base == quote:
            raise FxRowError(line, "quote", "must differ from base")
        row_source = cells[4].strip() if has_source and len(cells) > 4 else ""
        yield FxRow(
            base=base,
            quote=quote,
            date=fx_date_parse(cells[0], where=line, field="date"),
            rate=fx_rate_parse(cells[3], where=line, field="rate"),
            source=(row_source or source)[:100],
            where=line,
        )


def _ecb(reader, names, *, source: str, progress) -> Iterator[FxRow]:
    columns = []  # (index, code): the ECB file ends every line with a comma
    for index, name in enumerate(names[1:], start=1):
        if name:
            columns.append((index, fx_code_parse(name, where=1, field=name)))
    for line, cells in _lines(reader, progress):
        day = fx_date_parse(cells[0], where=line, field=names[0])
        for index, code in columns:
            text = cells[index].strip() if index < len(cells) else ""
            if text.upper() in MISSING or code == ECB_BASE:
                continue
            rate = fx_rate_parse(text, where=line, field=code)
            yield FxRow(ECB_BASE, code, day, rate, source[:100], line)


@transaction.atomic
def fx_rates_save(
    *, rows: list[FxRow], replace: bool = False, user=None, progress: Progress | None = None
) -> FxSaveResult:
    """Store rates, all or none (see the module). Raises FxRowError."""
    result = FxSaveResult()
    if not rows:
        return result
    stored = {
        (r.base, r.quote, r.date): r
        for r in FxRate.objects.select_for_update().filter(
            base__in={row.base for row in rows},
            quote__in={row.quote for row in rows},
            date__gte=min(row.date for row in rows),
            date__lte=max(row.date for row in rows),
        )
    }
    new, changed = [], []
    for row in rows:
        old = stored.get((row.base, row.quote, row.date))
        if old is None:
            new.append(
                FxRate(
                    base=row.base,
                    quote=row.quote,
                    date=row.date,
                    rate=row.rate,
                    source=row.source,
                    created_by=user,
                )
            )
        elif old.rate == row.rate:
            result.unchanged += 1
        elif not replace:
            raise FxRowError(
                row.where,
                "rate",
                f"{row.base}/{row.quote} on {row.date} is stored as {old.rate.normalize():f}; "
                "replace it explicitly to change it",
            )
        else:
            old.rate, old.source = row.rate, row.source
            changed.append(old)
    for start in range(0, len(new), BATCH):
        FxRate.objects.bulk_create(new[start : start + BATCH])
        if progress:
            progress(len(new[start : start + BATCH]))
    FxRate.objects.bulk_update(changed, ["rate", "source"], batch_size=BATCH)
    if progress and changed:
        progress(len(changed))
    result.created, result.updated = len(new), len(changed)
    return result
