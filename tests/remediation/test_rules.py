"""The central remediation's pure rules: the agents' published verdicts read back (written by
the agent's own code), which pod object holds a fenced device, who is never touched, the
circuit breaker's arithmetic and the pod condition."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from gpuquota.exporter.dra.taintrules import wanted_rules
from gpuquota.exporter.enrich.slices import DraDevice
from gpuquota.exporter.health.config import parse_config
from gpuquota.exporter.health.engine import DeviceTracker
from gpuquota.exporter.health.verdict import NodeHealth
from gpuquota.exporter.nodestatus.status import condition_for, taints_with, wanted_status
from gpuquota.quota.remediation.rules import (
    Breaker,
    held_devices,
    pod_condition,
    still_the_one,
    trouble_of,
    untouchable,
)
from gpuquota.quota.remediation.verdicts import read_verdicts
from tests.health.factory import gpu, gpus, mig, node

Obj = dict[str, Any]
DRIVER = "gpu.nvidia.com"


def health_after(*xids: tuple[int, int]) -> NodeHealth:
    tracker = DeviceTracker(parse_config(None, quiet_period_s=1000))
    health = tracker.observe_snapshot(node(*gpus(4)), 1000.0)
    for index, xid in xids:
        health = tracker.observe_xid(f"GPU-{index:08d}", xid, at=1001.0)
    return health


def published_node(name: str, health: NodeHealth, gpu_count: int = 4) -> Obj:
    """A Node as the agent leaves it (its own status and taint functions)."""
    wanted = wanted_status(health)
    return {
        "metadata": {"name": name},
        "spec": {"taints": taints_with([], wanted.unhealthy) or []},
        "status": {
            "capacity": {"nvidia.com/gpu": str(gpu_count)},
            "conditions": [condition_for(wanted, [], "2026-11-29T00:00:00Z")],
        },
    }


def pod(name: str, node_name: str, devices: dict[str, str], uid: str = "", **status: Any) -> Obj:
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": uid or f"uid-{name}"},
        "spec": {"nodeName": node_name},
        "status": {
            "phase": "Running",
            "containerStatuses": [{"name": "main", "allocatedResourcesStatus": [{
                "name": "nvidia.com/gpu",
                "resources": [{"resourceID": d, "health": h} for d, h in devices.items()],
            }]}],
            **status,
        },
    }  # fmt: skip


def test_verdicts_are_read_back_from_what_the_agents_publish() -> None:
    nodes = [
        published_node("a", health_after((0, 79), (1, 48), (2, 13))),
        published_node("b", health_after()),
        {"metadata": {"name": "cpu-only"}, "status": {"capacity": {"cpu": "64"}}},
        {"metadata": {"name": "dra-node", "labels": {"nvidia.com/gpu.present": "true"}}},
    ]
    verdicts = read_verdicts(nodes, [])
    assert verdicts.gpu_nodes == {"a", "b", "dra-node"}
    assert verdicts.reporting == {"a"}
    fenced = {d.uuid: (d.action.label, d.reasons, d.acted_on) for d in verdicts.fenced["a"]}
    assert fenced == {
        "GPU-00000000": ("reboot_node", "xid_79", True),
        "GPU-00000001": ("reset_gpu", "xid_48", True),
    }  # XID 13 (the application's own error) fences nothing


def test_dra_fences_come_from_the_agents_device_taint_rules_and_claims() -> None:
    devices = [DraDevice(DRIVER, "node-d", f"gpu-{i}", f"GPU-{i:08d}") for i in range(4)]
    rules = list(wanted_rules(health_after((0, 79)), devices, "node-d").values())
    foreign = {**rules[0], "metadata": {**rules[0]["metadata"], "labels": {}}}  # not ours
    verdicts = read_verdicts([], [*rules, foreign])
    assert verdicts.gpu_nodes == {"node-d"}
    [device] = verdicts.fenced["node-d"]
    assert (device.uuid, device.dra) == ("GPU-00000000", (DRIVER, "node-d", "gpu-0"))
    claim = {"status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "uid-p"}],
                        "allocation": {"devices": {"results": [
                            {"request": "gpu", "driver": DRIVER, "pool": "node-d",
                             "device": "gpu-0"}]}}}}  # fmt: skip
    p = pod("p", "node-d", {}, resourceClaimStatuses=[{"name": "gpu", "resourceClaimName": "c"}])
    trouble = trouble_of(p, verdicts, {("ml", "c"): claim})
    assert trouble is not None and trouble.uuids() == ("GPU-00000000",)
    # the same claim name, reserved for the pod object that went before: not this one's
    other = pod("p", "node-d", {}, uid="uid-new",
                resourceClaimStatuses=[{"name": "gpu", "resourceClaimName": "c"}])  # fmt: skip
    assert trouble_of(other, verdicts, {("ml", "c"): claim}) is None
    # DRA's own health in allocatedResourcesStatus (driver/pool/device) also names it
    assert trouble_of(pod("q", "node-d", {f"{DRIVER}/node-d/gpu-0": "Unhealthy"}), verdicts, {})


def test_the_pod_object_on_the_fenced_node_holding_the_device_is_in_trouble() -> None:
    verdicts = read_verdicts([published_node("a", health_after((0, 79)))], [])
    bad = "GPU-00000000"
    assert trouble_of(pod("p", "a", {bad: "Unhealthy"}), verdicts, {}) is not None
    assert trouble_of(pod("p", "a", {f"{bad}::2": "Unhealthy"}), verdicts, {}) is not None
    assert trouble_of(pod("p", "a", {bad: "Healthy"}), verdicts, {}) is None  # kubelet says no
    assert trouble_of(pod("p", "a", {bad: "Unknown"}), verdicts, {}) is None
    assert trouble_of(pod("p", "b", {bad: "Unhealthy"}), verdicts, {}) is None  # another node
    assert trouble_of(pod("p", "a", {"GPU-00000001": "Unhealthy"}), verdicts, {}) is None
    trouble = trouble_of(pod("p", "a", {bad: "Unhealthy"}), verdicts, {})
    assert trouble is not None
    assert still_the_one(pod("p", "a", {bad: "Unhealthy"}), trouble, {}) is None
    recreated = pod("p", "b", {"GPU-00000009": "Healthy"}, uid="uid-other")
    assert "recreated" in (still_the_one(recreated, trouble, {}) or "")
    moved = pod("p", "b", {bad: "Unhealthy"})  # same UID on another node cannot happen, but
    assert "not on the fenced node" in (still_the_one(moved, trouble, {}) or "")
    assert "holds none" in (still_the_one(pod("p", "a", {}), trouble, {}) or "")
    assert held_devices(pod("p", "", {bad: "Unhealthy"}), trouble.devices, {}) == ()


def test_a_mig_instance_of_a_fenced_gpu_is_its_pods_trouble() -> None:
    tracker = DeviceTracker(parse_config(None, quiet_period_s=1000))
    tracker.observe_snapshot(node(gpu(0, mig_mode_enabled=True), mig(0, 1), mig(0, 2)), 1000.0)
    contained = tracker.observe_xid("GPU-00000000", 94, at=1001.0, gpu_instance_id=1,
                                    compute_instance_id=0)  # fmt: skip
    verdicts = read_verdicts([published_node("a", contained)], [])
    one = pod("one", "a", {"MIG-00-01-00": "Unhealthy"})
    assert trouble_of(one, verdicts, {}) is None  # contained: restart the application
    whole = tracker.observe_xid("GPU-00000000", 79, at=1002.0)  # the GPU fell off the bus
    verdicts = read_verdicts([published_node("a", whole)], [])
    trouble = trouble_of(one, verdicts, {})
    assert trouble is not None and trouble.uuids() == ("MIG-00-01-00",)


def test_pods_that_are_never_touched() -> None:
    def meta(**m: Any) -> Obj:
        phase = m.pop("phase", "Running")
        return {"metadata": {"name": "p", **m}, "status": {"phase": phase}}

    assert untouchable(meta()) is None
    assert "static" in (untouchable(meta(annotations={"kubernetes.io/config.mirror": "x"})) or "")
    assert "terminating" in (untouchable(meta(deletionTimestamp="2026-01-01T00:00:00Z")) or "")
    assert "finished" in (untouchable(meta(phase="Failed")) or "")
    out = meta(annotations={"gpuquota.io/evict-on-gpu-failure": "False"})
    assert "opted out" in (untouchable(out) or "")


@pytest.mark.parametrize(
    ("gpu_nodes", "reporting", "share", "min_nodes", "tripped"),
    [
        (10, 1, "20%", 2, False),  # one node alone
        (10, 2, "20%", 2, False),  # exactly the share: not more
        (10, 3, "20%", 2, True),
        (2, 1, "20%", 2, False),  # half of a small cluster, but one node
        (2, 2, "20%", 2, True),
        (100, 30, "50%", 2, False),
        (4, 4, "100%", 1, False),  # 100%: never
    ],
)
def test_the_breaker_trips_on_more_than_its_share_and_its_node_count(
    gpu_nodes: int, reporting: int, share: str, min_nodes: int, tripped: bool
) -> None:
    from gpuquota.cli_common.ratios import parse_ratio

    sick = health_after((0, 79))
    nodes = [published_node(f"n{i}", sick if i < reporting else health_after())
             for i in range(gpu_nodes)]  # fmt: skip
    why = Breaker(parse_ratio(share), min_nodes).tripped(read_verdicts(nodes, []))
    assert (why is not None) == tripped
    if why:
        assert f"{reporting} of {gpu_nodes} GPU nodes" in why
    with pytest.raises(ValueError, match="share"):
        Breaker(Fraction(0), 1)


def test_condition_is_written_on_change_only() -> None:
    verdicts = read_verdicts([published_node("a", health_after((0, 79)))], [])
    trouble = trouble_of(pod("p", "a", {"GPU-00000000": "Unhealthy"}), verdicts, {})
    assert trouble is not None
    assert pod_condition(None, None, "t0") is None  # never marked, nothing wrong: no write
    first = pod_condition(trouble, None, "t1")
    assert first is not None and (first["status"], first["reason"]) == ("True", "GPUNeedsReboot")
    assert first["message"] == "GPU-00000000 (xid_79; action reboot_node)"
    assert pod_condition(trouble, first, "t2") is None
    cleared = pod_condition(None, first, "t3")
    assert cleared is not None and (cleared["status"], cleared["lastTransitionTime"]) == (
        "False",
        "t3",
    )
    assert pod_condition(None, cleared, "t4") is None
