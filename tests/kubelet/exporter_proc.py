"""gpu-exporter as a subprocess on the NVML stand-in, attributing through a kubelet stand-in
socket (shared by the attribution, DRA and DeviceTaintRule tests), and reading its metrics."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from gpuquota.sim.harness import stop_process
from gpuquota.sim.nvml.control import SimNode

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
