"""The gateway's own HTTP/1.1 client to replicas (gateway.upstream_http),
against raw servers that answer byte by byte as a test needs: kept-alive
connections reused, a chunked stream read as it comes, a replica closing
or never answering, a body larger than the read-ahead, a close the
replica sees."""

from __future__ import annotations

import asyncio

import pytest

from gateway.upstream_http import ConnectFailed, Dropped, UpstreamClient


class RawServer:
    """A loopback server whose `answer(reader, writer)` handles each
    connection; counts the connections it accepted and those that ended."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.connections = 0
        self.ended = asyncio.Event()

    async def __aenter__(self) -> RawServer:
        async def handle(reader, writer):
            self.connections += 1
            try:
                await self.answer(reader, writer)
            finally:
                self.ended.set()
                writer.close()

        self.server = await asyncio.start_server(handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1/x"
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()


async def read_request(reader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + await reader.readexactly(length)


def run(coro):
    return asyncio.run(coro)


def test_a_kept_alive_connection_serves_the_next_request():
    async def answer(reader, writer):
        while True:
            try:
                request = await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            body = request.split(b"\r\n\r\n", 1)[1]
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Queue-Time: 3\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            await writer.drain()

    async def go():
        async with RawServer(answer) as server, UpstreamClient(keepalive_seconds=4) as client:
            bodies = []
            for n in range(3):
                resp = await client.request(
                    "POST", server.url, b'{"n":%d}' % n, connect_timeout=1, read_timeout=2
                )
                assert (resp.status, resp.headers.get("X-Queue-Time")) == (200, "3")
                bodies.append(await resp.read())
                resp.release()
            return bodies, server.connections

    bodies, connections = run(go())
    assert bodies == [b'{"n":0}', b'{"n":1}', b'{"n":2}']
    assert connections == 1


def test_a_chunked_stream_is_read_as_it_comes():
    async def answer(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for part in (b"data: 1\n\n", b"data: 2\n\n"):
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            await writer.drain()
            await asyncio.sleep(0.2)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def go():
        async with RawServer(answer) as server, UpstreamClient(keepalive_seconds=4) as client:
            resp = await client.request("POST", server.url, connect_timeout=1, read_timeout=2)
            loop = asyncio.get_running_loop()
            seen = [(chunk, loop.time()) async for chunk in resp.chunks()]
            resp.release()
            return seen

    seen = run(go())
    assert [chunk for chunk, _ in seen] == [b"data: 1\n\n", b"data: 2\n\n"]
    assert seen[1][1] - seen[0][1] >= 0.15  # the first came before the second was sent


def test_a_replica_that_never_answers_times_out_and_one_that_refuses_fails_to_connect():
    async def answer(reader, writer):
        await asyncio.sleep(5)

    async def go():
        async with RawServer(answer) as server, UpstreamClient(keepalive_seconds=4) as client:
            with pytest.raises(TimeoutError):
                await client.request("POST", server.url, connect_timeout=1, read_timeout=0.3)
            port = server.server.sockets[0].getsockname()[1]
            server.server.close()
            await server.server.wait_closed()
            with pytest.raises(ConnectFailed):
                await client.request(
                    "GET", f"http://127.0.0.1:{port}/", connect_timeout=1, read_timeout=1
                )

    run(go())


def test_a_connection_closed_before_or_during_the_answer_is_dropped():
    async def closes_at_once(reader, writer):
        await read_request(reader)

    async def closes_mid_body(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part")
        await writer.drain()

    async def go():
        async with UpstreamClient(keepalive_seconds=4) as client:
            async with RawServer(closes_at_once) as server:
                with pytest.raises(Dropped) as before:
                    await client.request("POST", server.url, connect_timeout=1, read_timeout=2)
            async with RawServer(closes_mid_body) as server:
                resp = await client.request("POST", server.url, connect_timeout=1, read_timeout=2)
                with pytest.raises(Dropped) as during:
                    await resp.read()
                resp.release()
        return before.value, during.value

    before, during = run(go())
    assert before.before_response is True
    assert during.before_response is False


def test_a_body_larger_than_the_read_ahead_arrives_whole_and_a_close_reaches_the_replica():
    big = bytes(range(256)) * (5 * 4096)  # 5 MiB: reading pauses and resumes

    async def answer(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(big))
        writer.write(big)
        await writer.drain()
        await read_request(reader)  # the next request, which the client closes
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        await reader.read()  # until the client closes

    async def go():
        async with RawServer(answer) as server, UpstreamClient(keepalive_seconds=4) as client:
            resp = await client.request("GET", server.url, connect_timeout=1, read_timeout=2)
            got = b""
            async for chunk in resp.chunks():
                got += chunk
                await asyncio.sleep(0.001)  # a slow reader
            resp.release()
            resp = await client.request("GET", server.url, connect_timeout=1, read_timeout=2)
            async for _chunk in resp.chunks():
                resp.close()  # as a cut request does
                break
            await asyncio.wait_for(server.ended.wait(), 2)
            return got, server.connections

    got, connections = run(go())
    assert got == big
    assert connections == 1  # the big body's connection served the second request


def test_a_reader_waiting_on_the_body_hears_of_a_close_at_once():
    """As when a running request is cut (gateway.outcome.Cut): the relay
    waiting for the next chunk ends then, not at its read timeout."""

    async def answer(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        await writer.drain()
        await reader.read()

    async def go():
        async with RawServer(answer) as server, UpstreamClient(keepalive_seconds=4) as client:
            resp = await client.request("POST", server.url, connect_timeout=1, read_timeout=30)
            loop = asyncio.get_running_loop()
            loop.call_later(0.2, resp.close)
            started = loop.time()
            with pytest.raises(Dropped):
                await resp.read()
            return loop.time() - started

    assert run(go()) < 2


def test_a_response_done_with_is_freed_at_once_not_left_to_the_collector():
    """A response and its parser referred to each other: every request left
    a cycle for the garbage collector, whose passes were then a tenth of the
    gateway's CPU. Released or closed, it is freed by its last
    reference."""
    import gc
    import weakref

    async def answer(reader, writer):
        while True:
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()

    async def go():
        refs = []
        async with RawServer(answer) as server, UpstreamClient(keepalive_seconds=4) as client:
            for n in range(4):
                resp = await client.request(
                    "POST", server.url, b"{}", connect_timeout=1, read_timeout=2
                )
                if n < 3:
                    assert await resp.read() == b"{}"
                    resp.release()
                else:
                    resp.close()  # left unread: the connection closed
                refs.append(weakref.ref(resp))
                del resp
        return refs

    gc.disable()
    try:
        refs = run(go())
        assert [ref() for ref in refs] == [None] * 4
    finally:
        gc.enable()
