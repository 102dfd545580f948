"""A real Prometheus server scrapes gpu-exporter (over the NVML stand-in) on loopback; values
read back through Prometheus's HTTP API must be what the stand-in was set to."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sim.harness import stop_process
from sim.nvml.control import SimNode
from tests.exporter.procs import Exporter, free_port

PROMETHEUS = "/usr/bin/prometheus"

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]


class Prometheus:
    def __init__(self, proc: subprocess.Popen[bytes], port: int) -> None:
        self.proc = proc
        self.url = f"http://127.0.0.1:{port}"

    def query(self, promql: str) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=5) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def wait_for(self, promql: str, check: Callable[[list[dict[str, Any]]], bool]) -> list:
        deadline = time.monotonic() + 20
        result: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            result = self.query(promql)
            if check(result):
                return result
            time.sleep(0.2)
        raise AssertionError(f"{promql}: never satisfied; last result {result}")


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[[int], Prometheus]]:
    if not Path(PROMETHEUS).exists() and shutil.which("prometheus") is None:
        pytest.skip(f"{PROMETHEUS} not installed (Debian: apt-get install prometheus)")
    binary = PROMETHEUS if Path(PROMETHEUS).exists() else str(shutil.which("prometheus"))
    started: list[Prometheus] = []

    def start(target_port: int) -> Prometheus:
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            "scrape_configs:\n  - job_name: gpu\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{target_port}']\n"
        )
        port = free_port()
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        server = Prometheus(proc, port)
        started.append(server)
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"prometheus exited: {proc.communicate()[1].decode()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return server
            except OSError:
                pass
            assert time.monotonic() < deadline, "prometheus never became ready"
            time.sleep(0.1)

    yield start
    for server in started:
        stop_process(server.proc, timeout=15)


def test_prometheus_reads_what_the_stand_in_was_set_to(
    make_node: Callable[..., SimNode],
    start_exporter: Callable[..., Exporter],
    prometheus: Callable[[int], Prometheus],
) -> None:
    node = make_node("mixed")
    for i in range(node.gpu_count):
        node.set(i, power_watts=50.0 + 10 * i, memory_used_bytes=(i + 2) * 2**30)
    exporter = start_exporter(node, "--interval", "200ms", "--compat", "dcgm")
    prom = prometheus(exporter.port)

    prom.wait_for('up{job="gpu"}', lambda r: bool(r) and r[0]["value"][1] == "1")
    power = prom.wait_for("gpu_power_watts", lambda r: len(r) == node.gpu_count)
    by_uuid = {s["metric"]["uuid"]: float(s["value"][1]) for s in power}
    assert by_uuid == {node.uuid(i): 50.0 + 10 * i for i in range(node.gpu_count)}

    # Identity joins on uuid; units are base units; dcgm names carry dcgm's units.
    joined = prom.query('gpu_power_watts * on(uuid) group_left(model) gpu_info{model="NVIDIA L4"}')
    assert [(s["metric"]["uuid"], float(s["value"][1])) for s in joined] == [(node.uuid(3), 80.0)]
    used = prom.query("gpu_memory_used_bytes{gpu_instance_id=''}")
    assert {s["metric"]["uuid"]: float(s["value"][1]) for s in used} == {
        node.uuid(i): float((i + 2) * 2**30) for i in range(node.gpu_count)
    }
    fb = prom.query("DCGM_FI_DEV_FB_USED{GPU_I_ID=''}")
    assert {s["metric"]["UUID"]: float(s["value"][1]) for s in fb} == {
        node.uuid(i): float((i + 2) * 1024) for i in range(node.gpu_count)
    }
    migs = prom.query("count(gpu_mig_info)")
    assert float(migs[0]["value"][1]) == len(node.mig_uuids(2))

    # A change in the stand-in reaches Prometheus on a later scrape.
    node.set(0, power_watts=123.0)
    prom.wait_for(
        f'gpu_power_watts{{uuid="{node.uuid(0)}"}}',
        lambda r: bool(r) and float(r[0]["value"][1]) == 123.0,
    )
    energy = prom.wait_for(
        f'rate(gpu_energy_joules_total{{uuid="{node.uuid(0)}"}}[5s])', lambda r: bool(r)
    )
    assert float(energy[0]["value"][1]) > 0
