"""The health endpoint: ``/health`` and ``/api/v1/health`` answer the board's verdict as JSON.

One of the verdict's publishers, beside the metrics (exporter/expose/), the device plugin, node
status and DeviceTaintRules: it reads the ``VerdictBoard`` and renders it with view.py.
exporter/app.py adds its route to the HTTP server.
"""

from __future__ import annotations

import json

from gpuquota.exporter.health.board import VerdictBoard
from gpuquota.exporter.health.view import node_json

Response = tuple[int, str, bytes]


class HealthRoute:
    def __init__(self, board: VerdictBoard, node_name: str) -> None:
        self.board = board
        # the JSON's "node": the Kubernetes node it speaks for (the one it taints), where known
        self.node_name = node_name

    def json_route(self) -> Response:
        verdict = self.board.verdict()
        if verdict is None:
            return (
                503,
                "text/plain; charset=utf-8",
                b"no health verdict yet (waiting for the first collection)\n",
            )
        body = json.dumps(node_json(verdict, self.node_name), indent=1).encode()
        return 200, "application/json", body + b"\n"
