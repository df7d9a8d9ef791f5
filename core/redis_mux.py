"""One Redis connection shared by every request of a process, for the calls
on a request's hot path (the spend accounts' scripts, billing.spend.accounts;
the admission limits', gateway.admission).

redis-py's asyncio client checks a connection out of its pool for each
call, writes, awaits the reply and checks it back in: about 0.3 ms of this
machine's CPU per call, twice per held request. Redis answers the commands
of one connection in the order it got them, so a single connection can
carry every caller's commands at once: a call here encodes its command,
writes it, and awaits a future that the connection's reader resolves in
order (pipelining without a pipeline object: concurrent calls share TCP
segments and Redis's reads). A lost connection fails the calls waiting on
it with ConnectionError, and the next call connects again.

Scripts are run by their SHA1 (EVALSHA), loaded on the first NOSCRIPT."""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from collections import deque
from collections.abc import Sequence

import hiredis

CONNECT_TIMEOUT = 5.0
# A Redis that stops answering: its connection is dropped (failing the
# calls on it) once a reply is this late, checked each second.
COMMAND_TIMEOUT = 5.0


class RedisReplyError(Exception):
    """Redis answered a command with an error."""


def _encode(args: Sequence) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, bytes):
            data = arg
        elif isinstance(arg, str):
            data = arg.encode()
        else:
            data = str(arg).encode()  # int and float: Redis reads their decimal text
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.reader = hiredis.Reader()
        self.waiting: deque[tuple[asyncio.Future, float]] = deque()  # (reply, sent at)
        self.transport: asyncio.Transport | None = None
        self.lost: Exception | None = None
        self._loop = asyncio.get_running_loop()
        self._watch = self._loop.call_later(1.0, self._watchdog)

    def connection_made(self, transport) -> None:
        self.transport = transport

    def send(self, args: Sequence) -> asyncio.Future:
        future = self._loop.create_future()
        self.waiting.append((future, self._loop.time()))
        self.transport.write(_encode(args))
        return future

    def _watchdog(self) -> None:
        """A reply overdue by COMMAND_TIMEOUT: the connection is dropped,
        failing its calls, and the next call connects again."""
        if self.lost is not None:
            return
        if self.waiting and self._loop.time() - self.waiting[0][1] > COMMAND_TIMEOUT:
            self.transport.abort()
            return
        self._watch = self._loop.call_later(1.0, self._watchdog)

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while True:
            reply = self.reader.gets()
            if reply is False:
                return
            future = self.waiting.popleft()[0]
            if not future.done():  # its caller may have been cancelled
                future.set_result(reply)

    def connection_lost(self, exc) -> None:
        self._watch.cancel()
        self.lost = ConnectionError(f"Redis connection lost: {exc or 'closed'}")
        while self.waiting:
            future = self.waiting.popleft()[0]
            if not future.done():
                future.set_exception(self.lost)


async def _call(protocol: _Protocol, args: Sequence):
    reply = await protocol.send(args)
    if isinstance(reply, hiredis.ReplyError):
        raise RedisReplyError(str(reply))
    return reply


class MuxRedis:
    def __init__(self, url: str) -> None:
        from redis.connection import parse_url

        self._params = parse_url(url)
        self._tls = url.startswith("rediss://")
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Future | None = None
        self._loaded: set[bytes] = set()

    async def _connection(self) -> _Protocol:
        protocol = self._protocol
        if protocol is not None and protocol.lost is None:
            return protocol
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
        try:
            return await asyncio.shield(self._connecting)
        finally:
            if self._connecting is not None and self._connecting.done():
                self._connecting = None

    async def _connect(self) -> _Protocol:
        params = self._params
        loop = asyncio.get_running_loop()
        if params.get("path"):  # unix://
            opening = loop.create_unix_connection(_Protocol, params["path"])
        else:
            opening = loop.create_connection(
                _Protocol,
                params.get("host", "localhost"),
                params.get("port", 6379),
                ssl=ssl.create_default_context() if self._tls else None,
            )
        _, protocol = await asyncio.wait_for(opening, CONNECT_TIMEOUT)
        # Authenticated and its database selected before it is handed to
        # any caller: a command written between AUTH and SELECT would run
        # in database 0.
        try:
            if params.get("password"):
                who = [params["username"]] if params.get("username") else []
                await _call(protocol, ("AUTH", *who, params["password"]))
            if params.get("db"):
                await _call(protocol, ("SELECT", params["db"]))
        except BaseException:
            protocol.transport.close()  # refused: the next call connects again
            raise
        self._protocol = protocol
        return protocol

    async def command(self, *args):
        protocol = self._protocol
        if protocol is None or protocol.lost is not None:
            protocol = await self._connection()
        return await _call(protocol, args)

    async def run_script(self, script: Script, keys: Sequence, args: Sequence, *, write=True):
        """`script` by its SHA1 (loaded first when Redis does not know it).
        `write`: whether it writes (a cluster waits for a replica to hold it,
        core.redis_mux_cluster; one server has nothing to wait for)."""
        if script.sha in self._loaded:
            try:
                return await self.command("EVALSHA", script.sha, len(keys), *keys, *args)
            except RedisReplyError as exc:
                if not str(exc).startswith("NOSCRIPT"):
                    raise
                self._loaded.discard(script.sha)  # Redis restarted, or SCRIPT FLUSH
        await self.command("SCRIPT", "LOAD", script.source)
        self._loaded.add(script.sha)
        return await self.command("EVALSHA", script.sha, len(keys), *keys, *args)

    async def close(self) -> None:
        if self._protocol is not None and self._protocol.transport is not None:
            self._protocol.transport.close()
        self._protocol = None


class Script:
    """A Lua script, run by its SHA1 (`MuxRedis.run_script`)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest().encode()  # noqa: S324 (Redis's id)
