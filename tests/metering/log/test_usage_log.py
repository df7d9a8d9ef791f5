"""The scaled usage path end to end, with real processes: `manage.py
gateway` publishing its spool to a three-node NATS JetStream cluster on
loopback, `manage.py usage_writer` processes taking the log into the
Delta table, two tenants billed in two currencies calling with the
official openai client. Every fault is caused for real (SIGKILL, the
whole cluster stopped), and every answered request is then found in the
store once, to the token."""

from __future__ import annotations

import json
import time

import orjson
import pytest
from django.utils import timezone

from metering.log.publisher import Publisher
from metering.log.store import RawStore
from serving.records import CompletedRequest
from tenants.services import service_key_create
from tests.conftest import client_for_key
from tests.fleet import start_gateway, stop_gateway, wait_for_fleet
from tests.usage_log import (
    Steady,
    log_config,
    log_env,
    log_settings,
    spooled,
    start_writer,
    stored,
    stream_info,
    wait_for,
    wait_for_stream,
)

pytestmark = pytest.mark.django_db(transaction=True)
URL = "/api/v1/usage/events"


def test_two_gateways_publish_and_two_writers_store_every_answered_request_once(
    world, nats_cluster, tmp_path
):
    store_dir = tmp_path / "store"
    env = log_env(nats_cluster, store_dir)
    writers = [start_writer(env, name, tmp_path) for name in ("w1", "w2")]
    one, url_one = start_gateway(env=env)
    two, url_two = start_gateway(env=env)
    try:
        wait_for_stream(log_config(nats_cluster, store_dir))
        for url in (url_one, url_two):
            wait_for_fleet(url, replicas=2)
        steady = Steady(world, [url_one, url_two]).start()
        time.sleep(6)
        steady.stop()
        want = steady.answered
        assert len(want) > 50, steady.failed[:3]
        assert not steady.failed, steady.failed[:3]
        store = RawStore(str(store_dir), stream="USAGE")
        wait_for(lambda: spooled(url_one) == spooled(url_two) == 0, timeout=30, what="spools empty")
        got = wait_for(
            lambda: (found := stored(store)).keys() >= want.keys() and found,
            timeout=30,
            what="every answered request in the store",
        )
        assert {rid: got[rid] for rid in want} == want
        rows = store.read().to_pylist()
        assert len(rows) == len({(r["request_id"], r["phase"]) for r in rows})  # none twice
        assert {r["tenant_id"] for r in rows} == {world.tenants["a"].id, world.tenants["b"].id}
        # Each replica's usage is in one partition, so one writer's hands.
        by_replica = {}
        for r in rows:
            by_replica.setdefault(r["replica_id"], set()).add(r["log_partition"])
        assert all(len(parts) == 1 for parts in by_replica.values()), by_replica
        # Both writers held partitions (the leases share them out).
        positions = store.positions(range(4))
        assert sum(1 for seq in positions.values() if seq) >= 2, positions
    finally:
        for gateway in (one, two):
            stop_gateway(gateway)
        for writer in writers:
            writer.stop()


def _record(world, n: int) -> CompletedRequest:
    now = timezone.now()
    replica = world.replicas["alpha"]
    return CompletedRequest(
        request_id=f"dup-{n}",
        tenant_id=world.tenants["b"].id,
        api_key_id=None,
        model=world.model.name,
        received_at=now,
        ended_at=now,
        status="ok",
        http_status=200,
        replica_id=replica.id,
        pool_id=replica.pool_id,
        prompt_tokens=11,
        completion_tokens=5,
    )


def test_the_same_records_published_twice_are_one_event_and_a_bad_one_is_dead_lettered(
    world, nats_cluster, tmp_path
):
    store_dir = tmp_path / "store"
    config = log_config(nats_cluster, store_dir)
    writer = start_writer(log_env(nats_cluster, store_dir), "w1", tmp_path)
    publisher = Publisher(config)
    try:
        wait_for_stream(config)
        records = [_record(world, n) for n in range(20)]
        publisher.publish(records)
        publisher.publish(records)  # a flush retried after a lost acknowledgement
        assert (publisher.published, publisher.duplicates) == (2, 1)
        assert stream_info(config).state.messages == 1
        store = RawStore(str(store_dir), stream="USAGE")
        wait_for(lambda: store.read().num_rows == 20, timeout=30, what="the message written")
        # Past the log's duplicate window the same records come as another
        # message (cut differently): two rows in the table, one event.
        publisher.publish(records[:10])
        publisher.publish(records[10:])
        assert stream_info(config).state.messages == 3
        wait_for(
            lambda: max(store.positions(range(4)).values()) == 3, timeout=30, what="all written"
        )
        assert store.read().num_rows == 40
        events = store.events().to_pylist()
        assert len(events) == 20
        assert sum(e["prompt_tokens"] for e in events) == 20 * 11
        assert {e["log_seq"] for e in events} == {1}  # the first on the log is the one kept

        # A record the ledger would refuse is dead-lettered naming its
        # field; the rest of its message is stored.
        bad = [_record(world, n) for n in range(100, 105)]
        bad[2].replica_id = 999_999
        publisher.publish(bad)
        wait_for(lambda: store.read().num_rows == 44, timeout=30, what="the good four stored")
        # In the writer's own file under the dead-letter directory, whole.
        (letter,) = (tmp_path / "dead-letter" / "w1.jsonl").read_text().splitlines()
        assert "replica_id: unknown replica 999999" in letter and "dup-102" in letter
        assert json.loads(letter)["record"]["prompt_tokens"] == 11
    finally:
        publisher.close()
        writer.stop()


def test_the_ingestion_api_on_the_scaled_path_queues_valid_batches_on_the_log(
    world, nats_cluster, tmp_path, settings
):
    """POST /api/v1/usage/events from another serving tier: a bad batch is
    a 400 naming the field with nothing published; a good one is a 202
    once the log holds it, and reaches the store as the API's, once, sent
    twice or not."""
    store_dir = tmp_path / "store"
    config = log_config(nats_cluster, store_dir)
    settings.USAGE_LOG = log_settings(nats_cluster, store_dir)  # as the writer has it
    writer = start_writer(log_env(nats_cluster, store_dir), "w1", tmp_path)
    _key, secret = service_key_create(name="edge fleet")
    reporter = client_for_key(secret)
    try:
        wait_for_stream(config)
        events = [orjson.loads(_record(world, n).to_bytes()) for n in range(3)]
        events[1]["tenant_id"], events[1]["tenant"] = None, world.tenants["a"].slug
        bad = [dict(events[0], request_id="bad-1", prompt_tokens=-1)]
        refused = reporter.post(URL, {"events": [*events, *bad]}, format="json")
        assert refused.status_code == 400
        assert refused.json()["error"]["field"] == "events.3.prompt_tokens"
        assert stream_info(config).state.messages == 0  # nothing of it published

        for _ in range(2):  # the same batch again: kept once
            queued = reporter.post(URL, {"events": events}, format="json")
            assert queued.status_code == 202, queued.json()
            assert queued.json()["queued"] == 3
            assert {r["status"] for r in queued.json()["results"]} == {"queued"}
        store = RawStore(str(store_dir), stream="USAGE")
        wait_for(lambda: store.events().num_rows == 3, timeout=30, what="the batch stored")
        rows = store.events().to_pylist()
        assert {r["source"] for r in rows} == {"api"}
        assert {r["tenant_id"] for r in rows} == {world.tenants["a"].id, world.tenants["b"].id}

        nats_cluster.kill(stream_info(config).cluster.leader)
        for node in nats_cluster.nodes:
            if node.alive:
                nats_cluster.kill(node.name)
        away = reporter.post(URL, {"events": events}, format="json")
        assert away.status_code == 503
        assert away.json()["error"]["code"] == "usage_log_unavailable"
        assert away["Retry-After"] == "1"
    finally:
        writer.stop()
