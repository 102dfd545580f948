"""The health service glue: JSON route and the verdict source before and after the first verdict."""

from __future__ import annotations

import json
import time

from gpuquota.exporter.cli import build_parser
from gpuquota.exporter.wiring import HealthWiring
from tests.health.factory import gpus, node


def test_json_route_and_verdict_source() -> None:
    wiring = HealthWiring.from_args(build_parser().parse_args([]), hostname="node-a")
    assert wiring.plugin_manager is None and wiring.node_status is None
    service = wiring.service
    status, _, body = service.json_route()
    assert status == 503 and b"no health verdict yet" in body
    snapshot = node(*gpus(2))
    assert service.verdict() is None

    wiring.start()
    try:
        service.checker.on_snapshot(snapshot)
        deadline = time.monotonic() + 2
        while not service.checker.board.ready and time.monotonic() < deadline:
            time.sleep(0.01)
        status, content_type, body = service.json_route()
        assert (status, content_type) == (200, "application/json")
        doc = json.loads(body)
        assert doc["node"] == "node-a" and len(doc["devices"]) == 2
        verdict = service.verdict()
        assert verdict is service.checker.current()
        assert [d.uuid for d in verdict.devices] == [d.uuid for d in snapshot.devices]
    finally:
        wiring.stop()


def test_the_json_names_the_kubernetes_node_given_by_node_name() -> None:
    """/health's "node" is --node-name (the Node it taints), not the host name."""
    args = build_parser().parse_args(["--node-name", "gpu-node-7"])
    wiring = HealthWiring.from_args(args, hostname="ip-10-0-0-7.internal")
    assert wiring.service.hostname == "gpu-node-7"
    wiring.start()
    try:
        wiring.service.checker.on_snapshot(node(*gpus(1)))
        deadline = time.monotonic() + 5
        while not wiring.service.checker.board.ready and time.monotonic() < deadline:
            time.sleep(0.01)
        _, _, body = wiring.service.json_route()
        assert json.loads(body)["node"] == "gpu-node-7"
    finally:
        wiring.stop()
