"""End to end: gpu-exporter (the real CLI, a subprocess) on the NVML stand-in, attributing
GPUs to pods through the kubelet stand-in over its unix socket."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from sim.harness import stop_process, wait_for
from sim.kubelet.podresources import PodResourcesServer, node_assignments
from sim.nvml.control import SimNode

EXPORTER = Path(sys.executable).with_name("gpu-exporter")
POD_INFO = re.compile(r"^gpu_pod_info\{([^}]*)\} 1$", re.M)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def attribution_up(port: int) -> str | None:
    match = re.search(r"^gpuquota_exporter_pod_resources_up (\S+)$", scrape(port), re.M)
    return match.group(1) if match else None


def pod_info(port: int) -> set[tuple[str, str, str]]:
    """(uuid, namespace, pod) of every gpu_pod_info series."""
    body = scrape(port)
    found = set()
    for labels in POD_INFO.findall(body):
        pairs = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        found.add((pairs["uuid"], pairs["namespace"], pairs["pod"]))
    return found


@pytest.fixture
def node(socket_path: Path) -> Iterator[SimNode]:
    # the state file lives beside the socket, in the fixture's short-lived /tmp folder
    with SimNode.create(socket_path.parent / "nvml.state", "h100x8") as sim:
        yield sim


class Exporter:
    def __init__(self, node: SimNode, socket_path: Path, *extra: str) -> None:
        self.log = (socket_path.parent / "exporter.log").open("w+")
        self.proc = subprocess.Popen(
            [
                str(EXPORTER),
                "--listen=127.0.0.1:0",
                "--interval=100ms",
                f"--pod-resources-socket={socket_path}",
                "--pod-resources-interval=100ms",
                *extra,
            ],
            env={**os.environ, **node.env()},
            stdout=self.log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.port = self._bound_port()

    def _bound_port(self) -> int:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            match = re.search(r"serving http://[^ ]*:(\d+)/metrics", self.output())
            if match:
                return int(match.group(1))
            if self.proc.poll() is not None:
                raise AssertionError(f"gpu-exporter exited: {self.output()}")
            time.sleep(0.05)
        raise AssertionError(f"gpu-exporter did not start: {self.output()}")

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()


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
