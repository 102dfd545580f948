"""The node-level verdict and taint bookkeeping, and the node updater against the API server
stand-in: only our taint and condition change, other controllers' taints stay byte for byte,
a concurrent change is a 409 that is read again, and failures are one log line each."""

from __future__ import annotations

import copy
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuquota.exporter.app import kube_api
from gpuquota.exporter.expose.metrics import METRICS
from gpuquota.exporter.health.config import parse_config
from gpuquota.exporter.health.engine import DeviceTracker, Fence
from gpuquota.exporter.health.publishing import PublisherStatus
from gpuquota.exporter.health.verdict import Action
from gpuquota.exporter.nodestatus.status import (
    CONDITION_TYPE,
    TAINT_KEY,
    condition_for,
    taints_with,
    wanted_status,
)
from gpuquota.exporter.nodestatus.updater import NodeStatusUpdater, fences_of
from gpuquota.kube.client import Kube
from gpuquota.sim.apiserver import ApiServer
from gpuquota.sim.harness import poll, wait_for
from gpuquota.sim.nvml.control import SimNode
from tests.deploy.manifests import DEPLOY
from tests.health.factory import gpus, node
from tests.kubelet.exporter_proc import Exporter

OTHER = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
OURS = {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}


def test_wanted_status() -> None:
    t = DeviceTracker(parse_config(None))
    h = t.observe_snapshot(node(*gpus(3)), now=0)
    assert not wanted_status(h).unhealthy
    assert wanted_status(h).reason == "AllGPUsHealthy"
    t.observe_xid("GPU-00000001", 13, at=1)  # degraded only: no taint
    assert not wanted_status(t.health).unhealthy
    h = t.observe_xid("GPU-00000002", 79, at=2)
    w = wanted_status(h)
    assert w.unhealthy and w.reason == "GPUUnhealthy"
    assert (
        "GPU-00000002 (xid_79; action reboot_node)" in w.message and "GPU-00000001" not in w.message
    )


def test_taints() -> None:
    assert taints_with([OTHER], True) == [OTHER, OURS]
    assert taints_with([OTHER, OURS], True) is None
    assert taints_with([OTHER, OURS], False) == [OTHER]
    assert taints_with([OTHER], False) is None
    assert taints_with([{**OURS, "effect": "NoExecute"}], True) == [OURS]


# -- against the kube-apiserver stand-in, through the official kubernetes client ---------------


def test_taint_and_condition_follow_health(tmp_path: Path) -> None:
    with ApiServer() as api:
        api.apply("ADDED", {"kind": "Node", "apiVersion": "v1", "metadata": {"name": "node-a", "uid": "uid-node-a"},
                            "spec": {"taints": [OTHER]}, "status": {"conditions": [
                                {"type": "Ready", "status": "True"}]}})  # fmt: skip
        kube = kube_api(api.write_kubeconfig(tmp_path / "kubeconfig"))
        updater = NodeStatusUpdater(kube, "node-a", taint=True, condition=True, max_backoff_s=0.2)
        updater.start()
        try:
            t = DeviceTracker(parse_config(None, quiet_period_s=10))
            healthy = t.observe_snapshot(node(*gpus(2)), now=0)
            sick = t.observe_xid("GPU-00000001", 95, at=1)
            updater(healthy, sick)

            def state() -> tuple[list[str], dict[str, str]]:
                obj = api.get("nodes", "node-a") or {}
                taints = [t["key"] for t in obj.get("spec", {}).get("taints") or []]
                conds = {
                    c["type"]: c["status"] for c in obj.get("status", {}).get("conditions", [])
                }
                return taints, conds

            assert poll(
                lambda: (
                    state() == (["dedicated", TAINT_KEY], {"Ready": "True", CONDITION_TYPE: "True"})
                )
            )
            cond = next(c for c in (api.get("nodes", "node-a") or {})["status"]["conditions"]
                        if c["type"] == CONDITION_TYPE)  # fmt: skip
            assert "GPU-00000001 (xid_95; action reset_gpu)" in cond["message"]

            # The API server goes away for a while; recovery is applied once it is back.
            api.refuse_for(0.5)
            updater(sick, t.expire(100))
            assert poll(
                lambda: state() == (["dedicated"], {"Ready": "True", CONDITION_TYPE: "False"})
            )
        finally:
            updater.stop()


UNREACHABLE = {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute",
               "timeAdded": "2026-11-20T10:00:00Z"}  # fmt: skip


def test_other_taints_are_kept_as_they_are_timeadded_included() -> None:
    existing = [copy.deepcopy(UNREACHABLE), copy.deepcopy(OTHER)]
    tainted = taints_with(existing, True)
    assert tainted == [UNREACHABLE, OTHER, OURS]
    assert tainted is not None and tainted[0] is existing[0]  # the very object read
    assert taints_with([*tainted], False) == [UNREACHABLE, OTHER]
    assert taints_with([UNREACHABLE], True, "NoExecute") == [
        UNREACHABLE,
        {**OURS, "effect": "NoExecute"},
    ]
    with pytest.raises(ValueError, match="taint effect must be one of"):
        taints_with([], True, "PreferNoSchedule")


def test_the_condition_moves_its_transition_time_only_when_its_status_changes() -> None:
    t = DeviceTracker(parse_config(None, quiet_period_s=10))
    healthy = wanted_status(t.observe_snapshot(node(*gpus(2)), now=0))
    sick = wanted_status(t.observe_xid("GPU-00000001", 79, at=1))
    first = condition_for(sick, [], "2026-11-25T10:00:00Z")
    again = condition_for(sick, [first], "2026-11-25T10:05:00Z")
    assert (again["lastTransitionTime"], again["lastHeartbeatTime"]) == (
        "2026-11-25T10:00:00Z", "2026-11-25T10:05:00Z")  # fmt: skip
    healed = condition_for(healthy, [again], "2026-11-25T10:09:00Z")
    assert (healed["status"], healed["lastTransitionTime"]) == ("False", "2026-11-25T10:09:00Z")


def test_the_fence_is_read_back_from_our_condition() -> None:
    t = DeviceTracker(parse_config(None, quiet_period_s=10))
    t.observe_snapshot(node(*gpus(3)), now=0)
    t.observe_xid("GPU-00000001", 79, at=1795600800.0)  # 2026-11-25T10:00:00Z
    wanted = wanted_status(t.observe_xid("GPU-00000002", 48, at=1795600800.0))
    cond = condition_for(wanted, [], "2026-11-25T10:00:00Z")
    obj = {"spec": {"taints": [OURS]}, "status": {"conditions": [cond]}}
    assert fences_of(obj) == [
        Fence("GPU-00000001", Action.REBOOT_NODE, "xid_79", 1795600800.0),
        Fence("GPU-00000002", Action.RESET_GPU, "xid_48", 1795600800.0),
    ]
    healthy = {"status": {"conditions": [{**cond, "status": "False"}]}}
    assert fences_of(healthy) == [] and fences_of({}) == []


def test_each_fence_is_read_back_with_its_own_time() -> None:
    """The condition's lastTransitionTime is the node's first fence; a GPU fenced an hour
    later reads back with its own time (the message says it), and a message of an agent
    that did not write it falls back to the node's time."""
    t = DeviceTracker(parse_config(None, quiet_period_s=100_000))
    t.observe_snapshot(node(*gpus(3)), now=0)
    first = condition_for(
        wanted_status(t.observe_xid("GPU-00000001", 79, at=1795600800.0)), [],
        "2026-11-25T10:00:00Z",
    )  # fmt: skip
    wanted = wanted_status(t.observe_xid("GPU-00000002", 48, at=1795604400.0))
    assert "GPU-00000002 (xid_48; action reset_gpu) since 2026-11-25T11:00:00Z" in wanted.message
    cond = condition_for(wanted, [first], "2026-11-25T11:00:00Z")
    assert cond["lastTransitionTime"] == "2026-11-25T10:00:00Z"
    obj = {"spec": {"taints": [OURS]}, "status": {"conditions": [cond]}}
    assert [(f.uuid, f.since) for f in fences_of(obj)] == [
        ("GPU-00000001", 1795600800.0),
        ("GPU-00000002", 1795604400.0),
    ]
    old = {**cond, "message": "2 unhealthy: GPU-00000001 (xid_79; action reboot_node); "
                              "GPU-00000002 (xid_48; action reset_gpu)"}  # fmt: skip
    assert [f.since for f in fences_of({"status": {"conditions": [old]}})] == [1795600800.0] * 2


def _node_obj(taints: list[dict[str, Any]]) -> dict[str, Any]:
    return {"kind": "Node", "apiVersion": "v1", "metadata": {"name": "node-a", "uid": "uid-node-a"},
            "spec": {"taints": taints}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}  # fmt: skip


def _sick_and_healed() -> tuple[Any, Any, Any]:
    t = DeviceTracker(parse_config(None, quiet_period_s=10))
    healthy = t.observe_snapshot(node(*gpus(2)), now=0)
    return healthy, t.observe_xid("GPU-00000001", 79, at=1), t.expire(100)


def test_fencing_keeps_the_node_lifecycle_controllers_taint_byte_for_byte(tmp_path: Path) -> None:
    """Fails on 6c36c52: it rebuilt other taints from key/value/effect, dropping timeAdded."""
    with ApiServer() as api:
        api.apply("ADDED", _node_obj([OTHER]))
        lifecycle = api.taint_node("node-a", "node.kubernetes.io/unreachable")  # NotReady node
        theirs = lifecycle["spec"]["taints"]
        assert "timeAdded" in theirs[-1]
        kube = kube_api(api.write_kubeconfig(tmp_path / "kubeconfig"))
        updater = NodeStatusUpdater(kube, "node-a", taint=True, condition=False)
        _, sick, healed = _sick_and_healed()
        updater.apply(wanted_status(sick))
        assert (api.get("nodes", "node-a") or {})["spec"]["taints"] == [*theirs, OURS]
        updater.apply(wanted_status(healed))
        assert (api.get("nodes", "node-a") or {})["spec"]["taints"] == theirs


class _Racing(Kube):
    """The real client; before its first Node PATCH another controller changes the Node."""

    def __init__(self, inner: Kube, api: ApiServer) -> None:
        super().__init__(inner.api)
        self.sim, self.patches = api, 0

    def call(self, method: str, path: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if method == "PATCH" and not path.endswith("/status"):
            self.patches += 1
            if self.patches == 1:
                self.sim.taint_node("node-a", "node.kubernetes.io/not-ready")
        return super().call(method, path, *args, **kwargs)


def test_a_node_changed_between_read_and_write_is_read_again_not_overwritten(
    tmp_path: Path,
) -> None:
    """Fails on 6c36c52: no resourceVersion in its patch, so the taint added meanwhile was lost."""
    with ApiServer() as api:
        api.apply("ADDED", _node_obj([OTHER]))
        kube = _Racing(kube_api(api.write_kubeconfig(tmp_path / "kubeconfig")), api)
        updater = NodeStatusUpdater(kube, "node-a", taint=True, condition=False)
        updater.apply(wanted_status(_sick_and_healed()[1]))
        keys = [t["key"] for t in (api.get("nodes", "node-a") or {})["spec"]["taints"]]
        assert keys == ["dedicated", "node.kubernetes.io/not-ready", TAINT_KEY]
        assert kube.patches == 2  # one 409, one write


def test_a_refused_write_is_one_log_line_a_metric_and_back_off(tmp_path: Path, caplog) -> None:
    """Fails on 6c36c52: each failure logged the client's multi-line HTTP dump, no metric."""
    caplog.set_level(logging.WARNING)
    with ApiServer() as api:
        api.apply("ADDED", _node_obj([OTHER]))
        kube = kube_api(api.write_kubeconfig(tmp_path / "kubeconfig"))
        read_back: list[list[Fence]] = []
        updater = NodeStatusUpdater(
            kube,
            "node-a",
            taint=True,
            condition=True,
            max_backoff_s=0.2,
            on_fences=read_back.append,
        )
        healthy, sick, _ = _sick_and_healed()
        updater.start()
        try:
            assert poll(lambda: read_back == [[]])  # its fence read back first: none
            api.forbid("nodes")
            updater(healthy, sick)
            assert poll(lambda: updater.consecutive_failures >= 3)
            lines = [
                r.getMessage() for r in caplog.records if "cannot update node" in r.getMessage()
            ]
            assert len(lines) >= 3 and all("\n" not in line for line in lines), lines
            assert "403" in lines[0]
            status = PublisherStatus(api_writers={updater.name: updater.status()})
            samples = {m.name: list(m.read_publishers(status)) for m in METRICS
                       if m.name.startswith("gpuquota_exporter_api_write_") and m.read_publishers}  # fmt: skip
            failures = samples["gpuquota_exporter_api_write_consecutive_failures"]
            assert failures[0][0] == ("node-status",) and failures[0][1] >= 3
            assert samples["gpuquota_exporter_api_write_last_success_timestamp_seconds"] == []
            api.forbid("nodes", False)
            assert poll(
                lambda: updater.consecutive_failures == 0 and updater.last_success is not None
            )
            assert [t["key"] for t in (api.get("nodes", "node-a") or {})["spec"]["taints"]] == [
                "dedicated", TAINT_KEY]  # fmt: skip
        finally:
            updater.stop()


def test_gpu_exporter_fences_and_unfences_a_node_another_controller_tainted(tmp_path: Path) -> None:
    """Finding 5 end to end: gpu-exporter (its own process) under the device-plugin overlay's
    admission policy, enforced by the stand-in with the real server's CEL semantics, on a Node
    the node-lifecycle controller tainted unreachable (NoExecute, timeAdded). XID 79 taints the
    node, recovery removes the taint; the other taint stays byte for byte and no write is
    refused. On 6c36c52 every write was refused (timeAdded dropped) and the taint stayed."""
    docs = yaml.safe_load_all(
        (DEPLOY / "components/device-plugin/node-admission-policy.yaml").read_text()
    )
    policy = next(d for d in docs if d and d["kind"] == "ValidatingAdmissionPolicy")
    user = {"username": "system:serviceaccount:gpuquota:gpu-exporter",
            "extra": {"authentication.kubernetes.io/node-name": ["node-a"]}}  # fmt: skip
    folder = Path(tempfile.mkdtemp(prefix="ns-", dir="/tmp"))
    with SimNode.create(folder / "nvml.state", "h100x8") as sim, ApiServer() as api:
        api.apply("ADDED", _node_obj([OTHER]))
        theirs = api.taint_node("node-a", "node.kubernetes.io/unreachable")["spec"]["taints"]
        api.admit([policy], user)
        exporter = Exporter(sim, folder / "kubelet.sock", "--node-taint", "--node-condition",
                            "--node-name=node-a", "--health-quiet-period=1s",
                            f"--kubeconfig={api.write_kubeconfig(folder / 'kc')}")  # fmt: skip

        def taints() -> list[dict[str, Any]]:
            return list((api.get("nodes", "node-a") or {})["spec"]["taints"])

        try:
            wait_for(lambda: _condition(api) == "False", timeout=30, what="the first condition")
            sim.inject_xid(0, 79)
            wait_for(lambda: taints() == [*theirs, OURS] and _condition(api) == "True", timeout=30)
            wait_for(lambda: taints() == theirs and _condition(api) == "False", timeout=30)
            assert "cannot update node" not in exporter.output()
            # a write the policy refuses is one line naming the policy's message, retried
            api.admit([{**policy, "spec": {**policy["spec"], "variables": [
                {**v, "expression": "['NoExecute']"} if v["name"] == "allowedEffects" else v
                for v in policy["spec"]["variables"]]}}], user)  # fmt: skip
            sim.inject_xid(1, 79)
            wait_for(
                lambda: "cannot update node node-a (failure 2 in a row" in exporter.output(),
                timeout=30,
            )
            line = next(x for x in exporter.output().splitlines() if "cannot update node" in x)
            assert "403 Forbidden" in line and "its own taint gpuquota.io/gpu-unhealthy" in line
            assert taints() == theirs
        finally:
            exporter.stop()
            shutil.rmtree(folder, ignore_errors=True)


def _condition(api: ApiServer) -> str | None:
    conds = ((api.get("nodes", "node-a") or {}).get("status") or {}).get("conditions") or []
    return next((c["status"] for c in conds if c["type"] == CONDITION_TYPE), None)
