"""Faults: GPU lost, reset required, forced return codes."""

from __future__ import annotations

import pynvml
import pytest


def _code(fn, *args):
    with pytest.raises(pynvml.NVMLError) as err:
        fn(*args)
    return err.value.value


LOST = pynvml.NVML_ERROR_GPU_IS_LOST
RESET = pynvml.NVML_ERROR_RESET_REQUIRED


def test_a_lost_gpu_fails_every_call_and_spares_the_others(nvml):
    node = nvml("h100x8")
    node.set_lost(3)
    h = pynvml.nvmlDeviceGetHandleByIndex(3)  # still handed out, as NVML does
    for fn, args in [
        (pynvml.nvmlDeviceGetUUID, ()),
        (pynvml.nvmlDeviceGetName, ()),
        (pynvml.nvmlDeviceGetPciInfo, ()),
        (pynvml.nvmlDeviceGetPowerUsage, ()),
        (pynvml.nvmlDeviceGetMemoryInfo, ()),
        (pynvml.nvmlDeviceGetTemperature, (0,)),
        (pynvml.nvmlDeviceGetTotalEccErrors, (1, 0)),
        (pynvml.nvmlDeviceGetNvLinkState, (0,)),
        (pynvml.nvmlDeviceGetComputeRunningProcesses, ()),
    ]:
        assert _code(fn, h, *args) == LOST, fn.__name__
    assert _code(pynvml.nvmlDeviceGetHandleByUUID, node.uuid(3)) == LOST
    assert pynvml.nvmlDeviceGetCount() == 8
    assert pynvml.nvmlDeviceGetPowerUsage(pynvml.nvmlDeviceGetHandleByIndex(2)) > 0
    node.set_lost(3, False)
    assert pynvml.nvmlDeviceGetUUID(h) == node.uuid(3)


def test_a_driver_that_refuses_the_handle_of_a_lost_gpu(nvml):
    node = nvml("l4x2")
    node.set_lost(1)
    node.fail_call(1, "nvmlDeviceGetHandleByIndex", LOST)
    assert _code(pynvml.nvmlDeviceGetHandleByIndex, 1) == LOST
    assert pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0)) == node.uuid(0)


def test_a_lost_parent_takes_its_mig_instances_with_it(nvml):
    node = nvml("a100-mig")
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(pynvml.nvmlDeviceGetHandleByIndex(1), 0)
    node.set_lost(1)
    assert _code(pynvml.nvmlDeviceGetMemoryInfo, mig) == LOST


def test_reset_required_keeps_identity_readable(nvml):
    node = nvml("l4x2")
    node.set_reset_required(0)
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetUUID(h) == node.uuid(0)
    assert pynvml.nvmlDeviceGetPciInfo(h).bus > 0
    assert _code(pynvml.nvmlDeviceGetUtilizationRates, h) == RESET
    assert _code(pynvml.nvmlDeviceGetPowerUsage, h) == RESET
    node.set_reset_required(0, False)
    assert pynvml.nvmlDeviceGetPowerUsage(h) > 0


def test_fail_call_forces_one_function_on_one_gpu(nvml):
    node = nvml("l4x2")
    node.fail_call(1, "nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_UNKNOWN)
    node.fail_call(1, "nvmlDeviceGetPciInfo", pynvml.NVML_ERROR_TIMEOUT)  # the _v3 symbol too
    h0, h1 = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(2))
    assert _code(pynvml.nvmlDeviceGetPowerUsage, h1) == pynvml.NVML_ERROR_UNKNOWN
    assert _code(pynvml.nvmlDeviceGetPciInfo, h1) == pynvml.NVML_ERROR_TIMEOUT
    assert pynvml.nvmlDeviceGetPowerUsage(h0) > 0
    assert pynvml.nvmlDeviceGetTemperature(h1, 0) > 0
    node.fail_call(1, "nvmlDeviceGetPowerUsage", None)
    assert pynvml.nvmlDeviceGetPowerUsage(h1) > 0


def test_fail_call_on_system_functions(nvml):
    node = nvml("l4x2")
    node.fail_call(None, "nvmlSystemGetDriverVersion", pynvml.NVML_ERROR_NO_PERMISSION)
    assert _code(pynvml.nvmlSystemGetDriverVersion) == pynvml.NVML_ERROR_NO_PERMISSION
    node.fail_call(None, "nvmlSystemGetDriverVersion", None)
    assert pynvml.nvmlSystemGetDriverVersion() == "550.54.15"
    with pytest.raises(ValueError, match="not an NVML function"):
        node.fail_call(0, "GetPowerUsage", 999)
    with pytest.raises(ValueError, match="no GPU 2"):
        node.fail_call(2, "nvmlDeviceGetPowerUsage", 999)


def test_calls_before_init_or_after_shutdown_are_uninitialized(nvml):
    nvml("l4x2")
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    pynvml.nvmlShutdown()
    try:
        assert _code(pynvml.nvmlDeviceGetPowerUsage, h) == pynvml.NVML_ERROR_UNINITIALIZED
    finally:
        pynvml.nvmlInit()  # the fixture shuts down once more
