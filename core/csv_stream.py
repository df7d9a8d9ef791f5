"""Streaming CSV downloads: rows are written as they come from a
server-side cursor, so an export of any size uses constant memory.
Numbers are written in plain fixed-point (core.fixed_point); text that a
spreadsheet would run as a formula is written as text (csv_text_safe)."""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator, Sequence
from decimal import Decimal

from django.http import StreamingHttpResponse

from core.fixed_point import fixed_point


class _Line:
    """csv.writer target that hands each formatted line back."""

    def write(self, value: str) -> str:
        return value


def csv_lines(rows: Iterable[dict], columns: Sequence[str]) -> Iterator[str]:
    writer = csv.writer(_Line())
    yield writer.writerow(columns)
    for row in rows:
        yield writer.writerow([_cell(row.get(c, "")) for c in columns])


def _cell(value):
    if isinstance(value, Decimal | float):
        return fixed_point(value)
    return csv_text_safe(value) if isinstance(value, str) else value


# A spreadsheet reads a cell that begins with one of these as a formula
# (`=HYPERLINK(...)`, `@SUM(...)`, `+cmd|...`): text a tenant controls (a key
# name, an invoice reason) reaches exports, so such text is led by a quote.
FORMULA_LEADS = ("=", "+", "-", "@", "\t", "\r")


def csv_text_safe(text: str) -> str:
    """`text` as a CSV cell a spreadsheet shows as text: a leading quote
    before a formula's first character (OWASP's CSV injection advice); a
    plain number (-1.50, +3) is left as it is."""
    if not text.startswith(FORMULA_LEADS) or _plain_number(text):
        return text
    return "'" + text


def _plain_number(text: str) -> bool:
    try:
        Decimal(text)
    except ArithmeticError:
        return False
    return text.strip() == text and not text.lower().lstrip("+-").startswith(("inf", "nan"))


def csv_response(rows: Iterable[dict], *, columns: Sequence[str], filename: str):
    response = StreamingHttpResponse(csv_lines(rows, columns), content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response
