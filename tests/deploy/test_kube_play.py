"""The Kubernetes `cpu` overlay run for real on one machine: rendered by
kubectl kustomize (overlay podman-test: every pod on the host's network,
ports moved off the host's own services, PostgreSQL and Redis as
Deployments), reduced to what podman 4.3 runs (tests/deploy/k8s_podman.py
lists what it drops: Services, the HPA, the PDB, the NetworkPolicy,
readiness probes...), played with `podman kube play` from the images built
from this checkout; then one request through its gateway with the openai
client, and its row in the ledger."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from tests.config.test_kubernetes import render
from tests.deploy.k8s_podman import podman_playable
from tests.deploy.podman import ROOT, podman

pytestmark = [pytest.mark.vllm]  # vLLM-CPU's image

WEB, GATEWAY, OPERATOR = 18000, 18080, 19090  # overlays/podman-test/ports.yaml

SEED = """
import json
from django.conf import settings
from django.core.management import call_command
from demo.seeds.billing import prices_demo_seed
call_command("seed_demo", verbosity=0)
prices_demo_seed()
print(json.dumps(json.loads(settings.DEMO_KEYS_FILE.read_text())))
"""


LEDGER_ROW = """
import json, time
from metering.models import UsageEvent
for _ in range(60):
    row = UsageEvent.objects.filter(request_id="REQUEST_ID").values_list(
        "tenant__slug", "prompt_tokens", "completion_tokens").first()
    if row: break
    time.sleep(0.5)
print(json.dumps(row))
"""


def _images_of(text: str, images, *, every: bool = True) -> str:
    """The overlay names `:latest` (and the datastores' versions); the tests
    build their own tag."""
    for local, built in (
        ("localhost/gpu-ledger:latest", images.app),
        ("localhost/gpu-ledger-vllm-cpu:latest", images.vllm_cpu),
        ("localhost/gpu-ledger-postgres:15", images.postgres),
        ("localhost/gpu-ledger-redis:7", images.redis),
    ):
        assert local in text or not every, local
        text = text.replace(local, built)
    return text


def _container(pod_prefix: str, name: str) -> str:
    listing = json.loads(podman("ps", "--format", "json").stdout)
    names = [
        n for c in listing for n in c["Names"] if n.startswith(pod_prefix) and n.endswith(name)
    ]
    assert names, f"no running container {pod_prefix}...{name}"
    return names[0]


def _wait(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{url} never answered 200 within {timeout:.0f} s")
        time.sleep(2)


@pytest.fixture(scope="module")
def played(images, tmp_path_factory):
    work = tmp_path_factory.mktemp("kube")
    play = podman_playable(render("overlays/podman-test"))
    stages = []
    _images_of(play.yaml(), images)  # every image the overlay names is one built here
    for number, documents in enumerate(play.stages, start=1):
        stages.append(work / f"play-{number}.yaml")
        stages[-1].write_text(_images_of(play.yaml(documents), images, every=False))
    _pods_remove(play)  # what a killed run left
    for name, secret in play.secrets.items():
        podman("secret", "rm", name, check=False)
        (work / f"{name}.json").write_text(secret)
        podman("secret", "create", name, str(work / f"{name}.json"))
    for name, owner in play.volumes.items():  # writable by the pod's user, as in Kubernetes
        podman("volume", "rm", "-f", name, check=False)
        options = ["--opt", f"o=uid={owner[0]},gid={owner[1]}"] if owner else []
        podman("volume", "create", *options, name)
    try:
        podman("kube", "play", str(stages[0]), timeout=600)
        deadline = time.monotonic() + 300
        while (state := _state("migrate-migrate"))["Status"] != "exited":
            assert time.monotonic() < deadline, "migrate still running after 300 s"
            time.sleep(2)
        assert state["ExitCode"] == 0, "migrate failed"
        podman("kube", "play", str(stages[1]), timeout=600)
        yield play
    finally:
        logs = ROOT / "test-artifacts"
        logs.mkdir(exist_ok=True)
        for c in json.loads(podman("ps", "-a", "--format", "json").stdout):
            name = c["Names"][0]
            if name.split("-")[0] in ("web", "gateway", "worker", "beat", "vllm", "migrate"):
                out = podman("logs", "--tail", "200", name, check=False)
                (logs / f"kube-{name}.log").write_text(out.stdout + out.stderr)
        for stage in reversed(stages):
            podman("kube", "down", str(stage), check=False, timeout=300)
        _pods_remove(play)  # kube down stops at the first pod it cannot remove
        for name in play.secrets:
            podman("secret", "rm", name, check=False)
        for name in play.volumes:
            podman("volume", "rm", "-f", name, check=False)


def _pods_remove(play) -> None:
    """Every pod the play makes (a Deployment's is NAME-pod-0)."""
    for document in play.documents:
        name = document["metadata"]["name"]
        if document["kind"] in ("Pod", "Deployment"):
            pod = name if document["kind"] == "Pod" else f"{name}-pod-0"
            podman("pod", "rm", "-f", "-t", "5", pod, check=False, timeout=120)


def _state(container: str) -> dict:
    return json.loads(podman("inspect", container).stdout)[0]["State"]


def test_what_podman_cannot_run_is_named(played):
    dropped = "\n".join(played.dropped)
    for kind in ("Service/gateway:", "HorizontalPodAutoscaler/", "PodDisruptionBudget/",
                 "NetworkPolicy/", "Job/migrate:"):  # fmt: skip
        assert kind in dropped
    kinds = {d["kind"] for d in played.documents}
    assert kinds <= {"Pod", "Deployment", "ConfigMap", "PersistentVolumeClaim"}


def test_one_request_through_the_played_gateway_is_metered(played):
    _wait(f"http://127.0.0.1:{WEB}/healthz", timeout=300)
    _wait(f"http://127.0.0.1:{OPERATOR}/healthz", timeout=300)
    web = _container("web-", "-web")
    seeded = podman("exec", "-i", web, "python", "manage.py", "shell", input=SEED)
    keys = json.loads(seeded.stdout.splitlines()[-1])
    client = openai.OpenAI(
        base_url=f"http://127.0.0.1:{GATEWAY}/v1", api_key=keys["hooli"], max_retries=0
    )
    deadline = time.monotonic() + 420  # vLLM starts, then its sidecar registers it
    while True:
        try:
            raw = client.chat.completions.with_raw_response.create(
                model="tiny-llama", messages=[{"role": "user", "content": "hi"}], max_tokens=8
            )
            break
        except openai.APIStatusError as error:
            if time.monotonic() > deadline:
                raise AssertionError(f"the played gateway never served: {error}") from None
            time.sleep(3)
    request_id, usage = raw.headers["x-request-id"], raw.parse().usage
    ledger = LEDGER_ROW.replace("REQUEST_ID", request_id)
    row = json.loads(
        podman("exec", "-i", web, "python", "manage.py", "shell", input=ledger).stdout.splitlines()[
            -1
        ]
    )
    assert row == ["hooli", usage.prompt_tokens, usage.completion_tokens]
    assert httpx.get(f"http://127.0.0.1:{GATEWAY}/metrics").status_code == 404
    metrics = httpx.get(f"http://127.0.0.1:{OPERATOR}/metrics").text
    assert 'gateway_requests_total{model="tiny-llama",status="ok",tenant="hooli"}' in metrics
