"""PostgreSQL advisory locks on Django's connection, so one worker at a
time does a piece of work across processes and hosts. A key is a name
(locked as hashtext(name)) or a (namespace, id) pair of integers.

A session lock is held until released, whatever the transactions in
between: `advisory_lock` waits for it, `advisory_lock_try` gives up at
once. `advisory_xact_lock` is a transaction that holds the lock until it
ends (the outermost one's commit or rollback)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

from django.db import connection, transaction

LockKey = str | tuple[int, int]

_Function = Literal[
    "pg_advisory_lock", "pg_try_advisory_lock", "pg_advisory_unlock", "pg_advisory_xact_lock"
]


def _call(function: _Function, key: LockKey):
    if isinstance(key, str):
        query, params = f"SELECT {function}(hashtext(%s))", [key]
    else:
        namespace, number = key
        query, params = f"SELECT {function}(%s, %s)", [namespace, number]
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchone()[0]


@contextmanager
def advisory_lock(key: LockKey) -> Iterator[None]:
    """Hold the session lock `key` for the block, waiting while another
    session holds it."""
    _call("pg_advisory_lock", key)
    try:
        yield
    finally:
        _call("pg_advisory_unlock", key)


@contextmanager
def advisory_lock_try(key: LockKey) -> Iterator[bool]:
    """Yield whether the session lock `key` was free; if so it is held for
    the block. Never waits."""
    locked = _call("pg_try_advisory_lock", key)
    try:
        yield locked
    finally:
        if locked:
            _call("pg_advisory_unlock", key)


@contextmanager
def advisory_xact_lock(key: LockKey) -> Iterator[None]:
    """A transaction (transaction.atomic) that first takes the lock `key`,
    waiting while another holds it; the lock is released when the
    transaction ends, not before."""
    with transaction.atomic():
        _call("pg_advisory_xact_lock", key)
        yield
