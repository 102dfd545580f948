"""The scrape configuration the Prometheus Operator renders for our ServiceMonitors (issue 38).

sim/promoperator.py derives it by the Operator's rules; here the derivation is checked against
the Operator's own golden files for the shapes our monitors use (tests/deploy/operator_golden.yaml
holds them, citing each file), and the built monitors are checked to keep the workload labels
our series carry. The composition test (test_composition.py) runs the same derivation in a real
Prometheus.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuquota.exporter.expose.metrics import METRICS as EXPORTER_METRICS
from gpuquota.quota.controller.metrics import METRICS as CONTROLLER_METRICS
from gpuquota.quota.remediation.metrics import METRICS as REMEDIATION_METRICS
from gpuquota.sim import promoperator
from tests.deploy.manifests import BUILDS, OPTIONAL_MONITORS, built, find, needs_kubectl

GOLDEN = yaml.safe_load((Path(__file__).parent / "operator_golden.yaml").read_text())["cases"]
WORKLOAD_LABELS = {"namespace", "pod", "container"}


@pytest.mark.parametrize("case", GOLDEN, ids=[c["name"] for c in GOLDEN])
def test_the_derivation_renders_what_the_operators_golden_files_show(case: dict[str, Any]) -> None:
    secrets = {
        name: {k: v.encode() for k, v in keys.items()}
        for name, keys in case.get("secrets", {}).items()
    }
    override = case.get("prometheus", {}).get("overrideHonorLabels", False)
    rendered = promoperator.render([case["monitor"]], secrets, override_honor_labels=override)
    assert len(rendered.scrape_configs) == len(case["expected"])
    for got, want in zip(rendered.scrape_configs, case["expected"], strict=True):
        if "keys" in case:
            got = {k: got.get(k) for k in case["keys"]}
        if "slice" in case:
            lo, hi = case["slice"]
            got["relabel_configs"] = got["relabel_configs"][lo:hi]
        assert got == want, case["golden"]
    wanted_assets = {k: v.encode() for k, v in case.get("assets", {}).items()}
    assert rendered.tls_assets == wanted_assets


def test_what_the_derivation_does_not_follow_is_refused_by_name() -> None:
    monitor = GOLDEN[0]["monitor"]
    pod_monitor = {**monitor, "kind": "PodMonitor"}
    with pytest.raises(
        promoperator.UnsupportedMonitorError, match="PodMonitor testservicemonitor1"
    ):
        promoperator.render([pod_monitor], {})
    bearer = {**monitor, "spec": {"endpoints": [{"port": "web", "bearerTokenSecret": {}}]}}
    with pytest.raises(promoperator.UnsupportedMonitorError, match="bearerTokenSecret"):
        promoperator.render([bearer], {})


def _emits_workload_labels(workload: str) -> bool:
    """Whether a workload's series carry namespace/pod/container labels (its metric table)."""
    if workload == "gpu-exporter":
        return any(WORKLOAD_LABELS & set(spec.labels) for spec in EXPORTER_METRICS)
    if workload == "gpuquota-controller":
        return any(WORKLOAD_LABELS & set(spec.labels) for spec in CONTROLLER_METRICS)
    if workload == "gpuquota-remediate":
        return any(WORKLOAD_LABELS & set(spec.labels) for spec in REMEDIATION_METRICS)
    raise AssertionError(f"a ServiceMonitor for {workload}: say which labels its series carry")


MONITORED = [name for name in BUILDS if "prometheus-operator" in BUILDS[name]]


@needs_kubectl
@pytest.mark.parametrize("build", MONITORED)
def test_every_built_monitor_keeps_the_workload_labels_of_its_series(build: str) -> None:
    """With honor_labels false the Operator's target labels namespace/pod/container would
    replace ours (ours renamed exported_*); the target's own are dropped, so a series naming no
    workload does not say gpuquota either."""
    docs = built(build)
    secrets = {  # what the monitors reference; the values do not matter here
        "gpu-exporter-tls": {"ca.crt": b"ca"},
        "gpu-exporter-basic-auth": {"username": b"u", "password": b"p"},
    }
    rendered = promoperator.render(docs, secrets)
    monitors = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert len(rendered.scrape_configs) == sum(len(m["spec"]["endpoints"]) for m in monitors)
    assert monitors
    for job in rendered.scrape_configs:
        name = job["job_name"].split("/")[2]
        if name in OPTIONAL_MONITORS and not any(
            d["kind"] == "Service" and d["metadata"]["name"] == name for d in docs
        ):
            continue  # its component is not in this build: the monitor selects nothing
        find(docs, "Service", name)  # the monitor is named after the Service it selects
        if not _emits_workload_labels(name):
            continue
        assert job["honor_labels"] is True, job["job_name"]
        drops = [
            r
            for r in job["relabel_configs"]
            if r.get("action") == "labeldrop"
            and set(r["regex"].strip("()").split("|")) >= WORKLOAD_LABELS
        ]
        assert drops, f"{job['job_name']}: the target's own namespace/pod/container stay"
