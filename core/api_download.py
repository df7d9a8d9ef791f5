"""API views that answer with a file: `?format=csv|parquet` passes DRF's
content negotiation and the view writes the file itself; errors stay JSON.
CSV streams (core.csv_stream); Parquet is written whole, with decimal
columns as exact decimals and nulls as nulls."""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from decimal import Decimal, localcontext

from django.http import Http404, HttpResponse
from rest_framework import exceptions
from rest_framework.renderers import BaseRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from core.fixed_point import FixedPointJSONRenderer


class _Download(BaseRenderer):
    charset = None

    def render(self, data, accepted_media_type=None, renderer_context=None):
        return data


class CsvDownload(_Download):
    media_type, format = "text/csv", "csv"


class ParquetDownload(_Download):
    media_type, format = "application/vnd.apache.parquet", "parquet"


class DownloadView(APIView):
    """An API view that can answer with a file; its errors stay JSON."""

    renderer_classes = [FixedPointJSONRenderer, CsvDownload, ParquetDownload]
    formats_help = "json or csv"

    def perform_content_negotiation(self, request, force=False):
        try:
            return super().perform_content_negotiation(request, force=force)
        except Http404:
            raise exceptions.ValidationError(
                {"format": [f"unknown format; use {self.formats_help}"]}
            ) from None

    def finalize_response(self, request, response, *args, **kwargs):
        if isinstance(response, Response) and response.status_code >= 400:
            request.accepted_renderer = FixedPointJSONRenderer()
            request.accepted_media_type = FixedPointJSONRenderer.media_type
        return super().finalize_response(request, response, *args, **kwargs)


DOCUMENTS = {"csv": "text/csv; charset=utf-8", "html": "text/html; charset=utf-8"}


def document_response(body: str, *, fmt: str, name: str) -> HttpResponse:
    """A stored or rendered report as an attachment: `fmt` csv or html,
    saved as `name`.`fmt`."""
    response = HttpResponse(body, content_type=DOCUMENTS[fmt])
    response["Content-Disposition"] = f'attachment; filename="{name}.{fmt}"'
    return response


def parquet_response(
    rows: Iterable[dict],
    *,
    columns: Sequence[str],
    decimals: frozenset[str],
    places: int,
    filename: str,
) -> HttpResponse:
    """`rows` as a Parquet file: `decimals` as decimal128(38, places), the
    rest as strings; None is null."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    amount = pa.decimal128(38, places)
    schema = pa.schema([(c, amount if c in decimals else pa.string()) for c in columns])
    exponent = Decimal(1).scaleb(-places)
    values: dict[str, list] = {c: [] for c in columns}
    with localcontext(prec=38):  # the column's digits: 28, the default, fails at 1e10
        for row in rows:
            for c in columns:
                value = row.get(c)
                if value is not None and c in decimals:
                    value = Decimal(value).quantize(exponent)
                values[c].append(value)
    buffer = io.BytesIO()
    pq.write_table(pa.table(values, schema=schema), buffer)
    response = HttpResponse(buffer.getvalue(), content_type=ParquetDownload.media_type)
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response
