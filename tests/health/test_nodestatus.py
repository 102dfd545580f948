"""The node-level verdict and taint bookkeeping (pure parts of the optional node updater)."""

from __future__ import annotations

from exporter.health.nodestatus import TAINT_KEY, taints_with, wanted_status
from exporter.health.rules import HealthConfig, HealthTracker
from tests.health.factory import gpus, node

OTHER = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
OURS = {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}


def test_wanted_status() -> None:
    t = HealthTracker(HealthConfig())
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
