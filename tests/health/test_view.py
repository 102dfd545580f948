"""The health JSON document renders the same NodeHealth the other channels use."""

from __future__ import annotations

import json

from gpuquota.exporter.health.config import parse_config
from gpuquota.exporter.health.engine import DeviceTracker
from gpuquota.exporter.health.view import node_json
from tests.health.factory import gpu, mig, node


def test_json_document() -> None:
    t = DeviceTracker(parse_config(None, quiet_period_s=60))
    t.observe_snapshot(node(gpu(0, mig_mode_enabled=True), mig(0, 1), gpu(1)), now=1_700_000_000.0)
    h = t.observe_xid("GPU-00000001", 79, at=1_700_000_010.5)
    doc = node_json(h, "node-a")
    json.dumps(doc)  # serialisable as is
    assert doc["node"] == "node-a"
    assert doc["summary"] == {"healthy": 2, "degraded": 0, "unhealthy": 1}
    gpu1 = doc["devices"][2]
    assert gpu1["uuid"] == "GPU-00000001"
    assert (gpu1["state"], gpu1["action"]) == ("unhealthy", "reboot_node")
    assert gpu1["since"] == "2023-11-14T22:13:30.500Z"
    assert gpu1["reasons"][0]["reason"] == "xid_79"
    assert gpu1["reasons"][0]["count"] == 1
    inst = doc["devices"][1]
    assert inst["parent_uuid"] == "GPU-00000000" and inst["mig_profile"] == "1g.10gb"
    assert "parent_uuid" not in doc["devices"][0]
