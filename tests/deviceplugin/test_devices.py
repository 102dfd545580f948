"""Which devices each resource advertises, and Allocate's answers, without gRPC."""

from __future__ import annotations

import pytest

from gpuquota.exporter.deviceplugin.allocate import (
    CONTROL_NODES,
    AllocationError,
    allocate_container,
)
from gpuquota.exporter.deviceplugin.devices import (
    HEALTHY,
    UNHEALTHY,
    PluginConfig,
    index_devices,
    plugin_devices,
)
from gpuquota.exporter.health.config import parse_config
from gpuquota.exporter.health.engine import DeviceTracker
from gpuquota.exporter.health.verdict import NodeHealth
from gpuquota.exporter.snapshot import DeviceState
from tests.health.factory import gpu, gpus, mig, node


def health_of(*devices, xids=()) -> NodeHealth:
    t = DeviceTracker(parse_config(None))
    h = t.observe_snapshot(node(*devices), now=0)
    for uuid, xid in xids:
        h = t.observe_xid(uuid, xid, at=1)
    return h


def test_full_gpus_with_health() -> None:
    h = health_of(*gpus(3), xids=[("GPU-00000001", 48), ("GPU-00000002", 13)])
    devices = plugin_devices(h, PluginConfig())
    assert list(devices) == ["nvidia.com/gpu"]
    listed = [(d.id, d.health) for d in devices["nvidia.com/gpu"]]
    # 48 withdraws the GPU; 13 only degrades it, and degraded GPUs still take pods.
    assert listed == [
        ("GPU-00000000", HEALTHY),
        ("GPU-00000001", UNHEALTHY),
        ("GPU-00000002", HEALTHY),
    ]
    assert devices["nvidia.com/gpu"][1].reasons == "xid_48"


def test_time_slicing_replicas() -> None:
    devices = plugin_devices(health_of(*gpus(2)), PluginConfig(replicas=3))["nvidia.com/gpu"]
    assert [d.id for d in devices] == [f"GPU-0000000{i}::{n}" for i in range(2) for n in range(3)]
    assert {d.uuid for d in devices} == {"GPU-00000000", "GPU-00000001"}


def test_mig_mixed_strategy_one_resource_per_profile() -> None:
    h = health_of(
        gpu(0, mig_mode_enabled=True),
        mig(0, 1, profile="1g.10gb"),
        mig(0, 2, profile="3g.40gb"),
        gpu(1),
        xids=[("GPU-00000000", 95)],
    )
    devices = plugin_devices(h, PluginConfig(resource_name="example.com/gpu"))
    assert sorted(devices) == [
        "example.com/gpu",
        "example.com/mig-1g.10gb",
        "example.com/mig-3g.40gb",
    ]
    assert [d.id for d in devices["example.com/gpu"]] == [
        "GPU-00000001"
    ]  # MIG parent not advertised
    inst = devices["example.com/mig-1g.10gb"][0]
    assert (inst.id, inst.gpu_uuid, inst.minor_number, inst.health) == (
        "MIG-00-01-00",
        "GPU-00000000",
        0,
        UNHEALTHY,
    )


@pytest.mark.parametrize(
    "name",
    [
        "gpu", "nvidia.com/", "/gpu", "nvidia/gpu", "nvidia.com/g pu", "a.b/c/d",
        # what the kubelet refuses too (IsExtendedResourceName)
        "NVIDIA.com/gpu", "kubernetes.io/gpu", "requests.nvidia.com/gpu", "nvidia.com/-gpu",
        "nvidia.com/mig-1g.10gb+me", "nvidia.com/" + "g" * 64, "nvi_dia.com/gpu",
    ],
)  # fmt: skip
def test_bad_resource_names(name: str) -> None:
    with pytest.raises(ValueError, match="invalid resource name"):
        PluginConfig(resource_name=name)


def test_replicas_must_be_positive() -> None:
    with pytest.raises(ValueError, match="replicas must be >= 1"):
        PluginConfig(replicas=0)


def table(config: PluginConfig, *devices, xids=()):
    return index_devices(plugin_devices(health_of(*devices, xids=xids), config)["nvidia.com/gpu"])


def test_allocate_uuids_and_device_nodes() -> None:
    config = PluginConfig()
    alloc = allocate_container(
        ["GPU-00000002", "GPU-00000000"], table(config, *gpus(3)), config, "nvidia.com/gpu"
    )
    assert alloc.envs == {"NVIDIA_VISIBLE_DEVICES": "GPU-00000002,GPU-00000000"}
    assert alloc.device_nodes == ("/dev/nvidia2", "/dev/nvidia0", *CONTROL_NODES)
    assert alloc.cdi_devices == ()


def test_allocate_replicas_collapse_to_one_gpu() -> None:
    config = PluginConfig(replicas=4)
    alloc = allocate_container(
        ["GPU-00000001::0", "GPU-00000001::3"], table(config, *gpus(2)), config, "nvidia.com/gpu"
    )
    assert alloc.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-00000001"
    assert alloc.device_nodes[0] == "/dev/nvidia1" and len(alloc.device_nodes) == 1 + len(
        CONTROL_NODES
    )


def test_allocate_with_cdi() -> None:
    config = PluginConfig(cdi=True)
    alloc = allocate_container(["GPU-00000001"], table(config, *gpus(2)), config, "nvidia.com/gpu")
    assert alloc.cdi_devices == ("nvidia.com/gpu=GPU-00000001",)
    assert alloc.envs == {"NVIDIA_VISIBLE_DEVICES": "void"} and alloc.device_nodes == ()


@pytest.mark.parametrize(
    ("ids", "kind", "message"),
    [
        ([], "invalid", "names no devices"),
        (["GPU-00000009"], "invalid", "unknown nvidia.com/gpu device ID(s): GPU-00000009"),
        (["GPU-00000000", "GPU-00000000"], "invalid", "requested twice: GPU-00000000"),
        (["GPU-00000000", "GPU-00000001"], "precondition", "GPU-00000001 (xid_79)"),
    ],
)
def test_allocate_refusals(ids: list[str], kind: str, message: str) -> None:
    config = PluginConfig()
    devices = table(config, *gpus(2), xids=[("GPU-00000001", 79)])
    with pytest.raises(AllocationError) as err:
        allocate_container(ids, devices, config, "nvidia.com/gpu")
    assert err.value.kind == kind
    assert message in err.value.message


def test_allocate_without_minor_number_is_refused() -> None:
    config = PluginConfig()
    devices = table(config, gpu(0, minor_number=None))
    with pytest.raises(AllocationError, match="no minor number"):
        allocate_container(["GPU-00000000"], devices, config, "nvidia.com/gpu")


def test_lost_gpu_is_unhealthy_for_the_kubelet() -> None:
    config = PluginConfig()
    devices = table(config, gpu(0, state=DeviceState.LOST))
    assert devices["GPU-00000000"].health == UNHEALTHY
