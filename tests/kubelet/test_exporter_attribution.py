"""End to end: gpu-exporter (the real CLI, a subprocess) on the NVML stand-in, attributing
GPUs to pods through the kubelet stand-in over its unix socket."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuquota.sim.harness import wait_for
from gpuquota.sim.kubelet.podresources import PodResourcesServer, node_assignments
from gpuquota.sim.nvml.control import SimNode
from tests.kubelet.exporter_proc import Exporter, attribution_up, pod_info, scrape


@pytest.fixture
def node(socket_path: Path) -> Iterator[SimNode]:
    # the state file lives beside the socket, in the fixture's short-lived /tmp folder
    with SimNode.create(socket_path.parent / "nvml.state", "h100x8") as sim:
        yield sim


def test_exporter_attributes_time_sliced_and_whole_gpus(node: SimNode, socket_path: Path) -> None:
    uuids = [node.uuid(i) for i in range(node.gpu_count)]
    with PodResourcesServer(socket_path, node_assignments(uuids, replicas=3)) as kubelet:
        exporter = Exporter(node, socket_path)
        try:
            expected = {(uuids[0], "inference", f"infer-0-{r}") for r in range(3)} | {
                (u, "training", f"train-{i}") for i, u in enumerate(uuids[1:])
            }
            wait_for(lambda: pod_info(exporter.port) == expected)
            assert attribution_up(exporter.port) == "1"
            kubelet.remove_pod("training", "train-0")  # a pod ends: its series goes
            wait_for(
                lambda: pod_info(exporter.port) == expected - {(uuids[1], "training", "train-0")}
            )
        finally:
            exporter.stop()


def test_exporter_attributes_every_mig_instance(socket_path: Path) -> None:
    with SimNode.create(socket_path.parent / "mig.state", "a100-mig") as node:
        migs = [u for i in range(node.gpu_count) for u in node.mig_uuids(i)]
        assert len(migs) == 28
        with PodResourcesServer(socket_path, node_assignments([], migs)):
            exporter = Exporter(node, socket_path)
            try:
                expected = {(u, "research", f"notebook-{i}") for i, u in enumerate(migs)}
                wait_for(lambda: pod_info(exporter.port) == expected)
            finally:
                exporter.stop()


def test_exporter_without_kubelet_runs_then_attributes_once_it_appears(
    node: SimNode, socket_path: Path
) -> None:
    exporter = Exporter(node, socket_path)
    try:
        assert pod_info(exporter.port) == set()  # metrics are served without attribution
        assert attribution_up(exporter.port) == "0"
        assert exporter.output().count("pod attribution is off") == 1
        with PodResourcesServer(socket_path, node_assignments([node.uuid(0)], replicas=2)):
            wait_for(lambda: len(pod_info(exporter.port)) == 2)
            wait_for(lambda: attribution_up(exporter.port) == "1")
        time.sleep(0.3)  # gone again: the last mapping is kept for a while, not dropped
        assert len(pod_info(exporter.port)) == 2
        wait_for(lambda: attribution_up(exporter.port) == "0")
        errors = re.search(
            r"^gpuquota_exporter_pod_resources_errors_total (\S+)$", scrape(exporter.port), re.M
        )
        assert errors is not None and float(errors.group(1)) >= 1
    finally:
        exporter.stop()
    assert exporter.proc.returncode == 0
