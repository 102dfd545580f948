"""Fences survive exporter restarts (issue 17, finding 7): a restarted gpu-exporter reads back
the fences it owns (its DeviceTaintRules, its Node taint and condition), holds those GPUs as
they were fenced, and lets go only when NVML says the GPU recovered (and, for a reboot, the
node has booted since). The NVML stand-in keeps a GPU's state across processes, as a GPU does.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuquota.exporter.health.config import parse_config
from gpuquota.exporter.health.engine import RESTORED, DeviceTracker, Fence
from gpuquota.exporter.health.verdict import Action, State
from gpuquota.sim.apiserver import ApiServer
from gpuquota.sim.harness import wait_for
from gpuquota.sim.nvml import spec
from gpuquota.sim.nvml.control import SimNode
from gpuquota.sim.nvml.resourceslices import resource_slices
from tests.deploy.manifests import DEPLOY
from tests.health.factory import gpu, gpus, node
from tests.kubelet.exporter_proc import Exporter

FENCED_AT = 1_000.0
REBOOT = Fence("GPU-00000001", Action.REBOOT_NODE, "xid_79", FENCED_AT)
RESET = Fence("GPU-00000002", Action.RESET_GPU, "xid_48", FENCED_AT)


def _state(t: DeviceTracker, uuid: str) -> tuple[State, Action, list[str]]:
    device = t.health.get(uuid)
    assert device is not None
    return device.state, device.action, [r.code for r in device.reasons]


def test_a_restored_reboot_fence_holds_until_the_node_has_rebooted() -> None:
    # the exporter restarted; the node did not (it booted before the fence was set)
    t = DeviceTracker(parse_config(None, quiet_period_s=10), boot_time=FENCED_AT - 500)
    t.restore([REBOOT], now=2_000)
    t.observe_snapshot(node(*gpus(3)), now=2_001)  # NVML: nothing pending, no recovery action
    t.expire(9_999)
    assert _state(t, REBOOT.uuid) == (State.UNHEALTHY, Action.REBOOT_NODE, [RESTORED])
    # after a reboot (a new process, a new boot time), NVML's word counts
    rebooted = DeviceTracker(parse_config(None, quiet_period_s=10), boot_time=FENCED_AT + 60)
    rebooted.restore([REBOOT], now=2_000)
    asking = rebooted.observe_snapshot(node(gpu(0), gpu(1, recovery_action=2)), now=2_001)
    assert asking.get(REBOOT.uuid).state is State.UNHEALTHY  # type: ignore[union-attr]
    assert _state(rebooted, REBOOT.uuid)[2] == ["fence_restored", "recovery_reboot"]
    healed = rebooted.observe_snapshot(node(*gpus(2, recovery_action=0)), now=2_002)
    assert healed.get(REBOOT.uuid).state is State.HEALTHY  # type: ignore[union-attr]
    assert rebooted.restored == frozenset()


def test_a_restored_reset_fence_holds_for_a_quiet_period_and_while_nvml_says_pending() -> None:
    t = DeviceTracker(parse_config(None, quiet_period_s=10), boot_time=0)
    t.restore([RESET], now=100)
    t.observe_snapshot(node(*gpus(3)), now=105)
    assert _state(t, RESET.uuid)[0] is State.UNHEALTHY  # within the quiet period
    pending = node(gpu(0), gpu(1), gpu(2, remap_pending=True))
    t.observe_snapshot(pending, now=200)
    assert RESET.uuid in t.restored  # NVML still says a remap is pending
    t.observe_snapshot(node(gpu(0), gpu(1), gpu(2, recovery_action=1)), now=201)
    assert RESET.uuid in t.restored  # the driver asks for a reset
    clean = gpus(3, recovery_action=0, remap_pending=False, retired_pages_pending=False)
    t.observe_snapshot(node(*clean), now=202)
    assert _state(t, RESET.uuid) == (State.HEALTHY, Action.NONE, [])
    assert t.restored == frozenset()


def test_fences_merge_to_the_most_drastic_action_and_can_be_turned_off() -> None:
    t = DeviceTracker(parse_config(None), boot_time=0)
    t.restore([Fence(REBOOT.uuid, Action.RESET_GPU, "xid_48", 1), REBOOT], now=5)
    assert _state(t, REBOOT.uuid)[:2] == (State.UNHEALTHY, Action.REBOOT_NODE)
    off = DeviceTracker(parse_config({"conditions": {RESTORED: {"state": "healthy"}}}))
    off.restore([REBOOT], now=5)
    assert off.restored == frozenset()


def test_a_restored_fence_of_a_device_nvml_no_longer_lists_is_released() -> None:
    """The fenced MIG instance was reconfigured away (or the board replaced) while the
    exporter was down: NVML answers and does not list it. Its restored fence held it, as
    "missing", for ever; now it goes after the quiet period (a reboot fence: once the node
    has booted since), and the device leaves the verdict."""
    gone_mig = Fence("MIG-00000009", Action.RESET_GPU, "xid_48", FENCED_AT)
    gone_gpu = Fence("GPU-00000009", Action.REBOOT_NODE, "xid_79", FENCED_AT)
    t = DeviceTracker(parse_config(None, quiet_period_s=10), boot_time=FENCED_AT - 500)
    t.restore([gone_mig, gone_gpu], now=2_000)
    t.observe_snapshot(node(*gpus(2)), now=2_001)
    assert _state(t, gone_mig.uuid) == (State.UNHEALTHY, Action.RESET_GPU, [RESTORED])
    t.observe_snapshot(node(*gpus(2)), now=2_011)
    assert t.health.get(gone_mig.uuid) is None and gone_mig.uuid not in t.restored
    # not rebooted since the reboot fence: held (a GPU off the bus may come back with one)
    assert _state(t, gone_gpu.uuid) == (State.UNHEALTHY, Action.REBOOT_NODE, [RESTORED])
    rebooted = DeviceTracker(parse_config(None, quiet_period_s=10), boot_time=FENCED_AT + 60)
    rebooted.restore([gone_gpu], now=2_000)
    rebooted.observe_snapshot(node(*gpus(2)), now=2_001)
    assert rebooted.health.get(gone_gpu.uuid) is None and rebooted.restored == frozenset()
    # NVML not answering says nothing about what it lists: held
    held = DeviceTracker(parse_config(None, quiet_period_s=10), boot_time=FENCED_AT + 60)
    held.restore([gone_gpu], now=2_000)
    held.observe_snapshot(node(*gpus(2), ok=False), now=2_001)
    assert gone_gpu.uuid in held.restored


# -- end to end: gpu-exporter processes on the NVML and API server stand-ins -------------------

MIXED = spec.load("mixed")
RULE = "gpuquota-node-a-gpu-0"


@pytest.fixture
def folder() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fence-", dir="/tmp"))  # short: unix socket paths
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _ours(api: ApiServer) -> tuple[dict[str, Any] | None, list[str], str | None]:
    """(our DeviceTaintRule, the Node's taint keys, our condition's status)."""
    obj = api.get("nodes", "node-a") or {}
    taints = [t["key"] for t in (obj.get("spec") or {}).get("taints") or []]
    cond = {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions") or []}
    return api.get("devicetaintrules", RULE), taints, cond.get("GPUUnhealthy")


def test_a_restarted_exporter_keeps_the_fence_of_a_gpu_that_waits_for_a_reboot(
    folder: Path,
) -> None:
    """Fails on 6c36c52: the restarted exporter saw a healthy GPU (the XID was gone with the
    old process) and deleted the DeviceTaintRule, the taint and the condition."""
    socket_path = folder / "kubelet.sock"
    with (
        SimNode.create(folder / "nvml.state", "mixed") as sim,
        ApiServer(bookmark_interval=0.2) as api,
    ):
        api.apply("ADDED", {"kind": "Node", "apiVersion": "v1",
                            "metadata": {"name": "node-a", "uid": "uid-node-a"}, "spec": {},
                            "status": {"conditions": [{"type": "Ready", "status": "True"}]}})  # fmt: skip
        for obj in resource_slices(MIXED, "node-a"):
            api.apply("ADDED", obj)
        # both writers under deploy/'s admission policies, as the exporter's pod-bound token
        api.admit([_policy("device-plugin/node-admission-policy.yaml"),
                   _policy("dra/dra-admission-policy.yaml")],
                  {"username": "system:serviceaccount:gpuquota:gpu-exporter",
                   "extra": {"authentication.kubernetes.io/node-name": ["node-a"]}})  # fmt: skip
        args = ("--dra-device-taints", "--node-taint", "--node-condition", "--node-name=node-a",
                "--health-quiet-period=1s", f"--kubeconfig={api.write_kubeconfig(folder / 'kc')}")  # fmt: skip
        first = Exporter(sim, socket_path, *args)
        try:
            sim.inject_xid(0, 79)  # fell off the bus: reboot the node
            wait_for(lambda: _ours(api)[0] is not None and _ours(api)[2] == "True", timeout=30)
            first_log = first.output()  # the next exporter writes the same log file
        finally:
            first.stop()
        rule = api.get("devicetaintrules", RULE)
        assert rule is not None
        uid, added = rule["metadata"]["uid"], rule["spec"]["taint"]["timeAdded"]
        deletes = api.requests.get("DELETE devicetaintrules", 0)

        second = Exporter(sim, socket_path, *args)
        try:
            # its first reconcile: the rule is updated (held as restored), not deleted
            wait_for(lambda: _reasons(api) != "xid_79", timeout=30, what="the first reconcile")
            assert _reasons(api) == "fence_restored", "the restarted exporter un-fenced the GPU"
            rule = api.get("devicetaintrules", RULE)
            assert rule is not None
            assert (rule["metadata"]["uid"], rule["spec"]["taint"]["timeAdded"]) == (uid, added)
            assert api.requests.get("DELETE devicetaintrules", 0) == deletes
            wait_for(lambda: "fence_restored" in _message(api), timeout=30, what="the condition")
            assert _ours(api)[1:] == (["gpuquota.io/gpu-unhealthy"], "True")
            assert "holding 1 fence(s) set before this start" in second.output()
            # NVML's persistent state, set by another process, is read by this one
            sim.set(0, recovery_action=2)
            wait_for(lambda: _reasons(api) == "fence_restored,recovery_reboot", timeout=30)
            sim.set(0, recovery_action=0)  # NVML clears, but the node has not rebooted: held
            wait_for(lambda: _reasons(api) == "fence_restored", timeout=30)
            assert _ours(api)[1:] == (["gpuquota.io/gpu-unhealthy"], "True")
            assert "deleted: the device is healthy again" not in second.output()
            assert "cannot update" not in first_log + second.output()
        finally:
            second.stop()


def _policy(path: str) -> dict[str, Any]:
    docs = yaml.safe_load_all((DEPLOY / "components" / path).read_text())
    return next(d for d in docs if d and d["kind"] == "ValidatingAdmissionPolicy")


def _message(api: ApiServer) -> str:
    """Our condition's message (it names each fenced GPU's reasons)."""
    conds = ((api.get("nodes", "node-a") or {}).get("status") or {}).get("conditions") or []
    return next((c["message"] for c in conds if c["type"] == "GPUUnhealthy"), "")


def _reasons(api: ApiServer) -> str | None:
    rule = api.get("devicetaintrules", RULE)
    return None if rule is None else rule["metadata"]["annotations"]["gpuquota.io/reasons"]
