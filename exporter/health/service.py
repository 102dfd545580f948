"""Publishes the health checker's verdict: the JSON endpoint and the verdict for /metrics.

``HealthService.attach`` feeds the checker from the collector and the XID watcher and gives
the HTTP server the JSON routes and the verdict source it renders beside each snapshot.
Building it from flags, and the device plugin and node status that also read the verdict,
is exporter/wiring.py's job.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol

from gpuquota.exporter.health.checker import HealthChecker, XidLike
from gpuquota.exporter.health.verdict import NodeHealth
from gpuquota.exporter.health.view import HEALTH_ROUTES, node_json
from gpuquota.exporter.snapshot import NodeSnapshot

Response = tuple[int, str, bytes]


class Subscribable(Protocol):
    def subscribe(self, callback: Callable[[NodeSnapshot], None]) -> None: ...


class XidSource(Protocol):
    def add_listener(self, callback: Callable[[Any], None]) -> None: ...


class Routes(Protocol):
    def add_route(self, path: str, route: Callable[[], Response]) -> None: ...
    def set_verdict_source(self, source: Callable[[], NodeHealth | None]) -> None: ...


class HealthService:
    def __init__(self, checker: HealthChecker, hostname: str) -> None:
        self.checker = checker
        self.hostname = hostname

    def attach(
        self, collector: Subscribable, xid_watcher: XidSource | None, server: Routes | None
    ) -> None:
        """Listen to the collector and the XID thread; add the JSON routes and the verdict
        source to the HTTP server."""
        collector.subscribe(self.checker.on_snapshot)
        if xid_watcher is not None:
            xid_watcher.add_listener(self._on_xid)
        if server is not None:
            for path in HEALTH_ROUTES:
                server.add_route(path, self.json_route)
            server.set_verdict_source(self.verdict)

    def verdict(self) -> NodeHealth | None:
        """The verdict of this moment, rendered beside the snapshot (None before the first)."""
        if not self.checker.board.ready:
            return None
        return self.checker.current()

    def _on_xid(self, event: XidLike) -> None:
        self.checker.on_xid(event)

    def json_route(self) -> Response:
        verdict = self.verdict()
        if verdict is None:
            return (
                503,
                "text/plain; charset=utf-8",
                b"no health verdict yet (waiting for the first collection)\n",
            )
        body = json.dumps(node_json(verdict, self.hostname), indent=1).encode()
        return 200, "application/json", body + b"\n"

    def start(self) -> None:
        self.checker.start()

    def stop(self) -> None:
        self.checker.stop()
