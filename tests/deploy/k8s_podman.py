"""What of a rendered Kubernetes stack `podman kube play` (podman 4.3) can
run on one machine, and a list of everything it could not.

podman kube play creates Pods, Deployments (a pod per replica),
PersistentVolumeClaims (volumes), ConfigMaps and Secrets; it skips every
other kind. Of a pod it runs the containers and init containers, their
environment (ConfigMaps, Secrets), volumes (emptyDir, PVC, hostPath,
ConfigMap), resource limits, the containers' own securityContext, and the
liveness probe as a healthcheck. So, from a `kubectl kustomize` rendering:

- Secrets are taken out of the YAML and given as podman secrets to create
  first (`podman secret create NAME FILE`, FILE the JSON of
  PodmanPlay.secrets): podman 4.3 stores a Secret it plays as YAML but
  reads a secretKeyRef's secret as JSON ("secret ... is not valid JSON"),
  and a Secret in the YAML would replace the one created.
- Services, HorizontalPodAutoscalers, PodDisruptionBudgets and
  NetworkPolicies are dropped: one machine, and the pods share its network
  (the podman-test overlay sets hostNetwork and moves every port off the
  host's own services), so a process is reached on 127.0.0.1:PORT.
- A Job becomes a Pod that runs once (restartPolicy from its template):
  nothing counts its retries or deadlines.
- Readiness and startup probes are dropped (podman runs liveness only); a
  startup probe's time is added to the liveness probe's initial delay, so a
  slow start is not killed. podman runs an HTTP probe as `curl` and a TCP
  probe as `nc` inside the container, which these images lack: both become
  the same check in Python. An exec probe is given as one shell string,
  since podman joins its arguments with spaces and runs them with sh -c.
- preStop hooks, pod-level securityContext (the containers set their own
  user), termination grace periods, tolerations and a Deployment's
  strategy are ignored by podman: dropped and listed.
- Container ports on the host's network are dropped: podman would publish
  them, and there is nothing to publish.
- Init containers are dropped (and listed): podman 4.3 applies the pod's
  restartPolicy to them, restarts one that finished and then fails to
  remove it ("cannot remove container ... as it is running"). What they
  wait for is kept by playing in two stages (PodmanPlay.stages): first the
  pods that had none (the databases, the migrate Job's pod, vLLM), then,
  once migrate has exited 0, the pods that waited for it.
- emptyDir volumes are renamed after their pod: podman 4.3 makes each a
  volume named as in the pod spec, so every pod's `tmp` would be one and
  the same volume. And podman makes them root's, 0755, where Kubernetes
  makes an emptyDir writable by the pod's user (vLLM's /dev/shm ring
  failed with EACCES): create PodmanPlay.volumes first, owned by the user
  its containers run as (`podman volume create --opt o=uid=U,gid=G NAME`;
  a tmpfs volume's mode option is not applied here, nor a size: this
  filesystem has no project quota); kube play uses a volume that exists.

Use (the dropped list goes to stderr, each secret to SECRETS/NAME.json):

    kubectl kustomize deploy/k8s/overlays/podman-test > rendered.yaml
    python -m tests.deploy.k8s_podman --secrets SECRETS rendered.yaml > play.yaml
    for f in SECRETS/*.json; do podman secret create "$(basename "$f" .json)" "$f"; done
    (create the volumes it names on stderr, then) podman kube play play-1.yaml,
    wait for migrate to exit 0, podman kube play play-2.yaml

`podman kube down play.yaml` leaves the secrets: `podman secret rm` them."""

from __future__ import annotations

import argparse
import base64
import copy
import json
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

PLAYABLE = {"Pod", "Deployment", "PersistentVolumeClaim", "ConfigMap"}  # and Secret, see above
DROPPED_KINDS = {
    "Service": "no Services: the pods share the host's network, call 127.0.0.1:PORT",
    "HorizontalPodAutoscaler": "no autoscaling on one machine",
    "PodDisruptionBudget": "no evictions on one machine",
    "NetworkPolicy": "no network policies on the host's network",
}
# Pod and container fields podman 4.3 does not apply (docs/kubernetes_support.md).
IGNORED_POD_FIELDS = (
    "securityContext",
    "terminationGracePeriodSeconds",
    "tolerations",
    "automountServiceAccountToken",
)
IGNORED_CONTAINER_FIELDS = ("readinessProbe", "startupProbe", "lifecycle")


@dataclass
class PodmanPlay:
    """The documents to give `podman kube play`, and what was left out."""

    documents: list[dict]
    dropped: list[str] = field(default_factory=list)
    # name -> the secret as `podman secret create` takes it for a
    # secretKeyRef: JSON of each key's value, base64-encoded.
    secrets: dict[str, str] = field(default_factory=dict)
    # emptyDir volumes to create before playing: name -> the user and group
    # of the containers that mount it (None: root's).
    volumes: dict[str, tuple[int, int] | None] = field(default_factory=dict)
    # What waited for migrations (by init containers): the second stage.
    waiting: set[str] = field(default_factory=set)

    def yaml(self, documents: list[dict] | None = None) -> str:
        documents = self.documents if documents is None else documents
        return yaml.safe_dump_all(documents, sort_keys=False, width=10_000)

    @property
    def stages(self) -> tuple[list[dict], list[dict]]:
        """What to play first (all but the pods that waited for migrations),
        then those once migrate has exited 0, with the ConfigMaps again
        (kube play reads a pod's ConfigMaps from the same file)."""
        later = [d for d in self.documents if d["metadata"]["name"] in self.waiting]
        config = [d for d in self.documents if d["kind"] == "ConfigMap"]
        return [d for d in self.documents if d not in later], config + later


def podman_playable(documents: list[dict]) -> PodmanPlay:
    """Keep of `documents` (a rendered stack) what podman can run, adapted
    as the module docstring says; every object or field left out is listed."""
    play = PodmanPlay(documents=[])
    others, pods = [], []
    for document in documents:
        if not document:
            continue
        kind, name = document["kind"], document["metadata"]["name"]
        if kind == "Secret":
            play.secrets[name] = _secret_json(document)
            continue
        if kind == "Job":
            document = _job_as_pod(document)
            play.dropped.append(
                f"Job/{name}: runs once as Pod/{name}; backoffLimit, deadlines and TTL not applied"
            )
        elif kind not in PLAYABLE:
            reason = DROPPED_KINDS.get(kind, "a kind podman kube play does not run")
            play.dropped.append(f"{kind}/{name}: {reason}")
            continue
        if document["kind"] in ("Pod", "Deployment"):
            document = copy.deepcopy(document)
            _pod_adapt(document, play)
            pods.append(document)
        else:
            others.append(document)
    pods.sort(key=lambda document: document["metadata"]["name"] in play.waiting)
    play.documents = others + pods
    return play


def _secret_json(secret: dict) -> str:
    # Each value base64 on one line (a rendering may wrap it).
    values = {
        k: base64.b64encode(base64.b64decode(v)).decode()
        for k, v in (secret.get("data") or {}).items()
    }
    for key, value in (secret.get("stringData") or {}).items():
        values[key] = base64.b64encode(value.encode()).decode()
    return json.dumps(values, sort_keys=True)


def _job_as_pod(job: dict) -> dict:
    template = job["spec"]["template"]
    metadata = {"name": job["metadata"]["name"], **template.get("metadata", {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]}


def _pod_spec(document: dict) -> dict:
    return document["spec"] if document["kind"] == "Pod" else document["spec"]["template"]["spec"]


def _pod_adapt(document: dict, play: PodmanPlay) -> None:
    spec, name = _pod_spec(document), document["metadata"]["name"]
    gone = [key for key in IGNORED_POD_FIELDS if spec.pop(key, None) is not None]
    if document["kind"] == "Deployment" and document["spec"].pop("strategy", None):
        gone.append("strategy")
    for init in spec.pop("initContainers", []):
        gone.append(f"initContainers.{init['name']} (played in a second stage instead)")
        play.waiting.add(name)
    _empty_dirs_own(spec, name, play.volumes)
    for container in spec["containers"]:
        ports = {p["name"]: p["containerPort"] for p in container.get("ports", []) if "name" in p}
        liveness = container.get("livenessProbe")
        if liveness:
            startup = container.get("startupProbe")
            if startup:  # its time to start, then liveness as before
                budget = startup.get("periodSeconds", 10) * startup.get("failureThreshold", 3)
                liveness["initialDelaySeconds"] = liveness.get("initialDelaySeconds", 0) + budget
            container["livenessProbe"] = _probe_as_shell(liveness, ports)
        for name in IGNORED_CONTAINER_FIELDS:
            if container.pop(name, None) is not None:
                gone.append(f"{container['name']}.{name}")
        if spec.get("hostNetwork") and container.pop("ports", None):
            gone.append(f"{container['name']}.ports")
    if gone:
        play.dropped.append(f"{document['kind']}/{name}: {', '.join(gone)}")


def _empty_dirs_own(spec: dict, pod: str, volumes: dict) -> None:
    renamed = {v["name"]: f"{pod}-{v['name']}" for v in spec.get("volumes", []) if "emptyDir" in v}
    for volume in spec.get("volumes", []):
        volume["name"] = renamed.get(volume["name"], volume["name"])
    for container in spec["containers"]:
        context = container.get("securityContext", {})
        user = context.get("runAsUser")
        owner = (user, context.get("runAsGroup", user)) if user is not None else None
        for mount in container.get("volumeMounts", []):
            if mount["name"] in renamed:
                volumes.setdefault(renamed[mount["name"]], owner)
            mount["name"] = renamed.get(mount["name"], mount["name"])
    for name in renamed.values():  # mounted only by the dropped init containers
        volumes.setdefault(name, None)


def _probe_as_shell(probe: dict, ports: dict[str, int]) -> dict:
    """`probe` as an exec probe of one shell string (see the docstring)."""
    timeout = probe.get("timeoutSeconds", 1)
    if "httpGet" in probe:
        get = probe.pop("httpGet")
        port = ports.get(get["port"], get["port"])
        url = f"{get.get('scheme', 'HTTP').lower()}://{get.get('host', '127.0.0.1')}:{port}"
        url += get.get("path", "/")
        headers = {h["name"]: h["value"] for h in get.get("httpHeaders", [])}
        code = (
            "import urllib.request as u; "
            f"u.urlopen(u.Request({url!r}, headers={headers!r}), timeout={timeout})"
        )
        command = ["python3", "-c", code]
    elif "tcpSocket" in probe:
        check = probe.pop("tcpSocket")
        port = ports.get(check["port"], check["port"])
        address = (check.get("host", "127.0.0.1"), int(port))
        code = f"import socket; socket.create_connection({address!r}, timeout={timeout}).close()"
        command = ["python3", "-c", code]
    else:
        command = probe.pop("exec")["command"]
    probe["exec"] = {"command": [shlex.join(command)]}
    return probe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rendered", nargs="?", type=argparse.FileType(), default=sys.stdin)
    parser.add_argument("--secrets", type=Path, required=True, help="folder for NAME.json")
    options = parser.parse_args()
    play = podman_playable(list(yaml.safe_load_all(options.rendered)))
    options.secrets.mkdir(parents=True, exist_ok=True)
    for name, value in play.secrets.items():
        path = options.secrets / f"{name}.json"
        path.write_text(value)
        path.chmod(0o600)
    first, then = play.stages
    sys.stdout.write(play.yaml(first) + "---\n# second stage, once migrate has exited 0\n---\n")
    sys.stdout.write(play.yaml(then))
    for line in play.dropped:
        print(f"not run by podman: {line}", file=sys.stderr)
    for volume, owner in play.volumes.items():
        options = f" --opt o=uid={owner[0]},gid={owner[1]}" if owner else ""
        print(f"create first: podman volume create{options} {volume}", file=sys.stderr)


if __name__ == "__main__":
    main()
