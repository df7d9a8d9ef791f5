"""A writer never steps over a message its consumer failed to deliver.

The writers read with ephemeral consumers that ask for no acks: a pull
answered after its wait ran out, or a consumer made again on a new stream
leader, can leave a delivery missing. The consumer numbers its deliveries
1, 2, 3...; a number skipped means the writer reads again from the last
stream sequence it has, with a new consumer. Driven here with a
subscription that skips one delivery (the failover tests in
test_usage_log_faults cause the real thing, without telling when)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from unittest import mock

from metering.log.stream import LogConfig
from metering.log.writer import Writer, _Partition


def _delivery(consumer: int, stream: int):
    sequence = SimpleNamespace(consumer=consumer, stream=stream)
    return SimpleNamespace(metadata=SimpleNamespace(sequence=sequence), data=stream, headers={})


class _Subscription:
    def __init__(self, deliveries):
        self.deliveries = list(deliveries)

    async def fetch(self, batch, timeout):
        found, self.deliveries = self.deliveries, []
        return found

    async def unsubscribe(self):
        pass


class _JetStream:
    def __init__(self, *consumers):
        self.consumers = list(consumers)
        self.started_at = []  # each consumer's first stream sequence

    async def pull_subscribe(self, subject, *, durable, stream, config):
        self.started_at.append(config.opt_start_seq)
        return self.consumers.pop(0)


def test_a_delivery_skipped_is_read_again_by_a_new_consumer_not_stepped_over(tmp_path):
    config = LogConfig(
        servers=["nats://127.0.0.1:1"],
        stream="USAGE",
        partitions=4,
        replicas=1,
        max_age_seconds=3600,
        publish_timeout=1.0,
        store_url=str(tmp_path / "store"),
        lease_seconds=10.0,
        commit_seconds=1.0,
        commit_events=1000,
        dead_letter_dir=str(tmp_path / "dead"),
    )
    writer = Writer(config, writer_id="w")
    # Stream sequences 10, 14, 18, 22 are partition 2's; the first consumer
    # delivers 10 and 14, then misses 18 (its delivery 3) and hands over 22.
    first = _Subscription([_delivery(1, 10), _delivery(2, 14), _delivery(4, 22)])
    second = _Subscription([_delivery(1, 18), _delivery(2, 22)])
    writer._js = _JetStream(first, second)
    partition = _Partition(2, revision=1, renewed=0.0, committed=9, read_to=9)

    async def read_twice():
        await writer._fetch(partition)
        assert (partition.read_to, partition.subscription) == (14, None)
        await writer._fetch(partition)

    with mock.patch("metering.log.writer.events", lambda data, headers: [{"seq": data}]):
        asyncio.run(read_twice())
    assert [seq for _, seq in partition.events] == [10, 14, 18, 22]
    assert writer._js.started_at == [10, 15]  # the second from just past what was read
    assert (writer.stats.gaps, writer.stats.messages, partition.read_to) == (1, 4, 22)
