"""PostgreSQL's backend, plus: before the first connection of a process, make
sure the embedded server is running and the configured database exists.
Everything else (SQL, features, introspection) is Django's PostgreSQL."""

from __future__ import annotations

import threading
from pathlib import Path

import psycopg
from django.db.backends.postgresql import base

from config.embedded_postgres import (
    embedded_postgres_database_ensure,
    embedded_postgres_start,
    embedded_postgres_status,
)

_lock = threading.Lock()
_ensured: set[str] = set()


class DatabaseWrapper(base.DatabaseWrapper):
    def get_connection_params(self):
        options = self.settings_dict["OPTIONS_EMBEDDED"]
        data_dir = Path(options["data_dir"])
        if not options.get("start", True) and embedded_postgres_status(data_dir=data_dir) is None:
            # As libpq says of a server that is not there (an outage, core.outages).
            raise psycopg.OperationalError(
                f"the embedded PostgreSQL in {data_dir} is not running "
                "(start it: manage.py embedded_postgres start)"
            )
        with _lock:
            socket_dir, port = embedded_postgres_start(data_dir=data_dir)
            name = self.settings_dict["NAME"]
            # Only the configured database is created here; test databases are
            # the test runner's to create and drop.
            configured = self.settings_dict["OPTIONS_EMBEDDED"]["database"]
            if name and name == configured and name not in _ensured:
                embedded_postgres_database_ensure(socket_dir=socket_dir, port=port, name=name)
                _ensured.add(name)
        self.settings_dict["HOST"] = str(socket_dir)
        self.settings_dict["PORT"] = str(port)
        return super().get_connection_params()
