"""Pods on a GPU that needs a reset or a reboot, the whole path (issue 35): decided on the node,
acted on centrally. gpu-exporter (the CLI) on the NVML stand-in publishes its verdict on its
Node; the kubelet stand-in, as a 1.36 kubelet does, turns the device plugin's health into the
pod's ``allocatedResourcesStatus`` in the API server stand-in; `gpuquota remediate` (the CLI,
one round per run) reads both, marks the pod and evicts it. The agent itself no longer acts
on pods: its former flags are refused, pointing at the central component."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuquota.quota.store import db
from gpuquota.sim.apiserver import ApiServer
from gpuquota.sim.harness import poll
from gpuquota.sim.kubelet.registration import KubeletStandIn
from gpuquota.sim.nvml.control import SimNode
from tests.kubelet.exporter_proc import EXPORTER, Exporter

NODE = "node-a"


def running_pod(namespace: str, name: str) -> dict[str, Any]:
    return {"kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
            "spec": {"nodeName": NODE, "containers": [{"name": "main"}]},
            "status": {"phase": "Running",
                       "conditions": [{"type": "Ready", "status": "True"}]}}  # fmt: skip


def conditions(server: ApiServer, namespace: str, name: str) -> dict[str, str]:
    pod = server.get("pods", name, namespace) or {}
    return {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions", [])}


def remediate(kubeconfig: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuquota.quota.cli", "remediate", f"--kubeconfig={kubeconfig}",
         f"--db={url}", "--cluster=test", "--metrics-port=0", "--once", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize(
    "flag",
    ["--pod-condition", "--evict-pods", "--evict-dry-run", "--evict-max=5", "--evict-after=1m"],
)
def test_the_agents_former_remediation_flags_are_refused_pointing_at_the_component(
    flag: str,
) -> None:
    done = subprocess.run([str(EXPORTER), flag], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "gpuquota remediate" in done.stderr and "deploy/components/remediation" in done.stderr
    assert flag.split("=")[0] in done.stderr


def test_the_agent_decides_and_remediate_marks_and_evicts_the_pod_on_the_failed_gpu(
    dirs: tuple[Path, Path], make_kubelet: Callable[..., KubeletStandIn]
) -> None:
    plugin_dir, root_dir = dirs
    url = f"sqlite:///{plugin_dir.parent / 'gq.db'}"
    db.upgrade(url)
    with ApiServer() as server, SimNode.create(plugin_dir.parent / "nvml.state", "l4x2") as sim:
        server.apply("ADDED", {"kind": "Node", "apiVersion": "v1",
                               "metadata": {"name": NODE, "uid": "uid-node"}, "spec": {},
                               "status": {"conditions": [{"type": "Ready", "status": "True"}]}})  # fmt: skip
        for name in ("train", "infer"):
            server.apply("ADDED", running_pod("ml", name))
        kubeconfig = server.write_kubeconfig(plugin_dir.parent / "kubeconfig")
        kubelet = make_kubelet(api=server)
        exporter = Exporter(
            sim, root_dir / "pod-resources" / "kubelet.sock",
            "--device-plugin", f"--device-plugin-dir={plugin_dir}", f"--kubeconfig={kubeconfig}",
            f"--node-name={NODE}", "--node-condition", "--node-taint",
        )  # fmt: skip
        try:
            plugin = kubelet.wait_for_plugin("nvidia.com/gpu", timeout=10)
            assert plugin is not None and plugin.wait_for(lambda d: len(d) == 2, timeout=10)
            kubelet.admit("ml", "train", {"main": {"nvidia.com/gpu": 1}}, uid="uid-train")
            kubelet.admit("ml", "infer", {"main": {"nvidia.com/gpu": 1}}, uid="uid-infer")
            [bad] = kubelet.allocated("ml", "train")["main"]["nvidia.com/gpu"]
            sim.inject_xid([sim.uuid(i) for i in range(2)].index(bad), 79)
            # the agent publishes its verdict; the kubelet reports the device Unhealthy
            assert poll(lambda: "GPUUnhealthy" in str(server.get("nodes", NODE)), 10)
            assert poll(
                lambda: kubelet.resource_health("ml", "train")["main"][bad] == "Unhealthy", 10
            )

            def health_in_api() -> str:
                pod = server.get("pods", "train", "ml") or {}
                statuses = pod.get("status", {}).get("containerStatuses") or [{}]
                groups = statuses[0].get("allocatedResourcesStatus") or [{"resources": [{}]}]
                return str(groups[0]["resources"][0].get("health"))

            assert poll(lambda: health_in_api() == "Unhealthy", 10)
            # the agent touches no pod; the central component does
            assert "GPUUnhealthy" not in conditions(server, "ml", "train")
            assert not any(c[1].startswith("pods") for c in server.calls if c[2] != "get")
            done = remediate(kubeconfig, url, "--condition")
            assert done.returncode == 0, done.stderr
            assert conditions(server, "ml", "train").get("GPUUnhealthy") == "True"
            assert "GPUUnhealthy" not in conditions(server, "ml", "infer")
            done = remediate(kubeconfig, url, "--condition", "--evict", "--evict-after=100ms")
            assert done.returncode == 0, done.stderr
            assert server.get("pods", "train", "ml") is None
            assert server.get("pods", "infer", "ml") is not None
            assert "evicted ml/train" in done.stderr
        finally:
            exporter.stop()
