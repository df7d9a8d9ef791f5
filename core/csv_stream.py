"""Streaming CSV downloads: rows are written as they come from a
server-side cursor, so an export of any size uses constant memory.
Numbers are written in plain fixed-point (core.fixed_point)."""

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
    return fixed_point(value) if isinstance(value, Decimal | float) else value


def csv_response(rows: Iterable[dict], *, columns: Sequence[str], filename: str):
    response = StreamingHttpResponse(csv_lines(rows, columns), content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response
