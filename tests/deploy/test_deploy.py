"""deploy/: every YAML parses, kustomize builds base and overlays, the manifests carry what the
exporter and controller need, and the alert rules are valid, tested and use known metrics."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuquota.dashboards.known_metrics import known_metric_names
from gpuquota.dashboards.promql import metric_names
from tests.deploy.manifests import (
    DEPLOY,
    OVERLAYS,
    ROOT,
    built,
    find,
    kustomize,
    needs_kubectl,
)

RULE = DEPLOY / "overlays" / "prometheus-operator" / "prometheusrule.yaml"
ALERT_TESTS = Path(__file__).with_name("alerts_test.yaml")
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian prometheus) missing")


GENERATED = {"web-config.yml"}  # overlays/tls-auth/generate.py writes it; never committed


def yaml_files() -> list[Path]:
    return sorted(
        p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml") and p.name not in GENERATED
    )


def rule_groups() -> list[dict[str, Any]]:
    rule = yaml.safe_load(RULE.read_text())
    assert rule["kind"] == "PrometheusRule"
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


def test_every_yaml_parses_into_named_kubernetes_objects() -> None:
    files = yaml_files()
    assert len(files) >= 10
    for path in files:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        assert docs, f"{path} is empty"
        for doc in docs:
            assert isinstance(doc, dict), f"{path}: a document is not a mapping"
            if path.name == "kustomization.yaml":
                assert doc["kind"] == "Kustomization"
                continue
            if isinstance(doc, dict) and "apiVersion" not in doc:
                continue  # a strategic-merge patch fragment would still name its kind
            assert doc.get("kind"), f"{path}: document without kind"
            assert doc.get("metadata", {}).get("name"), f"{path}: {doc['kind']} without a name"


@needs_kubectl
def test_base_exporter_daemonset_reaches_the_kubelet_socket_on_gpu_nodes() -> None:
    docs = kustomize(DEPLOY / "base")
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"} <= {
        "gpuquota",
        None,  # cluster-scoped objects
    }
    pod = find(docs, "DaemonSet", "gpu-exporter")["spec"]["template"]
    spec = pod["spec"]
    host_paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    # the device-plugins folder only where the device plugin runs (overlays/device-plugin)
    assert host_paths == {"/var/lib/kubelet/pod-resources"}
    assert spec["nodeSelector"]
    assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])
    container = spec["containers"][0]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert host_paths <= mounts
    assert any(
        a.startswith("--pod-resources-socket=/var/lib/kubelet/pod-resources/")
        for a in container["args"]
    )
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    port = int(pod["metadata"]["annotations"]["prometheus.io/port"])
    assert port in {p["containerPort"] for p in container["ports"]}


@needs_kubectl
def test_base_controller_is_two_replicas_with_the_rbac_it_needs() -> None:
    docs = kustomize(DEPLOY / "base")
    deployment = find(docs, "Deployment", "gpuquota-controller")
    assert deployment["spec"]["replicas"] == 2
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    cluster_role = find(docs, "ClusterRole", "gpuquota-controller")
    granted = {
        (resource, verb)
        for rule in cluster_role["rules"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    for resource in ("pods", "nodes", "namespaces", "resourcequotas"):
        assert {(resource, "list"), (resource, "watch")} <= granted, resource
    # DRA: the verbs of the calls the controller makes, nothing more
    # (tests/controller/test_controller_dra.py checks the calls against the API server stand-in)
    assert [r for r in cluster_role["rules"] if r["apiGroups"] == ["resource.k8s.io"]] == [
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaims", "resourceslices", "deviceclasses"],
            "verbs": ["list", "watch"],
        }
    ]
    lease_role = find(docs, "Role", "gpuquota-leader-election")
    lease_verbs = {v for r in lease_role["rules"] if "leases" in r["resources"] for v in r["verbs"]}
    assert {"get", "create", "update"} <= lease_verbs
    for kind, name in (
        ("ClusterRoleBinding", "gpuquota-controller"),
        ("RoleBinding", "gpuquota-leader-election"),
    ):
        subjects = find(docs, kind, name)["subjects"]
        assert {"kind": "ServiceAccount", "name": account, "namespace": "gpuquota"} in subjects


@needs_kubectl
def test_overlays_build_and_change_what_they_say() -> None:
    base = kustomize(DEPLOY / "base")
    dcgm = kustomize(DEPLOY / "overlays" / "dcgm-compat")
    args = find(dcgm, "DaemonSet", "gpu-exporter")["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]
    assert "--compat=dcgm" in args

    postgres = kustomize(DEPLOY / "overlays" / "postgres")
    assert not [d for d in postgres if d["kind"] == "PersistentVolumeClaim"]
    pod = find(postgres, "Deployment", "gpuquota-controller")["spec"]["template"]["spec"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["GPUQUOTA_DB"]["valueFrom"]["secretKeyRef"]["name"] == "gpuquota-db"
    assert "podAffinity" not in pod.get("affinity", {})

    plugin = kustomize(DEPLOY / "overlays" / "device-plugin")
    pod = find(plugin, "DaemonSet", "gpu-exporter")["spec"]["template"]["spec"]
    assert {"--device-plugin", "--node-condition", "--node-taint"} <= set(
        pod["containers"][0]["args"]
    )
    assert pod["automountServiceAccountToken"] is True
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert not mounts["/var/lib/kubelet/device-plugins"].get("readOnly")  # it makes sockets
    role = find(plugin, "ClusterRole", "gpu-exporter-node-status")
    assert {"resources": ["nodes/status"], "verbs": ["patch"], "apiGroups": [""]} in role["rules"]
    # every flag the overlays add is one gpu-exporter accepts
    from gpuquota.exporter.cli import build_parser

    build_parser().parse_args(pod["containers"][0]["args"])

    dra = kustomize(DEPLOY / "overlays" / "dra")
    pod = find(dra, "DaemonSet", "gpu-exporter")["spec"]["template"]["spec"]
    assert {"--dra=on", "--dra-device-taints"} <= set(pod["containers"][0]["args"])
    assert pod["automountServiceAccountToken"] is True
    build_parser().parse_args(pod["containers"][0]["args"])
    # the verbs of the calls exporter/dra/ makes, nothing more (tests/health/test_dra_taints.py
    # checks the calls against the API server stand-in)
    assert find(dra, "ClusterRole", "gpu-exporter-dra")["rules"] == [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
         "verbs": ["list", "watch"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["devicetaintrules"],
         "verbs": ["list", "create", "update", "delete"]},
    ]  # fmt: skip
    binding = find(dra, "ClusterRoleBinding", "gpu-exporter-dra")
    assert binding["subjects"][0]["name"] == "gpu-exporter"

    usage = kustomize(DEPLOY / "overlays" / "pod-usage")
    pod = find(usage, "DaemonSet", "gpu-exporter")["spec"]["template"]["spec"]
    assert pod["hostPID"] is True and "--pod-usage" in pod["containers"][0]["args"]
    assert pod["automountServiceAccountToken"] is True
    assert pod["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert not find(base, "DaemonSet", "gpu-exporter")["spec"]["template"]["spec"].get("hostPID")
    build_parser().parse_args(pod["containers"][0]["args"])
    # the one call exporter/enrich/poddirectory.py makes (tests/exporter/test_podusage.py runs it)
    assert find(usage, "ClusterRole", "gpu-exporter-pod-usage")["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}
    ]
    binding = find(usage, "ClusterRoleBinding", "gpu-exporter-pod-usage")
    assert binding["subjects"][0]["name"] == "gpu-exporter"

    operator = kustomize(DEPLOY / "overlays" / "prometheus-operator")
    kinds = [d["kind"] for d in operator]
    assert kinds.count("ServiceMonitor") == 2 and "PrometheusRule" in kinds
    assert len(operator) == len(base) + 3


@needs_kubectl
@pytest.mark.parametrize(
    "folder",
    OVERLAYS,
)
def test_built_manifests_match_the_kubernetes_api_schemas(folder: str) -> None:
    """Strict schema validation (unknown fields fail) of every built-in object."""
    import kubernetes_validate

    version = kubernetes_validate.latest_version()
    for doc in built(folder):
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{doc['kind']}/{doc['metadata']['name']}: {exc.message}") from exc


def test_alerts_use_only_known_metrics() -> None:
    known = known_metric_names()
    alerts = [r for g in rule_groups() for r in g["rules"] if "alert" in r]
    names = {a["alert"] for a in alerts}
    assert {
        "GPUUnhealthy",
        "GPULost",
        "GPUXidError",
        "GPUEccUncorrectable",
        "GPUExporterDown",
        "GPUExporterNVMLDown",
        "GPUExporterCollectionStalled",
        "GPUDevicePluginNotRegistered",
        "GPUQuotaNearLimit",
    } <= names
    for alert in alerts:
        used = metric_names(alert["expr"])
        assert used, f"{alert['alert']}: no metric in {alert['expr']!r}"
        assert used <= known, f"{alert['alert']} uses unknown metrics {sorted(used - known)}"


@needs_promtool
def test_alert_rules_are_valid_and_fire_as_their_unit_tests_say(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(json.dumps({"groups": rule_groups()}))
    assert PROMTOOL is not None
    checked = subprocess.run(
        [PROMTOOL, "check", "rules", str(rules)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tests = tmp_path / "alerts_test.yaml"
    tests.write_text(ALERT_TESTS.read_text().replace("RULES_FILE", str(rules)))
    tested = subprocess.run([PROMTOOL, "test", "rules", str(tests)], capture_output=True, text=True)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert re.search(r"SUCCESS", tested.stdout + tested.stderr)


def test_dockerfile_copies_only_what_make_image_provides() -> None:
    """The image installs the project from the wheels tools/image builds from this checkout
    (`make image` builds and runs it for real; this is the quick static half)."""
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    sources = [
        src
        for line in dockerfile.splitlines()
        if line.startswith("COPY ") and "--from=" not in line
        for src in line.split()[1:-1]
    ]
    assert sources == ["build/image/wheels"]
    assert "'gpuquota[postgres]'" in dockerfile and "--no-index" in dockerfile
    tool = (ROOT / "tools" / "image").read_text()
    assert "WORK=build/image" in tool
    assert """pip wheel --quiet --wheel-dir "$WORK/wheels" '.[postgres]'""" in tool
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert "*" in ignored and all(f"!{src}" in ignored for src in sources)
    assert re.search(r"^USER 65532:65532$", dockerfile, re.M), "the image user is numeric, non-root"


def container_commands(docs: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """(object name, command + args) of every container and init container."""
    found = []
    for doc in docs:
        if doc["kind"] not in ("DaemonSet", "Deployment"):
            continue
        spec = doc["spec"]["template"]["spec"]
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            found.append(
                (doc["metadata"]["name"], [*container["command"], *container.get("args", [])])
            )
    return found


@needs_kubectl
@pytest.mark.parametrize(
    "folder",
    OVERLAYS,
)
def test_every_container_command_parses_with_our_own_cli(folder: str) -> None:
    from gpuquota.exporter.cli import build_parser as exporter_parser
    from gpuquota.quota.cli import build_parser as gpuquota_parser

    commands = container_commands(built(folder))
    assert {argv[0] for _, argv in commands} == {"gpu-exporter", "gpuquota"}
    for name, argv in commands:
        parser = exporter_parser() if argv[0] == "gpu-exporter" else gpuquota_parser()[0]
        try:
            parser.parse_args(argv[1:])
        except SystemExit as exc:  # argparse exits on a flag it does not know
            raise AssertionError(f"{name}: `{' '.join(argv)}` does not parse") from exc
