"""Advisory locks, seen from a second PostgreSQL session: while Django's
connection holds a lock the other is refused (try) or kept waiting
(blocking), and gets it once the lock is released. The keys are the ones
written out in SQL (hashtext of a name; a namespace and an id), so jobs
locking by hand and through the helper exclude each other."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from django.db import connection, transaction

from core.locks import advisory_lock, advisory_lock_try, advisory_xact_lock
from tests.services import database_session

NAME = "core_locks_test"
PAIR = (7_202_611, 42)
SQL = {str: "hashtext(%s)", tuple: "%s, %s"}


def _params(key) -> list:
    return [key] if isinstance(key, str) else list(key)


@pytest.fixture
def other():
    """A second session on the test database."""
    connection.ensure_connection()
    session = database_session(autocommit=True)
    yield session
    session.execute("SELECT pg_advisory_unlock_all()")
    session.close()


def _other_try(other, key) -> bool:
    """Whether the other session gets `key` at once (released again if so)."""
    args = SQL[type(key)]
    got = other.execute(f"SELECT pg_try_advisory_lock({args})", _params(key)).fetchone()[0]
    if got:
        other.execute(f"SELECT pg_advisory_unlock({args})", _params(key))
    return got


def _other_blocks(other, key) -> bool:
    """Whether the blocking lock function keeps the other session waiting."""
    other.execute("SET lock_timeout = '300ms'")
    try:
        other.execute(f"SELECT pg_advisory_lock({SQL[type(key)]})", _params(key))
    except psycopg.errors.LockNotAvailable:
        return True
    finally:
        other.execute("RESET lock_timeout")
    other.execute(f"SELECT pg_advisory_unlock({SQL[type(key)]})", _params(key))
    return False


@pytest.mark.parametrize("key", [NAME, PAIR])
def test_a_session_lock_refuses_and_blocks_another_session_until_released(db, other, key):
    with advisory_lock(key):
        assert not _other_try(other, key)
        assert _other_blocks(other, key)
    assert _other_try(other, key)
    assert not _other_blocks(other, key)


@pytest.mark.parametrize("key", [NAME, PAIR])
def test_a_try_lock_is_refused_while_another_session_holds_it(db, other, key):
    other.execute(f"SELECT pg_advisory_lock({SQL[type(key)]})", _params(key))
    with advisory_lock_try(key) as locked:
        assert locked is False
    other.execute(f"SELECT pg_advisory_unlock({SQL[type(key)]})", _params(key))
    with advisory_lock_try(key) as locked:
        assert locked is True
        assert not _other_try(other, key)
    assert _other_try(other, key)


def test_a_try_lock_is_released_when_the_block_raises(db, other):
    with pytest.raises(RuntimeError), advisory_lock_try(NAME) as locked:
        assert locked
        raise RuntimeError("the work failed")
    assert _other_try(other, NAME)


def test_a_blocking_lock_waits_for_the_other_session(db, other):
    """The helper's side waits: a thread asking for the lock gets it only
    after the other session lets go."""
    other.execute("SELECT pg_advisory_lock(hashtext(%s))", [NAME])
    got = threading.Event()
    errors: list[BaseException] = []

    def take():
        try:
            with advisory_lock(NAME):
                got.set()
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)
        finally:
            connection.close()

    worker = threading.Thread(target=take)
    worker.start()
    try:
        time.sleep(0.5)
        assert not got.is_set()
        waiting = other.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        ).fetchone()[0]
        assert waiting == 1
    finally:
        other.execute("SELECT pg_advisory_unlock(hashtext(%s))", [NAME])
        worker.join(timeout=10)
    assert errors == []
    assert got.is_set()


def test_a_transaction_lock_is_held_until_the_transaction_ends(transactional_db, other):
    with advisory_xact_lock(NAME):
        assert connection.in_atomic_block
        assert not _other_try(other, NAME)
        assert _other_blocks(other, NAME)
    assert _other_try(other, NAME)

    with pytest.raises(RuntimeError), advisory_xact_lock(PAIR):
        raise RuntimeError("rolled back")
    assert _other_try(other, PAIR)


def test_inside_an_outer_transaction_the_lock_lasts_until_it_commits(transactional_db, other):
    with transaction.atomic():
        with advisory_xact_lock(NAME):
            pass
        assert not _other_try(other, NAME)
    assert _other_try(other, NAME)
