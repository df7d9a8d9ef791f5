"""The compose file's profile scale, its usage log: three NATS JetStream
nodes from the project's own image (deploy/images/nats, Debian's
nats-server), routing to each other as the file says, form one cluster; a
stream of three replicas takes writes, its leader's container is killed
and the stream goes on taking them (a new leader elected), a message sent
again is kept once, and the node started again catches up."""

from __future__ import annotations

import json

import pytest

from tests.deploy.compose import podman_compose, stack_make
from tests.deploy.podman import podman
from tests.services import require

pytestmark = [pytest.mark.containers]
NODES = ["nats-1", "nats-2", "nats-3"]

# Run in a container of the app image on the stack's network (nats-py is
# the product's own client); prints one JSON line.
CLIENT = """
import asyncio, json, sys, time
import nats
from nats.js.api import StreamConfig

async def main(step):
    nc = await nats.connect(["nats://nats-1:4222", "nats://nats-2:4222", "nats://nats-3:4222"],
                            max_reconnect_attempts=-1)
    js = nc.jetstream(timeout=5)
    deadline = time.monotonic() + 90
    while True:
        try:
            if step == "setup":
                config = StreamConfig(name="USAGE", subjects=["usage.>"], num_replicas=3)
                await js.add_stream(config)
            for n in range(100):
                at = n + (100 if step == "after" else 0)
                await js.publish("usage.p.0", b"x", headers={"Nats-Msg-Id": f"m{at}"})
            if step == "after":  # the first hundred again: duplicates, kept once
                for n in range(100):
                    await js.publish("usage.p.0", b"x", headers={"Nats-Msg-Id": f"m{n}"})
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1)
    while True:
        info = await js.stream_info("USAGE")
        current = all(r.current for r in info.cluster.replicas or [])
        if step != "caught-up" or (current and len(info.cluster.replicas) == 2):
            break
        assert time.monotonic() < deadline, info.cluster
        await asyncio.sleep(1)
    print(json.dumps({"messages": info.state.messages, "leader": info.cluster.leader,
                      "replicas": len(info.cluster.replicas or [])}))
    await nc.close()

asyncio.run(main(sys.argv[1]))
"""


def test_the_scale_profiles_nats_nodes_form_a_cluster_that_rides_out_its_leader_killed(images):
    require(podman_compose() is not None, "podman-compose (the dev extras install it)")
    stack = stack_make(images, project="glscale", profile="scale")
    stack.compose("down", "-v", "-t", "5", check=False)
    try:
        stack.compose("up", "-d", "--no-build", "--no-deps", *NODES)

        def client(step: str) -> dict:
            result = podman(
                "run", "--rm", "--network", f"{stack.project}_default", images.app,
                "python", "-c", CLIENT, step, timeout=180,
            )  # fmt: skip
            return json.loads(result.stdout.strip().splitlines()[-1])

        first = client("setup")
        assert first["messages"] == 100 and first["replicas"] == 2
        leader = first["leader"]
        assert leader in NODES
        podman("kill", stack.container(leader))
        after = client("after")
        assert after["messages"] == 200  # the duplicates kept once
        assert after["leader"] != leader
        podman("start", stack.container(leader))
        caught = client("caught-up")
        assert caught["messages"] == 200
    finally:
        for node in NODES:
            result = podman("logs", "--tail", "50", stack.container(node), check=False)
            print(f"--- {node}\n{result.stderr[-2000:]}")
        stack.compose("down", "-v", "-t", "5", check=False)
