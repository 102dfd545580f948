"""The circuit breaker end to end: every node of a simulated cluster reports an NVML failure at
once (the agents' own code publishes it on the API server stand-in), `gpuquota remediate` runs
as deployed, evicts and marks nothing, and a real Prometheus scraping it with the shipped rules
(components/prometheus-operator) fires GPURemediationBreakerOpen."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

from gpuquota.sim.apiserver import ApiServer
from gpuquota.sim.harness import free_port, stop_process
from tests.deploy.manifests import DEPLOY
from tests.prometheus import running
from tests.remediation.cluster import make_cluster, uuid_of

RULES = DEPLOY / "components/prometheus-operator/prometheusrule.yaml"


def firing(prometheus_alerts: list[dict[str, object]]) -> set[str]:
    return {
        str(a["labels"]["alertname"])  # type: ignore[index]
        for a in prometheus_alerts
        if a.get("state") == "firing"
    }


def test_nvml_failing_everywhere_evicts_nothing_and_the_breaker_alert_fires(
    tmp_path: Path,
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(json.dumps({"groups": yaml.safe_load(RULES.read_text())["spec"]["groups"]}))
    port = free_port()
    with ApiServer() as server:
        cluster = make_cluster(server, tmp_path)
        names = [f"node-{i}" for i in range(3)]
        for name in names:
            cluster.add_node(name)
            cluster.add_pod("ml", f"job-{name}", name, {uuid_of(name, 0): "Unhealthy"})
        for name in names:
            cluster.agents[name].nvml_fails()
        log = (tmp_path / "remediate.log").open("w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuquota.quota.cli", "remediate",
             f"--kubeconfig={tmp_path / 'kubeconfig'}", f"--db={cluster.db_url}",
             f"--metrics-port={port}", "--metrics-address=127.0.0.1", "--interval=500ms",
             "--condition", "--evict", "--evict-max=100", "--evict-after=100ms"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            with running(tmp_path / "prom", {"gpuquota-remediate": [port]}, rules) as prom:
                deadline = time.monotonic() + 30
                alerts: list[dict[str, object]] = []
                while time.monotonic() < deadline:
                    alerts = prom.api("alerts")["alerts"]
                    if "GPURemediationBreakerOpen" in firing(alerts):
                        break
                    time.sleep(0.5)
                assert "GPURemediationBreakerOpen" in firing(alerts), alerts
                [open_] = prom.query("gpuquota_remediation_breaker_open")
                assert open_["value"][1] == "1"
                [reporting] = prom.query("gpuquota_remediation_reporting_nodes")
                assert reporting["value"][1] == "3"
        finally:
            stop_process(proc)
            log.close()
            cluster.close()
        assert all(server.get("pods", f"job-{n}", "ml") is not None for n in names)
        assert not any(c[1] in ("pods/eviction", "pods/status") for c in server.calls)
        text = (tmp_path / "remediate.log").read_text()
        assert text.count("circuit breaker open") == 1, text
