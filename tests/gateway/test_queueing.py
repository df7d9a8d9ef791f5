"""The client watch (gateway.queueing.ClientWatch): it tells a request that
its client went away, and once stopped it leaves nothing behind."""

from __future__ import annotations

import asyncio
import gc
import weakref

from gateway.queueing import ClientWatch


def test_a_watch_hears_the_client_leave():
    async def go():
        left = asyncio.Event()

        async def receive():
            await left.wait()
            return {"type": "http.disconnect"}

        watch = ClientWatch(receive)
        watch.start()
        await asyncio.sleep(0)
        assert not watch.is_set()
        left.set()
        await asyncio.wait_for(watch.wait(), 1)
        return watch.is_set()

    assert asyncio.run(go()) is True


def test_a_stopped_watch_is_freed_at_once_not_left_to_the_collector():
    """A watch stopped while its client is still there (every stream, once
    answered) ended as a cancelled task holding its CancelledError, whose
    traceback held the watch: a cycle per stream for the garbage collector.
    Now nothing keeps it once dropped."""

    async def go():
        async def receive():
            await asyncio.Event().wait()  # the client stays

        watch = ClientWatch(receive)
        watch.start()
        await asyncio.sleep(0)  # the watch waits on receive()
        watch.stop()
        for _ in range(3):
            await asyncio.sleep(0)  # the cancellation runs through
        assert not watch.is_set()  # stopped is not gone
        ref = weakref.ref(watch)
        del watch
        return ref

    gc.disable()
    try:
        assert asyncio.run(go())() is None
    finally:
        gc.enable()
