"""PostgreSQL's backend, plus: before the first connection of a process, make
sure the embedded server is running and the configured database exists.
Everything else (SQL, features, introspection) is Django's PostgreSQL."""

from __future__ import annotations

import threading
from pathlib import Path

from django.db.backends.postgresql import base

from config.embedded_postgres import embedded_postgres_database_ensure, embedded_postgres_start

_lock = threading.Lock()
_ensured: set[str] = set()


class DatabaseWrapper(base.DatabaseWrapper):
    def get_connection_params(self):
        data_dir = Path(self.settings_dict["OPTIONS_EMBEDDED"]["data_dir"])
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
