"""The ORM called from the gateway's event loop: on a worker thread, never
on the loop (a query would stall every request in flight), with that
thread's database connection closed first if it went stale or broke. The
gateway's threads live as long as the process, so a connection the
database dropped meanwhile (a restart, an idle timeout) would otherwise
fail the next call made on it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import close_old_connections

T = TypeVar("T")


async def orm(function: Callable[..., T], /, **kwargs: Any) -> T:
    """`function(**kwargs)` on a worker thread's fresh connection."""
    return await asyncio.to_thread(_fresh, function, kwargs)


def _fresh(function: Callable[..., T], kwargs: dict[str, Any]) -> T:
    close_old_connections()
    return function(**kwargs)
