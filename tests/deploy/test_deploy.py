"""deploy/: every YAML parses, kustomize builds the base and every sensible composition of its components, the manifests carry what the
exporter and controller need, and the alert rules are valid, tested and use known metrics."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuquota.dashboards import configmaps
from gpuquota.dashboards.known_metrics import known_metric_names
from gpuquota.dashboards.promql import metric_names
from gpuquota.quota.promscope import keeping
from gpuquota.quota.remediation.cli import DRY_RUN_LEASE_SUFFIX
from tests.deploy.manifests import (
    DEPLOY,
    OVERLAYS,
    ROOT,
    built,
    find,
    kustomize,
    needs_kubectl,
)

RULE = DEPLOY / "components" / "prometheus-operator" / "prometheusrule.yaml"
ALERT_TESTS = Path(__file__).with_name("alerts_test.yaml")
# the same rules over two clusters' series in one store (a Thanos or Mimir ruler)
CLUSTER_ALERT_TESTS = Path(__file__).with_name("alerts_clusters_test.yaml")
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian prometheus) missing")


def yaml_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))


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
                # every optional part is a Component, so any of them compose (issue 18)
                kind = "Component" if path.parent.parent.name == "components" else "Kustomization"
                assert doc["kind"] == kind, path
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
    # the device-plugins folder only where the device plugin runs (components/device-plugin)
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
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    # readiness is the controller's own (/readyz: current, or a standby), and a leader that is
    # not ready (relisting) stays scraped
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert find(docs, "Service", "gpuquota-controller")["spec"]["publishNotReadyAddresses"]
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
    dcgm = built("components/dcgm-compat")
    args = find(dcgm, "DaemonSet", "gpu-exporter")["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]
    assert "--compat=dcgm" in args

    postgres = built("components/postgres")
    assert not [d for d in postgres if d["kind"] == "PersistentVolumeClaim"]
    pod = find(postgres, "Deployment", "gpuquota-controller")["spec"]["template"]["spec"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["GPUQUOTA_DB"]["valueFrom"]["secretKeyRef"]["name"] == "gpuquota-db"
    assert "podAffinity" not in pod.get("affinity", {})

    plugin = built("components/device-plugin")
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

    dra = built("components/dra")
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

    usage = built("components/pod-usage")
    pod = find(usage, "DaemonSet", "gpu-exporter")["spec"]["template"]["spec"]
    assert pod["hostPID"] is True and "--pod-usage" in pod["containers"][0]["args"]
    # no Kubernetes API at all: the node names its pods (tests/deploy/test_least_privilege.py)
    assert pod["automountServiceAccountToken"] is False
    assert pod["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert not find(base, "DaemonSet", "gpu-exporter")["spec"]["template"]["spec"].get("hostPID")
    args = build_parser().parse_args(pod["containers"][0]["args"])
    # the kubelet's device checkpoint, through a read-only mount of its folder (the kubelet
    # replaces the file: a file mount would keep the old one)
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "device-checkpoint"]
    assert mount["readOnly"] is True
    assert Path(args.device_checkpoint).parent == Path(mount["mountPath"])
    (volume,) = [v for v in pod["volumes"] if v["name"] == "device-checkpoint"]
    assert volume["hostPath"] == {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"}
    assert not [
        d
        for d in usage
        if d["kind"] in ("ClusterRole", "Role") and "pod-usage" in d["metadata"]["name"]
    ]

    ledger = built("components/usage-ledger")
    config = find(ledger, "ConfigMap", "gpuquota-controller")["data"]
    assert config["GPUQUOTA_LEDGER_PROMETHEUS_URL"].startswith("http://")
    assert (
        "GPUQUOTA_LEDGER_PROMETHEUS_URL"
        not in find(base, "ConfigMap", "gpuquota-controller")["data"]
    )

    operator = built("components/prometheus-operator")
    kinds = [d["kind"] for d in operator]
    # the remediation's ServiceMonitor is inert without its component (no Service to select)
    assert kinds.count("ServiceMonitor") == 3 and "PrometheusRule" in kinds
    assert len(operator) == len(base) + 4

    # remediation: its own ServiceAccount, on SQLite the controller's volume and node; with
    # postgres (listed after it) the database Secret and any node
    remediation = built("components/remediation")
    pod = find(remediation, "Deployment", "gpuquota-remediate")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "gpuquota-remediate"
    assert "--condition" in pod["containers"][0]["args"]
    assert "--evict" not in pod["containers"][0]["args"]  # evictions are opted into
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "gpuquota-data"
    # two replicas electing one through a Lease of their own: never the controller's, whose
    # name reaches them too (envFrom its ConfigMap)
    deployment = find(remediation, "Deployment", "gpuquota-remediate")
    assert deployment["spec"]["replicas"] == 2
    lease = [a for a in pod["containers"][0]["args"] if a.startswith("--lease-name=")]
    controller_lease = find(base, "ConfigMap", "gpuquota-controller")["data"]["GPUQUOTA_LEASE_NAME"]
    assert lease == ["--lease-name=gpuquota-remediate"] != [f"--lease-name={controller_lease}"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    both = built("components/remediation+postgres")
    pod = find(both, "Deployment", "gpuquota-remediate")["spec"]["template"]["spec"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["GPUQUOTA_DB"]["valueFrom"]["secretKeyRef"]["name"] == "gpuquota-db"
    assert "affinity" not in pod and not pod.get("volumes")


@needs_kubectl
@pytest.mark.parametrize("folder", OVERLAYS)
def test_each_component_may_renew_its_own_lease_alone_in_every_build(folder: str) -> None:
    """The Roles narrow get/update of Leases by name (resourceNames) to the Lease each
    component is configured to elect through, in every build (a build that renamed one
    without the other would leave its replicas unable to renew: no leader)."""
    docs = built(folder)

    def renewable(role: str) -> set[str]:
        rules = find(docs, "Role", role)["rules"]
        assert all("update" not in r["verbs"] or r.get("resourceNames") for r in rules), role
        return {n for r in rules if "update" in r["verbs"] for n in r["resourceNames"]}

    config = find(docs, "ConfigMap", "gpuquota-controller")["data"]
    assert renewable("gpuquota-leader-election") == {config["GPUQUOTA_LEASE_NAME"]}
    if any(d["kind"] == "Deployment" and d["metadata"]["name"] == "gpuquota-remediate"
           for d in docs):  # fmt: skip
        pod = find(docs, "Deployment", "gpuquota-remediate")["spec"]["template"]["spec"]
        [lease] = [a.split("=", 1)[1] for a in pod["containers"][0]["args"]
                   if a.startswith("--lease-name=")]  # fmt: skip
        assert renewable("gpuquota-remediate-leader-election") == {
            lease,
            lease + DRY_RUN_LEASE_SUFFIX,
        }
        assert config["GPUQUOTA_LEASE_NAME"] not in {lease, lease + DRY_RUN_LEASE_SUFFIX}


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
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # the Prometheus Operator's CRDs: not built in (promtool checks the rules)
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
        "GPURemediationBreakerOpen",
    } <= names
    for alert in alerts:
        used = metric_names(alert["expr"])
        assert used, f"{alert['alert']}: no metric in {alert['expr']!r}"
        assert used <= known, f"{alert['alert']} uses unknown metrics {sorted(used - known)}"


@needs_promtool
@pytest.mark.parametrize("unit_tests", [ALERT_TESTS, CLUSTER_ALERT_TESTS], ids=lambda p: p.name)
def test_alert_rules_are_valid_and_fire_as_their_unit_tests_say(
    tmp_path: Path, unit_tests: Path
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(json.dumps({"groups": rule_groups()}))
    assert PROMTOOL is not None
    checked = subprocess.run(
        [PROMTOOL, "check", "rules", str(rules)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tests = tmp_path / unit_tests.name
    tests.write_text(unit_tests.read_text().replace("RULES_FILE", str(rules)))
    tested = subprocess.run([PROMTOOL, "test", "rules", str(tests)], capture_output=True, text=True)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert re.search(r"SUCCESS", tested.stdout + tested.stderr)


# an aggregation written without its label list: it would add up every cluster's series
BARE_AGGREGATION = re.compile(
    r"\b(sum|min|max|avg|group|stddev|stdvar|count|count_values|bottomk|topk|quantile)\s*\("
)
CLUSTER_SUMMARY = "{{ with $labels.cluster }} (cluster {{ . }}){{ end }}"


def test_no_alert_adds_up_or_joins_two_clusters() -> None:
    """Every aggregation names its labels (``by``/``without``), every ``by`` and ``on`` list
    keeps ``cluster``, and every summary names the cluster when the alert has one (the unit
    tests over two clusters, alerts_clusters_test.yaml, show it on Prometheus itself)."""
    alerts = [rule for group in rule_groups() for rule in group["rules"] if "alert" in rule]
    assert alerts
    for alert in alerts:
        expr = " ".join(alert["expr"].split())
        assert not BARE_AGGREGATION.search(expr), f"{alert['alert']}: {expr}: by (cluster, ...)?"
        assert keeping(expr, "cluster") == expr, f"{alert['alert']}: {expr} drops cluster"
        summary = alert["annotations"]["summary"]
        assert summary.endswith(CLUSTER_SUMMARY), f"{alert['alert']}: {summary!r}"


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
        if doc["kind"] not in ("DaemonSet", "Deployment", "CronJob"):
            continue
        for container in pod_containers(doc):
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


def test_the_prometheus_operator_component_says_it_needs_the_operators_crds() -> None:
    """Its kinds exist only where the operator's CRDs are installed; apply fails otherwise."""
    docs = [
        d
        for p in (DEPLOY / "components" / "prometheus-operator").glob("*.yaml")
        if p.name != "kustomization.yaml"
        for d in yaml.safe_load_all(p.read_text())
        if d
    ]
    kinds = {d["kind"] for d in docs if d["apiVersion"] == "monitoring.coreos.com/v1"}
    assert kinds == {"ServiceMonitor", "PrometheusRule"}
    readme = (DEPLOY / "README.md").read_text()
    row = next(
        line
        for line in readme.splitlines()
        if line.startswith("| `components/prometheus-operator/`")
    )
    command = next(line for line in readme.splitlines() if "-k deploy/examples/production" in line)
    for text in (
        row,
        command,
        (DEPLOY / "components/prometheus-operator/kustomization.yaml").read_text(),
    ):
        assert "CRDs" in text, text


@needs_kubectl
def test_production_example_composes_every_part_and_names_the_image_once() -> None:
    """Issue 18 (fails on 6c36c52: no components, no example; a kustomization listing the
    postgres and prometheus-operator overlays failed with "already registered id"); issue 28
    (fails on 4b1b947: no pod-usage, no ledger, no rate card, cpu 50m, no selector label)."""
    docs = built("examples/production")
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert len(kinds) == len(docs)  # nothing twice
    assert ("ServiceMonitor", "gpu-exporter") in kinds and ("PrometheusRule", "gpuquota") in kinds
    claims = [d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"]
    assert claims == ["gpuquota-reports"]  # postgres: no SQLite volume; the CSVs have theirs
    report = find(docs, "CronJob", "gpuquota-report")["spec"]["jobTemplate"]["spec"]["template"]
    assert "affinity" not in report["spec"]  # with PostgreSQL it runs on any node
    env = report["spec"]["containers"][0]["env"]
    assert env[0]["valueFrom"]["secretKeyRef"] == {"name": "gpuquota-db", "key": "url"}
    assert [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    maps = [
        d
        for d in docs
        if d["kind"] == "ConfigMap" and "grafana_dashboard" in d["metadata"].get("labels", {})
    ]
    assert sorted(m["metadata"]["name"] for m in maps) == [
        "gpuquota-dashboard-gpu-fleet-health",
        "gpuquota-dashboard-gpu-node",
        "gpuquota-dashboard-gpu-quota",
    ]
    assert all(m["metadata"]["labels"]["grafana_dashboard"] == "1" for m in maps)
    exporter = find(docs, "DaemonSet", "gpu-exporter")["spec"]["template"]["spec"]
    args = exporter["containers"][0]["args"]
    # issue 28: the whole product: the device plugin (or dra, never both), per-pod usage and
    # its counters, TLS, the usage ledger, and a priced monthly report
    assert {"--device-plugin", "--node-taint", "--node-condition", "--pod-usage",
            "--dra=off"} <= set(args)  # fmt: skip
    assert exporter["hostPID"] is True
    assert any(a.startswith("--web.config.file=") for a in args)
    config = find(docs, "ConfigMap", "gpuquota-controller")["data"]
    assert config["GPUQUOTA_LEDGER_PROMETHEUS_URL"].startswith("http://")
    report_args = report["spec"]["containers"][0]["args"]
    rate_card = next(a for a in report_args if a.startswith("--rate-card="))
    mounts = {m["mountPath"]: m["name"] for m in report["spec"]["containers"][0]["volumeMounts"]}
    folder = rate_card.split("=", 1)[1].rsplit("/", 1)[0]
    volume = next(v for v in report["spec"]["volumes"] if v["name"] == mounts[folder])
    assert volume["configMap"]["name"] == "gpuquota-ratecard"
    controller = find(docs, "Deployment", "gpuquota-controller")["spec"]["template"]["spec"]
    # docs/operations.md, "Gaps": at least one full core
    assert controller["containers"][0]["resources"]["requests"]["cpu"] == "1"
    # the Prometheus Operator's selector label, set once, on every object it selects
    for doc in docs:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            assert doc["metadata"]["labels"]["release"] == "kube-prometheus-stack", doc["kind"]
    images = {
        c["image"]
        for d in docs
        if d["kind"] in ("DaemonSet", "Deployment", "CronJob")
        for c in pod_containers(d)
    }
    assert images == {"registry.example.com/platform/gpuquota:0.1.0"}
    assert all(d["metadata"].get("namespace") in (None, "gpuquota") for d in docs)


def pod_containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc.get("spec", {})
    template = spec.get("jobTemplate", {}).get("spec", {}).get("template") or spec.get(
        "template", {}
    )
    pod = template.get("spec", {})
    return [*pod.get("initContainers", []), *pod.get("containers", [])]


def test_the_image_is_named_in_one_place() -> None:
    """Every container, the components' too, names the same image at the package's version,
    so one `images:` entry in a kustomization points all of them at your registry."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    named = []
    for path in yaml_files():
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") in ("DaemonSet", "Deployment", "CronJob"):
                # (a patch fragment names no image: it keeps the one it patches)
                named += [(path, c["image"]) for c in pod_containers(doc) if "image" in c]
    assert len(named) >= 4
    assert {image for _p, image in named} == {f"ghcr.io/gpuquota/gpuquota:{version}"}, named


def test_dashboard_configmaps_are_fresh() -> None:
    target = DEPLOY / "components" / "grafana-dashboards" / "dashboards.yaml"
    assert configmaps.main(["--check", str(target)]) == 0, (
        f"run `python -m gpuquota.dashboards.configmaps --write {target.relative_to(ROOT)}`"
    )


def flag_name(arg: str) -> str | None:
    """``--dra`` of ``--dra=on`` or ``--dra``; None for a value (an argument after a flag)."""
    return arg.split("=", 1)[0] if arg.startswith("-") else None


@needs_kubectl
@pytest.mark.parametrize("folder", OVERLAYS)
def test_no_container_is_given_a_flag_twice(folder: str) -> None:
    """Issue 28: the production build gave the exporter --dra=off twice and --dra=on (the
    last one won, so the order of the components decided)."""
    for doc in built(folder):
        if doc["kind"] not in ("DaemonSet", "Deployment", "CronJob"):
            continue
        for container in pod_containers(doc):
            flags = [f for f in map(flag_name, container.get("args", [])) if f]
            twice = sorted({f for f in flags if flags.count(f) > 1})
            assert not twice, f"{doc['metadata']['name']}/{container['name']}: {twice} twice"


@needs_kubectl
@pytest.mark.parametrize("folder", OVERLAYS)
def test_every_scrape_path_matches_the_exporters_web_config(folder: str) -> None:
    """Issue 28: with TLS and basic auth on the exporter, every way Prometheus finds it
    (ServiceMonitor, annotations) scrapes it over HTTPS with the CA, server name and
    credentials of the same Secrets the exporter mounts; with a ServiceMonitor, no pod is
    also annotated for scraping (one scrape per target)."""
    docs = built(folder)
    monitors = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ServiceMonitor"}
    pods = {
        d["metadata"]["name"]: d["spec"]["template"]
        for d in docs
        if d["kind"] in ("DaemonSet", "Deployment")
    }
    exporter = pods["gpu-exporter"]
    args = exporter["spec"]["containers"][0]["args"]
    tls = any(a.startswith("--web.config.file=") for a in args)
    annotated = {
        name for name, pod in pods.items()
        if (pod["metadata"].get("annotations") or {}).get("prometheus.io/scrape") == "true"
    }  # fmt: skip
    if monitors:
        assert not annotated, f"scraped twice: by a ServiceMonitor and by annotation: {annotated}"
    if tls:
        assert "gpu-exporter" not in annotated  # an annotation cannot carry the credentials
        mounted = {
            s["secret"]["name"]
            for v in exporter["spec"]["volumes"]
            if v["name"] == "web"
            for s in v["projected"]["sources"]
        }
        for endpoint in monitors.get("gpu-exporter", {}).get("spec", {}).get("endpoints", []):
            assert endpoint["scheme"] == "https"
            assert endpoint["tlsConfig"]["serverName"] == "gpu-exporter.gpuquota.svc"
            assert endpoint["tlsConfig"]["ca"]["secret"]["name"] in mounted
            auth = endpoint["basicAuth"]
            assert {auth["username"]["name"], auth["password"]["name"]} <= mounted
    else:
        for endpoint in monitors.get("gpu-exporter", {}).get("spec", {}).get("endpoints", []):
            assert endpoint.get("scheme", "http") == "http" and "basicAuth" not in endpoint
