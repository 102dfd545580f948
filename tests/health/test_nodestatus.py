"""The node-level verdict and taint bookkeeping (pure parts of the optional node updater)."""

from __future__ import annotations

from pathlib import Path

from gpuquota.exporter.health.config import parse_config
from gpuquota.exporter.health.engine import HealthTracker
from gpuquota.exporter.nodestatus.status import (
    CONDITION_TYPE,
    TAINT_KEY,
    taints_with,
    wanted_status,
)
from gpuquota.exporter.nodestatus.updater import NodeStatusUpdater
from gpuquota.exporter.wiring import core_api
from gpuquota.sim.apiserver import ApiServer
from gpuquota.sim.harness import poll
from tests.health.factory import gpus, node

OTHER = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
OURS = {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}


def test_wanted_status() -> None:
    t = HealthTracker(parse_config(None))
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
        core = core_api(api.write_kubeconfig(tmp_path / "kubeconfig"))
        updater = NodeStatusUpdater(core, "node-a", taint=True, condition=True, max_backoff_s=0.2)
        updater.start()
        try:
            t = HealthTracker(parse_config(None, quiet_period_s=10))
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
