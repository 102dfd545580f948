"""The NVML functions every client starts with, through the real pynvml, per preset."""

from __future__ import annotations

import json
import time

import pynvml
import pytest

from gpuquota.sim.nvml.models import MODELS
from gpuquota.sim.nvml.spec import PRESETS, load
from tests.sim_nvml.conftest import run_python

EXPECTED_COUNTS = {"h100x8": 8, "a100-mig": 4, "l4x2": 2, "mixed": 4}


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_identity_and_readings_match_the_model(nvml, preset):
    node = nvml(preset)
    spec = load(preset)
    assert pynvml.nvmlDeviceGetCount() == EXPECTED_COUNTS[preset] == node.gpu_count
    assert pynvml.nvmlSystemGetDriverVersion() == "550.54.15"
    assert pynvml.nvmlSystemGetNVMLVersion() == "12.550.54.15"
    assert pynvml.nvmlSystemGetCudaDriverVersion() == 12040
    assert pynvml.nvmlSystemGetCudaDriverVersion_v2() == 12040
    bus_ids = set()
    for i, gpu in enumerate(spec.gpus):
        m = gpu.model
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        assert pynvml.nvmlDeviceGetName(h) == m.name
        uuid = pynvml.nvmlDeviceGetUUID(h)
        assert uuid == node.uuid(i) == gpu.uuid and uuid.startswith("GPU-")
        same = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        assert pynvml.nvmlDeviceGetIndex(same) == i
        pci = pynvml.nvmlDeviceGetPciInfo(h)
        assert pci.pciDeviceId == m.pci_device_id
        assert pci.busId == f"00000000:{pci.bus:02X}:00.0"
        bus_ids.add(pci.busId)
        assert pynvml.nvmlDeviceGetPciInfo_v3(h).busId == pci.busId
        assert pynvml.nvmlDeviceGetMinorNumber(h) == i
        assert pynvml.nvmlDeviceGetSerial(h).isdigit()
        assert pynvml.nvmlDeviceGetVbiosVersion(h) == m.vbios_version
        assert pynvml.nvmlDeviceGetCudaComputeCapability(h) == m.compute_capability
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        assert mem.total == m.memory_total_bytes
        assert mem.used + mem.free == mem.total
        mem2 = pynvml.nvmlDeviceGetMemoryInfo(h, pynvml.nvmlMemory_v2)
        assert mem2.reserved == m.memory_reserved_bytes
        assert pynvml.nvmlDeviceGetEnforcedPowerLimit(h) == m.power_limit_watts * 1000
        assert pynvml.nvmlDeviceGetPowerUsage(h) == m.idle_power_watts * 1000
        assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == m.max_sm_clock_mhz
        assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM) == m.max_memory_clock_mhz
    assert len(bus_ids) == node.gpu_count


def test_models_named_in_the_brief_have_their_limits():
    h100, a100, l4 = MODELS["H100-SXM5-80GB"], MODELS["A100-SXM4-40GB"], MODELS["L4"]
    assert (h100.power_limit_watts, h100.compute_capability, h100.nvlinks) == (700, (9, 0), 18)
    assert (a100.power_limit_watts, a100.compute_capability) == (400, (8, 0))
    assert a100.profile("1g.5gb").max_instances == 7
    assert (l4.power_limit_watts, l4.compute_capability, l4.ecc, l4.nvlinks) == (
        72,
        (8, 9),
        False,
        0,
    )


def test_set_values_are_read_back_in_nvml_units(nvml):
    node = nvml("h100x8")
    node.set(
        2,
        gpu_utilization_ratio=0.87,
        memory_utilization_ratio=0.4,
        memory_used_bytes=40 * 2**30,
        gpu_temperature_celsius=71.0,
        power_watts=512.5,
        sm_clock_hertz=1.755e9,
    )
    h = pynvml.nvmlDeviceGetHandleByIndex(2)
    util = pynvml.nvmlDeviceGetUtilizationRates(h)
    assert (util.gpu, util.memory) == (87, 40)
    mem = pynvml.nvmlDeviceGetMemoryInfo(h)
    assert mem.used == 40 * 2**30
    assert mem.free == mem.total - 40 * 2**30
    assert pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) == 71
    assert pynvml.nvmlDeviceGetPowerUsage(h) == 512500
    assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == 1755
    other = pynvml.nvmlDeviceGetHandleByIndex(3)
    assert pynvml.nvmlDeviceGetUtilizationRates(other).gpu == 0


def test_energy_counter_grows_at_the_configured_power_and_never_goes_back(nvml):
    node = nvml("l4x2")
    node.set(0, power_watts=60.0)
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    t0, e0 = time.monotonic(), pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
    time.sleep(0.2)
    t1, e1 = time.monotonic(), pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
    rate_watts = (e1 - e0) / 1000 / (t1 - t0)
    assert 50 < rate_watts < 70
    node.set(0, power_watts=10.0)  # a lower power slows the counter, never rewinds it
    e2 = pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
    assert e2 >= e1


def test_a_subprocess_finds_the_stand_in_through_env(make_node):
    node = make_node("l4x2")
    node.set(1, power_watts=33.0)
    code = (
        "import json, pynvml as n; n.nvmlInit();"
        "h = n.nvmlDeviceGetHandleByIndex(1);"
        "print(json.dumps([n.nvmlDeviceGetCount(), n.nvmlDeviceGetUUID(h),"
        " n.nvmlDeviceGetPowerUsage(h)])); n.nvmlShutdown()"
    )
    out = run_python(node, code)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [2, node.uuid(1), 33000]


def test_init_without_state_says_driver_not_loaded(make_node):
    node = make_node("l4x2")
    code = (
        "import os\nos.environ.pop('GPUQUOTA_SIM_STATE')\nimport pynvml as n\n"
        "try:\n    n.nvmlInit()\nexcept n.NVMLError as e:\n    print(e.value)\n"
    )
    out = run_python(node, code)
    assert out.stdout.strip() == str(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    assert "GPUQUOTA_SIM_STATE" in out.stderr


def test_uuids_are_deterministic_per_spec(make_node):
    a = make_node("h100x8", "a.state")
    b = make_node("h100x8", "b.state")
    c = make_node({"name": "other", "gpus": [{"model": "H100-SXM5-80GB", "count": 8}]}, "c.state")
    assert [a.uuid(i) for i in range(8)] == [b.uuid(i) for i in range(8)]
    assert len({a.uuid(i) for i in range(8)}) == 8
    assert a.uuid(0) != c.uuid(0)


def test_unimplemented_functions_answer_not_supported(nvml):
    nvml("h100x8")
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError) as err:
        pynvml.nvmlDeviceGetGspFirmwareVersion(h)
    assert err.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert pynvml.nvmlErrorString(pynvml.NVML_ERROR_GPU_IS_LOST) == "GPU is lost"


def test_init_switches_to_the_node_named_now(nvml, make_node):
    first = nvml("l4x2")
    assert pynvml.nvmlDeviceGetCount() == 2
    second = make_node("h100x8", "second.state")
    second.preload()
    pynvml.nvmlInit()  # a second session in the same process: the newest node wins
    try:
        assert pynvml.nvmlDeviceGetCount() == 8
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pynvml.nvmlDeviceGetUUID(h) == second.uuid(0) != first.uuid(0)
    finally:
        pynvml.nvmlShutdown()
