"""The Kubernetes manifests (``deploy/k8s``): rendered as kustomize renders them and
validated against the Kubernetes API schemas, offline (``kubernetes-validate`` bundles them).

Nothing here runs a cluster. The renderer below implements the two kustomization fields the
manifests use (``resources``, ``labels``) and refuses any other, so it cannot silently differ
from kustomize; when ``kubectl`` is on PATH its ``kustomize`` renders too and must agree. The
KEDA objects are custom resources (no schema ships with Kubernetes): their fields are checked
against what KEDA's ``metrics-api`` scaler reads and against the gateway's real routes.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferq.autoscale import Signal
from inferq.cli.main import build_parser
from inferq.worker.core.lifecycle import STOP_GRACE_S

kubernetes_validate = pytest.importorskip("kubernetes_validate")

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
K8S_VERSION = "1.37.0"
KNOWN_FIELDS = {"apiVersion", "kind", "resources", "labels"}


def render(folder: Path) -> list[dict[str, Any]]:
    spec = yaml.safe_load((folder / "kustomization.yaml").read_text())
    assert set(spec) <= KNOWN_FIELDS, f"{folder}: this renderer knows {KNOWN_FIELDS} only"
    docs: list[dict[str, Any]] = []
    for resource in spec.get("resources", []):
        path = (folder / resource).resolve()
        if path.is_dir():
            docs += render(path)
        else:
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    for entry in spec.get("labels", []):
        assert set(entry) == {"pairs"}, "labels: pairs only (no selectors, no templates)"
        for doc in docs:
            doc.setdefault("metadata", {}).setdefault("labels", {}).update(entry["pairs"])
    return docs


def by_kind(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


ALL = render(K8S / "overlays" / "with-redis")
OBJECTS = by_kind(ALL)


def test_every_overlay_renders_and_names_are_unique() -> None:
    assert len(OBJECTS) == len(ALL)
    assert {k for k, _ in OBJECTS} == {"ConfigMap", "Deployment", "Service", "StatefulSet",
                                       "ScaledObject", "TriggerAuthentication", "Job"}
    assert {d["kind"] for d in render(K8S / "base")} == {"ConfigMap", "Deployment", "Service"}


def test_no_manifest_ships_a_secret() -> None:
    """Keys are made by the operator (inferq keys create), never shipped: no Secret object,
    no literal token anywhere."""
    assert not [d for d in ALL if d["kind"] == "Secret"]
    for path in K8S.rglob("*.yaml"):
        text = path.read_text()
        assert "change-me" not in text and "stringData" not in text, path


@pytest.mark.parametrize("doc", [d for d in ALL if "keda.sh" not in d["apiVersion"]],
                         ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_core_objects_validate_against_the_kubernetes_schemas(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_a_broken_object_is_caught_by_the_schemas() -> None:
    broken = yaml.safe_load(yaml.safe_dump(OBJECTS["Deployment", "inferq-worker"]))
    broken["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "ninety"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def container(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    pod = OBJECTS["Deployment", name]["spec"]["template"]
    return pod, pod["spec"]["containers"][0]


def cli_args(command: list[str]) -> Any:
    assert command[0] == "inferq"
    args, extra = build_parser().parse_known_args(command[1:])
    return args, extra


def test_workers_ask_for_a_gpu_drain_on_sigterm_and_are_probed_on_healthz() -> None:
    pod, worker = container("inferq-worker")
    args, extra = cli_args(worker["command"])
    assert args.command == "worker" and not extra
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert worker["resources"]["requests"]["nvidia.com/gpu"] == "1"
    pre_stop = worker["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    # Kubernetes kills at the grace period, counted from the preStop hook's start
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    assert grace > float(pre_stop[1]) + args.drain_timeout_s + STOP_GRACE_S
    port = args.metrics_port
    ports = {p["name"]: p["containerPort"] for p in worker["ports"]}
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        check = worker[probe]["httpGet"]
        assert check["path"] == "/healthz" and ports[check["port"]] == port
    notes = pod["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true" and notes["prometheus.io/port"] == str(port)
    assert notes["prometheus.io/path"] == "/metrics"


def test_the_gateway_is_probed_on_healthz_and_scraped_for_the_signal() -> None:
    from inferq.gateway import GatewaySettings, create_app

    pod, gateway = container("inferq-gateway")
    assert gateway["command"][:2] == ["inferq", "gateway"]
    port = int(gateway["command"][gateway["command"].index("--port") + 1])
    assert gateway["ports"][0]["containerPort"] == port
    assert {gateway[p]["httpGet"]["path"] for p in ("livenessProbe", "readinessProbe")} == {
        "/healthz"}
    routes = set(create_app(GatewaySettings(token=None)).openapi()["paths"])
    # /metrics/autoscale needs a key: no annotation-based (keyless) scrape of the gateway
    assert "prometheus.io/scrape" not in pod["metadata"].get("annotations", {})
    assert "/healthz" in routes and "/autoscale/{queue}" in routes
    token = next(e for e in gateway["env"] if e["name"] == "INFERQ_GATEWAY_TOKEN")
    assert token["valueFrom"]["secretKeyRef"]["optional"] is True  # keys are the way in
    service = OBJECTS["Service", "inferq-gateway"]
    assert service["spec"]["selector"] == pod["metadata"]["labels"] | service["spec"]["selector"]


def test_the_scaled_object_reads_the_desired_workers_signal() -> None:
    scaled = OBJECTS["ScaledObject", "inferq-worker"]["spec"]
    assert scaled["scaleTargetRef"]["name"] == "inferq-worker"
    assert ("Deployment", "inferq-worker") in OBJECTS
    assert scaled["minReplicaCount"] == 0 < scaled["maxReplicaCount"]
    (trigger,) = scaled["triggers"]
    meta = trigger["metadata"]
    assert trigger["type"] == "metrics-api" and trigger["metricType"] == "AverageValue"
    assert meta["valueLocation"] in Signal.__dataclass_fields__  # "desired"
    assert (meta["targetValue"], meta["activationTargetValue"]) == ("1", "0")
    service, path = meta["url"].removeprefix("http://").split("/", 1)
    host, port = service.split(":")
    assert OBJECTS["Service", host]["spec"]["ports"][0]["port"] == int(port)
    assert path.startswith("autoscale/")
    auth = OBJECTS["TriggerAuthentication", trigger["authenticationRef"]["name"]]["spec"]
    ref = auth["secretTargetRef"][0]
    assert meta["authMode"] == "bearer" and ref["parameter"] == "token"
    # the Job registers exactly the secret KEDA presents, as an autoscale-only key
    job = OBJECTS["Job", "inferq-keda-key"]["spec"]["template"]["spec"]["containers"][0]
    args, extra = cli_args(job["command"])
    assert (args.command, args.action, args.scopes) == ("keys", "create", ["autoscale"])
    assert not extra
    env = next(e for e in job["env"] if e["name"] == args.secret_from_env)
    assert env["valueFrom"]["secretKeyRef"] == {"name": ref["name"], "key": ref["key"]}


def test_the_redis_url_names_the_bundled_redis_service() -> None:
    url = OBJECTS["ConfigMap", "inferq-config"]["data"]["INFERQ_REDIS_URL"]
    host = url.split("//")[1].split(":")[0]
    assert ("Service", host) in OBJECTS and ("StatefulSet", host) in OBJECTS


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed here: "
                    "the manifests were rendered by this module's own kustomize subset only")
def test_kubectl_kustomize_renders_the_same_objects() -> None:
    out = subprocess.run(shlex.split(f"kubectl kustomize {K8S / 'overlays' / 'with-redis'}"),
                         check=True, capture_output=True, text=True).stdout
    assert by_kind([d for d in yaml.safe_load_all(out) if d]).keys() == OBJECTS.keys()
