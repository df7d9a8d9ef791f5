"""Writing the fleet's energy hours (metering.models.EnergyHour): the
booked allocation computes them (billing.costs.energy) and replaces a
day's rows here, in its own transaction, through COPY."""

from __future__ import annotations

from datetime import datetime

from metering.models import EnergyHour

COLUMNS = ("hour", "pool_id", "tenant_id", "served_model_id", "kwh", "co2e_g")


def energy_day_replace(
    cursor, *, start: datetime, end: datetime, csv: bytes, replace: bool
) -> None:
    """Replace [start, end)'s energy hours with `csv` (COLUMNS, no header),
    on `cursor` (the caller's transaction)."""
    if replace:
        EnergyHour.objects.filter(hour__gte=start, hour__lt=end).delete()
    if csv:
        table = EnergyHour._meta.db_table
        with cursor.cursor.copy(
            f"COPY {table} ({', '.join(COLUMNS)}) FROM STDIN WITH (FORMAT csv)"
        ) as copy:
            copy.write(csv)


def energy_hours_clear(*, after: datetime) -> None:
    """Delete the energy hours at and after `after` (hours that had not
    happened when they were written), in the caller's transaction."""
    EnergyHour.objects.filter(hour__gte=after).delete()
