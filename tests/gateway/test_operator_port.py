"""The gateway's operator endpoints are closed to tenants: /metrics and the
detailed health answer only on the operator port (gateway/operator.py), the
tenants' port says only that it is alive, and with several workers one
scrape counts every request whichever worker served it (prometheus_client's
multiprocess mode). Real `manage.py gateway` processes, in front of the
fake replica."""

from __future__ import annotations

import os
import re
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from serving.choices import PoolKind
from serving.tiny_model import MODEL_NAME
from tests.fleet import (
    gateway_health,
    gateway_metrics,
    gateway_worker,
    start_gateway,
    stop_gateway,
    wait_for_fleet,
    wait_for_records_written,
)
from tests.services import free_port

pytestmark = [pytest.mark.slow]


def requests_ok(tenant: str) -> tuple:
    """The scrape's key of a tenant's requests answered ok."""
    return ("gateway_requests_total", (("model", MODEL_NAME), ("status", "ok"), ("tenant", tenant)))


def ask(gateway: str, secret: str) -> int:
    """One chat completion on a connection of its own (so the kernel hands
    each to whichever worker accepts first), answered with its status."""
    response = httpx.post(
        f"{gateway}/v1/chat/completions",
        headers={"Authorization": f"Bearer {secret}"},
        json={"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )
    return response.status_code


def test_the_tenant_port_tells_nothing_the_operator_port_tells_all(fleet, fake):
    """What the issue saw: a tenant's traffic in /metrics and a dedicated
    replica's name in /healthz, both on the port tenants call."""
    fleet.add_tenant("acme")
    fleet.add_tenant("hooli")
    dedicated = {"kind": PoolKind.DEDICATED, "owner": "acme"}
    fleet.add_replica("vllm-dedicated-acme", fake.base_url, "acme-dedicated", **dedicated)
    fleet.add_replica("vllm-shared", fake.base_url, "shared")
    fleet.ready()
    assert ask(fleet.gateway, fleet.secrets["acme"]) == 200
    assert ask(fleet.gateway, fleet.secrets["hooli"]) == 200

    tenant_port, operator_port = httpx.URL(fleet.gateway).port, httpx.URL(fleet.gateway.operator)
    assert operator_port.port != tenant_port

    refused = httpx.get(f"{fleet.gateway}/metrics", timeout=5)
    assert refused.status_code == 404
    assert refused.json()["error"]["type"] == "invalid_request_error"  # the gateway's error body
    slugs = [fleet.tenants[name].slug for name in ("acme", "hooli")]
    assert not any(slug in refused.text for slug in slugs)
    alive = httpx.get(f"{fleet.gateway}/healthz", timeout=5)
    assert alive.status_code == 200 and alive.json() == {"status": "ok"}
    for named in (*slugs, "vllm-dedicated-acme", "vllm-shared", "replica"):
        assert named not in alive.text

    # The operator still has it all: per-tenant series, the replicas by name.
    scraped = gateway_metrics(fleet.gateway)
    for tenant in ("acme", "hooli"):
        assert scraped[requests_ok(fleet.tenants[tenant].slug)] == 1
    worker = gateway_worker(fleet.gateway)
    assert set(worker["queue"]["replicas"]) == {"vllm-dedicated-acme", "vllm-shared"}
    assert worker["replicas"] == 2
    answer = httpx.get(f"{fleet.gateway.operator}/v1/models", timeout=5)
    assert answer.status_code == 404  # the operator port serves no tenant traffic


def test_two_workers_one_scrape_counts_every_request(fleet, fake):
    """Requests on connections of their own until both workers served some
    (each worker's records written, from its own section of the operator's
    health); the one scrape's counters are the sums of what was sent."""
    fleet.add_tenant("a")
    fleet.add_tenant("b")
    fleet.add_replica("fake", fake.base_url, "shared")
    proc, url = start_gateway(workers=2)
    try:
        health = gateway_health(url)
        assert health["status"] == "ok" and health["workers_expected"] == 2
        assert len({w["pid"] for w in health["workers"]}) == 2
        wait_for_fleet(url, replicas=1)
        sent = {"a": 0, "b": 0}
        with ThreadPoolExecutor(max_workers=8) as pool:
            for _round in range(25):
                tenants = ["a", "b"] * 8
                statuses = list(pool.map(lambda t: ask(url, fleet.secrets[t]), tenants))
                assert statuses == [200] * len(tenants)
                for tenant in tenants:
                    sent[tenant] += 1
                wait_for_records_written(url)
                flushed = [w["records_flushed"] for w in gateway_health(url)["workers"]]
                if all(flushed):
                    break
        assert all(flushed), f"one worker served every request: {flushed}"
        assert sum(flushed) == sum(sent.values())

        scraped = gateway_metrics(url)
        for tenant, count in sent.items():
            slug = fleet.tenants[tenant].slug
            assert scraped[requests_ok(slug)] == count
            tokens = (
                "gateway_tokens_total",
                (("kind", "completion"), ("model", MODEL_NAME), ("tenant", slug)),
            )
            assert scraped[tokens] == 3 * count  # the fake answers 3 tokens
        assert scraped[("gateway_records_flushed_total", ())] == sum(sent.values())
        # A gauge is the workers' sum (no series per process).
        assert scraped[("gateway_record_backlog", ())] == 0
        assert scraped[("gateway_queue_depth", (("priority_class", "normal"),))] == 0

        refused = httpx.get(f"{url}/metrics", timeout=5)
        assert refused.status_code == 404
        assert httpx.get(f"{url}/healthz", timeout=5).json() == {"status": "ok"}
    finally:
        stop_gateway(proc)


def test_a_worker_that_dies_is_replaced_and_its_counts_stay(fleet, fake):
    """uvicorn replaces a killed worker; the operator's health says so
    (503 until the new one answers), and what the dead one counted is
    still in the scrape."""
    fleet.add_tenant("a")
    fleet.add_replica("fake", fake.base_url, "shared")
    proc, url = start_gateway(workers=2)
    try:
        wait_for_fleet(url, replicas=1)
        with ThreadPoolExecutor(max_workers=8) as pool:
            assert set(pool.map(lambda _: ask(url, fleet.secrets["a"]), range(32))) == {200}
        wait_for_records_written(url)
        before = {w["pid"]: w["records_flushed"] for w in gateway_health(url)["workers"]}
        victim = max(before, key=before.get)
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while True:
            response = httpx.get(f"{url.operator}/healthz", timeout=10)
            pids = {w["pid"] for w in response.json()["workers"]}
            if response.status_code == 200 and victim not in pids and len(pids) == 2:
                break
            assert time.monotonic() < deadline, f"no replacement worker: {response.text}"
            time.sleep(0.2)
        scraped = gateway_metrics(url)
        assert scraped[requests_ok(fleet.tenants["a"].slug)] == 32
    finally:
        stop_gateway(proc)


@pytest.mark.parametrize(
    "options, setting, message",
    [
        (["--operator-port", "0"], None, "--operator-port / GATEWAY_OPERATOR_PORT must be a TCP"),
        ([], "", "GATEWAY_OPERATOR_PORT must be a TCP port from 1 to 65535, not ''"),
        ([], "ninety", "not 'ninety'"),
        (
            ["--port", "9191", "--operator-port", "9191"],
            None,
            "--operator-port and --port are both",
        ),
    ],
)
def test_an_operator_port_that_is_empty_zero_or_the_tenants_is_refused(
    settings, options, setting, message
):
    if setting is not None:
        settings.GATEWAY = {**settings.GATEWAY, "OPERATOR_PORT": setting}
    with pytest.raises(CommandError, match=re.escape(message)):
        call_command("gateway", *options)


def test_an_empty_operator_host_is_refused(settings):
    settings.GATEWAY = {**settings.GATEWAY, "OPERATOR_HOST": " "}
    with pytest.raises(CommandError, match="GATEWAY_OPERATOR_HOST is empty"):
        call_command("gateway")


def test_a_busy_operator_port_stops_the_gateway_before_it_serves():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(CommandError, match=f"cannot listen on 127.0.0.1 port {port}"):
            call_command("gateway", "--port", str(free_port()), "--operator-port", str(port))
