"""NVLink state, counters and peers; PCIe/NVLink topology; MIG instances and profiles."""

from __future__ import annotations

import math

import pynvml
import pytest

from gpuquota.sim.nvml.models import MODELS
from gpuquota.sim.nvml.spec import load


def _handles():
    return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]


def test_h100x8_is_nvlinked_all_to_all_through_nvswitches(nvml):
    nvml("h100x8")
    hs = _handles()
    for i, a in enumerate(hs):
        assert all(pynvml.nvmlDeviceGetNvLinkState(a, link) == 1 for link in range(18))
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetNvLinkState(a, 18)
        assert (
            pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(a, 0)
            == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
        )
        assert pynvml.nvmlDeviceGetNvLinkVersion(a, 0) == 4
        for j, b in enumerate(hs):
            if i != j:
                nvlink = pynvml.nvmlDeviceGetP2PStatus(a, b, pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
                assert nvlink == pynvml.NVML_P2P_STATUS_OK
    levels = [pynvml.nvmlDeviceGetTopologyCommonAncestor(hs[0], h) for h in hs]
    assert levels[0] == pynvml.NVML_TOPOLOGY_INTERNAL
    assert levels[1] == pynvml.NVML_TOPOLOGY_SINGLE  # same PCIe switch
    assert levels[2] == pynvml.NVML_TOPOLOGY_NODE  # same NUMA node
    assert levels[7] == pynvml.NVML_TOPOLOGY_SYSTEM  # across the CPU interconnect


def test_pcie_only_nodes_have_no_nvlink_peers(nvml):
    nvml("mixed")
    h100a, h100b, a100, l4 = _handles()
    status = pynvml.nvmlDeviceGetP2PStatus
    assert status(h100a, h100b, pynvml.NVML_P2P_CAPS_INDEX_NVLINK) == pynvml.NVML_P2P_STATUS_OK
    assert status(h100a, a100, pynvml.NVML_P2P_CAPS_INDEX_NVLINK) != pynvml.NVML_P2P_STATUS_OK
    assert status(a100, l4, pynvml.NVML_P2P_CAPS_INDEX_NVLINK) != pynvml.NVML_P2P_STATUS_OK
    # a pair of directly linked GPUs: the far end is the other GPU
    assert (
        pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(h100a, 3) == pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
    )
    peer = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h100a, 3)
    assert peer.busId == pynvml.nvmlDeviceGetPciInfo(h100b).busId
    # the A100 has NVLink hardware but nothing at the other end
    assert pynvml.nvmlDeviceGetNvLinkState(a100, 0) == 0


def test_nvlink_error_counters_per_link(nvml):
    node = nvml("h100x8")
    node.set_nvlink_errors(5, 17, replay=3, recovery=1, crc_flit=9, crc_data=2)
    h = pynvml.nvmlDeviceGetHandleByIndex(5)
    counter = pynvml.nvmlDeviceGetNvLinkErrorCounter
    assert [counter(h, 17, c) for c in range(4)] == [3, 1, 9, 2]
    assert [counter(h, 16, c) for c in range(4)] == [0, 0, 0, 0]
    (total,) = pynvml.nvmlDeviceGetFieldValues(
        h, [pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL]
    )
    assert total.value.ullVal == 9
    with pytest.raises(ValueError, match="no NVLink 18"):
        node.set_nvlink_errors(5, 18, replay=1)
    node.set_nvlink_errors(5, 2, active=False)
    assert pynvml.nvmlDeviceGetNvLinkState(h, 2) == 0


def test_mig_instances_are_devices_with_their_own_identity(nvml):
    node = nvml("a100-mig")
    spec = load("a100-mig")
    for i, parent in enumerate(_handles()):
        assert pynvml.nvmlDeviceGetMigMode(parent) == [1, 1]
        assert pynvml.nvmlDeviceGetMaxMigDeviceCount(parent) == 7
        assert not pynvml.nvmlDeviceIsMigDeviceHandle(parent).value
        uuids = []
        for m in range(7):
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, m)
            assert pynvml.nvmlDeviceIsMigDeviceHandle(mig).value
            uuid = pynvml.nvmlDeviceGetUUID(mig)
            uuids.append(uuid)
            assert pynvml.nvmlDeviceGetName(mig) == "NVIDIA A100-SXM4-40GB MIG 1g.5gb"
            assert pynvml.nvmlDeviceGetMemoryInfo(mig).total == 4864 * 2**20
            assert pynvml.nvmlDeviceGetGpuInstanceId(mig) == spec.gpus[i].mig[m].gpu_instance_id
            assert pynvml.nvmlDeviceGetComputeInstanceId(mig) == 0
            back = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
            assert pynvml.nvmlDeviceGetIndex(back) == i
            by_uuid = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            assert pynvml.nvmlDeviceGetUUID(by_uuid) == uuid
            assert pynvml.nvmlDeviceIsMigDeviceHandle(by_uuid).value
        assert uuids == node.mig_uuids(i) and all(u.startswith("MIG-") for u in uuids)
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 7)
    assert len({u for i in range(4) for u in node.mig_uuids(i)}) == 28


def test_profile_name_of_an_instance_via_gpu_instance_info(nvml):
    nvml("mixed")
    parent = pynvml.nvmlDeviceGetHandleByIndex(2)
    names = {}
    for index in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(parent, index)
        except pynvml.NVMLError_NotSupported:
            continue
        names[info.id] = (info.name, info.memorySizeMB)
    assert names[19] == ("MIG 1g.5gb", 4864)
    seen = []
    for m in range(3):
        mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, m)
        gi = pynvml.nvmlDeviceGetGpuInstanceById(parent, pynvml.nvmlDeviceGetGpuInstanceId(mig))
        info = pynvml.nvmlGpuInstanceGetInfo(gi)
        seen.append((names[info.profileId][0], info.placement.start))
        ci = pynvml.nvmlGpuInstanceGetComputeInstanceById(gi, 0)
        assert pynvml.nvmlComputeInstanceGetInfo(ci).id == 0
        assert pynvml.nvmlDeviceGetAttributes(mig).memorySizeMB == names[info.profileId][1]
    assert seen == [("MIG 3g.20gb", 0), ("MIG 2g.10gb", 4), ("MIG 1g.5gb", 6)]


def test_mig_functions_on_gpus_without_mig(nvml):
    nvml("h100x8")
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetMigMode(h) == [0, 0]  # capable, switched off
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuInstanceId(h)


def test_processes_on_a_mig_instance(nvml):
    node = nvml("a100-mig")
    parent = pynvml.nvmlDeviceGetHandleByIndex(0)
    first = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    second = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 1)
    gi = pynvml.nvmlDeviceGetGpuInstanceId(first)
    node.add_process(0, 4242, 2**30, gpu_instance_id=gi, compute_instance_id=0)
    node.set_mig_memory_used(0, 0, 2**30)
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(first)
    assert [(p.pid, p.gpuInstanceId, p.computeInstanceId) for p in procs] == [(4242, gi, 0)]
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(second) == []
    assert pynvml.nvmlDeviceGetMemoryInfo(first).used == 2**30
    assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(parent)] == [4242]


@pytest.mark.parametrize(
    "model", [m for m in MODELS.values() if m.mig_profiles], ids=lambda m: m.key
)
def test_profile_names_follow_the_device_plugin_rule(model):
    """k8s-device-plugin names a MIG device "<slices>g.<ceil(memory MiB / 1024)>gb" from
    nvmlDeviceGetAttributes; the model table must agree with the names it gives."""
    for p in model.mig_profiles:
        assert p.name == f"{p.slices}g.{math.ceil(p.memory_mb / 1024)}gb"
        assert p.memory_mb * 2**20 < model.memory_total_bytes
