"""DuckDB as the scaled path reads the raw-event store with it: in this
process, in UTC, and the one thing its SQL says differently from
PostgreSQL's in the texts both engines run (metering.rollups,
metering.selectors.slo): exact seconds between two timestamps."""

from __future__ import annotations

import duckdb

# Exact seconds between two timestamps (a DECIMAL of microseconds), as
# PostgreSQL's extract(epoch FROM interval) gives them.
DUCKDB_SECONDS = "(CAST(epoch_us({end}) - epoch_us({start}) AS DECIMAL(38, 0)) * 0.000001)"


def duck(**tables) -> duckdb.DuckDBPyConnection:
    """A connection in UTC with `tables` (Arrow tables) registered by name."""
    db = duckdb.connect()
    db.execute("SET TimeZone = 'UTC'")
    for name, table in tables.items():
        db.register(name, table)
    return db
