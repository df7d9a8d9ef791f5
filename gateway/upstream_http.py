"""The gateway's HTTP/1.1 client for its calls to replicas: kept-alive
connections per replica, the response parsed by httptools (llhttp, in C),
nothing else. Profiled against the instant fake upstream, aiohttp's client
cost about 315 µs of CPU per request and this one about 95 µs (most of it
the system calls), on a gateway spending about 700 µs per request in all
(docs/benchmarks.md): its request objects, header multidicts,
payload registry, tracing hooks and timers are what a proxy does not need.

    client = UpstreamClient(keepalive_seconds=4)
    resp = await client.request("POST", url, body, headers, connect_timeout=2,
                                read_timeout=120)
    resp.status, resp.headers.get("content-type")
    raw = await resp.read()              # or: async for chunk in resp.chunks()
    resp.release()                       # back to the pool, or closed if unfinished
    resp.close()                         # close the connection (the engine aborts)

Errors: ConnectFailed (no connection), Dropped (the connection ended
before the response did; `before_response` when nothing came at all, as
when a replica closes a kept-alive connection just as it is reused), and
TimeoutError (no connection, or no data, in time)."""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterator
from functools import lru_cache
from urllib.parse import urlsplit

import httptools

# Read no further ahead of the relay than this (the client reading slowly):
# the replica's socket then fills and it waits, instead of our memory.
PAUSE_ABOVE = 1 << 20
RESUME_BELOW = 1 << 16


class UpstreamError(Exception):
    """The call failed (its message says how)."""


class ConnectFailed(UpstreamError):
    pass


class Dropped(UpstreamError):
    def __init__(self, message: str, *, before_response: bool) -> None:
        super().__init__(message)
        self.before_response = before_response


class Headers(dict):
    """A response's headers by lower-case name (the last of a repeated one)."""

    def get(self, name: str, default=None):  # type: ignore[override]
        return super().get(name.lower(), default)


@lru_cache(maxsize=4096)
def _target(url: str) -> tuple[tuple[str, int, bool], bytes, bytes]:
    """(pool key, request target, Host header) of a URL."""
    parts = urlsplit(url)
    secure = parts.scheme == "https"
    port = parts.port or (443 if secure else 80)
    host = parts.hostname or ""
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return (host, port, secure), target.encode(), (parts.netloc or host).encode()


class _Connection(asyncio.Protocol):
    """One connection to a replica; carries one response at a time."""

    def __init__(self, client: UpstreamClient, key: tuple) -> None:
        self.client = client
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.response: UpstreamResponse | None = None
        self.closed = False
        self.idle_since = 0.0  # ok-float: loop time

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None:  # nothing was asked: not ours to read
            self.close()
            return
        try:
            response.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            response.fail(Dropped(f"malformed response: {exc}", before_response=False))
            self.close()

    def eof_received(self) -> bool:
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.response is not None:
            self.response.lost(exc)
        else:
            self.client.forget(self)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class UpstreamResponse:
    """A response as it arrives: status and headers first, then the body
    (httptools' callbacks feed it)."""

    def __init__(self, conn: _Connection, read_timeout: float) -> None:
        self._conn = conn
        self._loop = asyncio.get_running_loop()
        self._read_timeout = read_timeout
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers = Headers()
        self._header_name = b""
        self._body: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._started = False  # the status line and headers are in
        self._complete = False  # the whole body is in
        self._keep_alive = False  # the replica keeps the connection (read as it completes)
        self._error: BaseException | None = None
        self._waiter: asyncio.Future | None = None

    # --- httptools' callbacks ----------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self._started = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)
        self._buffered += len(body)
        if self._buffered > PAUSE_ABOVE and not self._paused:
            self._paused = True
            self._conn.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self._keep_alive = self.parser.should_keep_alive()  # reset once the message ends
        self._complete = True
        self._wake()

    # --- the connection's ---------------------------------------------------
    def fail(self, error: BaseException) -> None:
        if self._error is None and not self._complete:
            self._error = error
        self._wake()

    def lost(self, exc: Exception | None) -> None:
        if not self._complete:
            detail = f": {exc}" if exc else ""
            if self._started:
                self.fail(Dropped(f"the replica closed the connection mid-response{detail}",
                                  before_response=False))  # fmt: skip
            else:
                self.fail(Dropped(f"the replica closed the connection{detail}",
                                  before_response=True))  # fmt: skip
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        """Until something arrives, at most the read timeout."""
        self._waiter = waiter = self._loop.create_future()
        timer = self._loop.call_later(self._read_timeout, _time_out, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    async def started(self) -> None:
        while not self._started:
            if self._error is not None:
                raise self._error
            await self._wait()

    # --- the caller's -------------------------------------------------------
    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives: whatever has come since the last chunk."""
        while True:
            if self._body:
                chunk = self._body[0] if len(self._body) == 1 else b"".join(self._body)
                self._body.clear()
                self._buffered = 0
                if self._paused:
                    self._paused = False
                    self._conn.transport.resume_reading()
                yield chunk
            elif self._complete:
                return
            elif self._error is not None:
                raise self._error
            else:
                await self._wait()

    async def read(self) -> bytes:
        parts = [chunk async for chunk in self.chunks()]
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def release(self) -> None:
        """The connection back to the pool if the response ended and the
        replica keeps it alive; closed otherwise (a response left unread)."""
        # The parser holds this response's callbacks and the response its
        # parser: a reference cycle per request, left to the garbage
        # collector. Nothing is fed to it once released or closed.
        self.parser = None
        conn = self._conn
        if conn.response is not self:
            return
        conn.response = None
        if self._complete and self._keep_alive and not conn.closed:
            self._conn.client.keep(conn)
        else:
            conn.close()

    def close(self) -> None:
        """Close the connection: the replica sees the client gone (vLLM
        then aborts the request)."""
        self.parser = None  # the cycle with it broken (see release)
        conn = self._conn
        if conn.response is self:
            conn.response = None
        conn.close()
        # Whoever waits on the body hears of it now, not at its read timeout.
        self.fail(Dropped("the gateway closed the connection", before_response=not self._started))


def _time_out(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class UpstreamClient:
    def __init__(self, *, keepalive_seconds: float) -> None:
        self._keepalive = keepalive_seconds
        self._idle: dict[tuple, deque[_Connection]] = {}
        self._ssl: ssl.SSLContext | None = None

    async def get(self, url: str, *, timeout: float) -> tuple[int, bytes]:
        """GET `url` whole within `timeout` seconds: (status, body); the
        timeout (TimeoutError) or a connection's failure is raised."""
        async with asyncio.timeout(timeout):
            response = await self.request("GET", url, connect_timeout=timeout, read_timeout=timeout)
            try:
                return response.status, await response.read()
            finally:
                response.close()

    async def request(
        self,
        method: str,
        url: str,
        body: bytes = b"",
        headers: list[tuple[bytes, bytes]] | None = None,
        *,
        connect_timeout: float,
        read_timeout: float,
    ) -> UpstreamResponse:
        """Send the request; return once the response's status and headers
        are in (its body still to read: `read`, `chunks`; then `release`)."""
        key, target, host = _target(url)
        conn = self._idle_connection(key) or await self._connect(key, connect_timeout)
        response = UpstreamResponse(conn, read_timeout)
        conn.response = response
        head = [
            method.encode(), b" ", target, b" HTTP/1.1\r\nHost: ", host,
            b"\r\nContent-Length: ", str(len(body)).encode(), b"\r\n",
        ]  # fmt: skip
        for name, value in headers or ():
            head += (name, b": ", value, b"\r\n")
        head.append(b"\r\n")
        conn.transport.write(b"".join(head) + body)
        try:
            await response.started()
        except BaseException:
            response.close()
            raise
        return response

    def _idle_connection(self, key: tuple) -> _Connection | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        now = asyncio.get_running_loop().time()
        while idle:
            conn = idle.pop()  # the most recently used: the least likely closed
            if not conn.closed and now - conn.idle_since < self._keepalive:
                return conn
            conn.close()
        return None

    async def _connect(self, key: tuple, timeout: float) -> _Connection:
        host, port, secure = key
        if secure and self._ssl is None:
            self._ssl = ssl.create_default_context()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self, key),
                    host,
                    port,
                    ssl=self._ssl if secure else None,
                )
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {host}:{port}: {exc}") from None
        return conn

    def keep(self, conn: _Connection) -> None:
        conn.idle_since = asyncio.get_running_loop().time()
        self._idle.setdefault(conn.key, deque()).append(conn)

    def forget(self, conn: _Connection) -> None:
        """An idle connection the replica closed."""
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    async def close(self) -> None:
        for idle in self._idle.values():
            while idle:
                idle.pop().close()

    async def __aenter__(self) -> UpstreamClient:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()
