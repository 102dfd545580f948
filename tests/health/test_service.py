"""The health service glue: JSON route before and after the first verdict, the scrape-time join."""

from __future__ import annotations

import json
import time

from exporter.cli import build_parser
from exporter.health.service import HealthService
from tests.health.factory import gpus, node


def test_json_route_and_snapshot_view() -> None:
    service = HealthService.from_args(build_parser().parse_args([]), hostname="node-a")
    assert service.plugin_manager is None and service.node_status is None
    status, _, body = service.json_route()
    assert status == 503 and b"no health verdict yet" in body
    snapshot = node(*gpus(2))
    assert service.snapshot_view(snapshot).health is None

    service.start()
    try:
        service.checker.on_snapshot(snapshot)
        deadline = time.monotonic() + 2
        while not service.checker.board.ready and time.monotonic() < deadline:
            time.sleep(0.01)
        status, content_type, body = service.json_route()
        assert (status, content_type) == (200, "application/json")
        doc = json.loads(body)
        assert doc["node"] == "node-a" and len(doc["devices"]) == 2
        joined = service.snapshot_view(snapshot)
        assert joined.health is service.checker.current()
        assert joined.devices == snapshot.devices
    finally:
        service.stop()
