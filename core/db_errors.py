"""Telling a database that is away from a query that failed."""

from __future__ import annotations

from django.db import OperationalError

# Besides libpq's own failures (no SQLSTATE): class 08, a connection
# exception, and the server shutting down or still starting (57P01-57P03).
_UNAVAILABLE_SQLSTATES = ("57P01", "57P02", "57P03")


def database_away(exc: BaseException) -> bool:
    """Whether `exc` says the database is away (stopped, restarting, the
    network gone, no pooled connection in time), rather than that a query
    failed (a lock timeout, a deadlock: OperationalErrors too). psycopg
    reports a lost connection so; its InterfaceError is a misuse (a closed
    cursor), a bug to see as one."""
    if not isinstance(exc, OperationalError):
        return False
    return sqlstate_away(getattr(exc.__cause__, "sqlstate", None))


def sqlstate_away(sqlstate: str | None) -> bool:
    """Whether an OperationalError's SQLSTATE (None: libpq's own failure,
    no server answered) says the server is unreachable or shutting down."""
    return sqlstate is None or sqlstate.startswith("08") or sqlstate in _UNAVAILABLE_SQLSTATES
