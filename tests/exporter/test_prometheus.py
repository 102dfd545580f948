"""A real Prometheus server scrapes gpu-exporter (over the NVML stand-in) on loopback; values
read back through Prometheus's HTTP API must be what the stand-in was set to."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from gpuquota.sim.nvml.control import SimNode
from tests.exporter.procs import Exporter
from tests.prometheus import Prometheus, running

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[[int], Prometheus]]:
    with ExitStack() as stack:

        def start(target_port: int) -> Prometheus:
            return stack.enter_context(running(tmp_path, {"gpu": [target_port]}))

        yield start


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
