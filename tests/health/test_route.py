"""/health: the JSON route and the board's verdict source, before and after the first verdict."""

from __future__ import annotations

import json
import time

from gpuquota.exporter.app import build_health
from gpuquota.exporter.cli import build_parser
from tests.health.factory import gpus, node


def test_json_route_and_verdict_source() -> None:
    health = build_health(build_parser().parse_args([]), hostname="node-a")
    assert health.plugin_manager is None and health.node_status is None
    route, checker = health.route, health.checker
    status, _, body = route.json_route()
    assert status == 503 and b"no health verdict yet" in body
    snapshot = node(*gpus(2))
    assert checker.board.verdict() is None

    checker.start()
    try:
        checker.on_snapshot(snapshot)
        deadline = time.monotonic() + 2
        while not checker.board.ready and time.monotonic() < deadline:
            time.sleep(0.01)
        status, content_type, body = route.json_route()
        assert (status, content_type) == (200, "application/json")
        doc = json.loads(body)
        assert doc["node"] == "node-a" and len(doc["devices"]) == 2
        verdict = checker.board.verdict()
        assert verdict is checker.current()
        assert [d.uuid for d in verdict.devices] == [d.uuid for d in snapshot.devices]
    finally:
        checker.stop()


def test_the_json_names_the_kubernetes_node_given_by_node_name() -> None:
    """/health's "node" is --node-name (the Node it taints), not the host name."""
    args = build_parser().parse_args(["--node-name", "gpu-node-7"])
    health = build_health(args, hostname="ip-10-0-0-7.internal")
    assert health.route.node_name == "gpu-node-7"
    health.checker.start()
    try:
        health.checker.on_snapshot(node(*gpus(1)))
        deadline = time.monotonic() + 5
        while not health.checker.board.ready and time.monotonic() < deadline:
            time.sleep(0.01)
        _, _, body = health.route.json_route()
        assert json.loads(body)["node"] == "gpu-node-7"
    finally:
        health.checker.stop()
