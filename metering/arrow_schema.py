"""The ledger's columns as Arrow types, read from the UsageEvent model:
one schema for the Parquet archive (metering.archive) and the raw-event
store of the scaled path (metering.log.store)."""

from __future__ import annotations

import pyarrow as pa
from django.db import models

from metering.models import UsageEvent


def arrow_type(field: models.Field) -> pa.DataType:
    """How a ledger column is held in Arrow and Parquet: times as UTC
    microseconds, milliseconds as exact decimals."""
    if isinstance(field, models.DateTimeField):
        return pa.timestamp("us", "UTC")
    if isinstance(field, models.DecimalField):
        return pa.decimal128(field.max_digits, field.decimal_places)
    if isinstance(field, models.BooleanField):
        return pa.bool_()
    if isinstance(field, models.CharField):
        return pa.string()
    return pa.int64()  # integers and foreign keys


def ledger_fields() -> dict[str, pa.DataType]:
    """Every column of the ledger (its name in the table) and its type."""
    return {field.column: arrow_type(field) for field in UsageEvent._meta.concrete_fields}
