"""Optional (off by default): show unhealthy GPUs on the Node object itself.

With ``--node-condition`` the node gets a condition ``GPUUnhealthy`` (status "True" while any
GPU or MIG instance is unhealthy, "False" once all recovered, with the devices and reasons in
the message); with ``--node-taint`` it gets the taint ``gpuquota.io/gpu-unhealthy=true:NoSchedule``
while any device is unhealthy, removed on recovery. Both go through the official kubernetes
client on a thread of their own, retried with backoff, so a slow or absent API server never
delays health checking. Only the latest wanted state is applied (changes coalesce). What to
apply is decided by the pure exporter/nodestatus/status.py.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from gpuquota.exporter.health.verdict import NodeHealth
from gpuquota.exporter.listener_thread import ListenerThread
from gpuquota.exporter.nodestatus.status import CONDITION_TYPE, Wanted, taints_with, wanted_status

log = logging.getLogger(__name__)


class NodeStatusUpdater(ListenerThread):
    """A health listener that patches the Node through a kubernetes ``CoreV1Api``."""

    def __init__(
        self,
        core_api: Any,
        node_name: str,
        taint: bool,
        condition: bool,
        max_backoff_s: float = 30.0,
    ):
        self.api = core_api
        self.node_name = node_name
        self.taint = taint
        self.condition = condition
        self.max_backoff_s = max_backoff_s
        super().__init__("node-status")
        self._wanted: Wanted | None = None
        self._applied: Wanted | None = None

    def __call__(self, before: NodeHealth, after: NodeHealth) -> None:
        wanted = wanted_status(after)
        with self._cond:
            if wanted != self._wanted:
                self._wanted = wanted
                self._cond.notify_all()

    def _run(self) -> None:
        backoff = 0.5
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stopping or self._wanted != self._applied)
                if self._stopping:
                    return
                wanted = self._wanted
            if wanted is None:
                continue
            try:
                self.apply(wanted)
            except Exception as exc:  # the API server is down or refuses: try again later
                log.warning(
                    "cannot update node %s (retrying in %.1fs): %s", self.node_name, backoff, exc
                )
                with self._cond:
                    self._cond.wait_for(lambda: self._stopping, backoff)
                backoff = min(self.max_backoff_s, backoff * 2)
                continue
            backoff = 0.5
            with self._cond:
                self._applied = wanted

    def apply(self, wanted: Wanted) -> None:
        if self.taint:
            node = self.api.read_node(self.node_name)
            existing = [
                {
                    k: v
                    for k, v in (("key", t.key), ("value", t.value), ("effect", t.effect))
                    if v is not None
                }
                for t in (node.spec.taints or [])
            ]
            taints = taints_with(existing, wanted.unhealthy)
            if taints is not None:
                self.api.patch_node(self.node_name, {"spec": {"taints": taints}})
        if self.condition:
            now = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
            condition = {
                "type": CONDITION_TYPE,
                "status": "True" if wanted.unhealthy else "False",
                "reason": wanted.reason,
                "message": wanted.message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
            self.api.patch_node_status(self.node_name, {"status": {"conditions": [condition]}})
