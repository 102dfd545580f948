"""Optional (off by default): show unhealthy GPUs on the Node object itself.

With ``--node-condition`` the node gets a condition ``GPUUnhealthy`` (status "True" while any
GPU or MIG instance is unhealthy, "False" once all recovered, with the devices, reasons and
actions in the message); with ``--node-taint`` it gets the taint
``gpuquota.io/gpu-unhealthy=true:NoSchedule`` (``--node-taint-effect NoExecute`` to also evict)
while any device is unhealthy, removed on recovery. Both go through the Kubernetes API on a
thread of their own, so a slow or absent API server never delays health checking; only the
latest wanted state is applied (changes coalesce).

The Node is written the way the node admission policy (deploy/components/device-plugin) lets
it be: the taint list is the one just read with only our taint changed, every other taint
handed back byte for byte (``timeAdded`` included), sent as a merge patch that carries the
``metadata.resourceVersion`` it was computed from, so a Node someone else changed in between
is a 409, read again and recomputed, never overwritten. The condition is a strategic merge
patch of ``nodes/status`` by ``type``, so it touches our condition only. A failure is one log
line, retried with jittered back-off (exporter/listener_thread.py), and counted in
``gpuquota_exporter_api_write_*{writer="node-status"}``.

At start it reads its own fence back (our taint, our condition's message) and hands it to the
health checker, so a restarted exporter keeps a GPU fenced that it can no longer see is broken
(exporter/health/engine.py); what to write is decided by the pure exporter/nodestatus/status.py.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Any

from gpuquota.exporter.health.engine import Fence
from gpuquota.exporter.health.verdict import NodeHealth, parse_action
from gpuquota.exporter.listener_thread import ListenerThread, parse_time
from gpuquota.exporter.nodestatus.status import (
    CONDITION_TYPE,
    TAINT_EFFECT,
    TAINT_KEY,
    Wanted,
    condition_for,
    rfc3339,
    taints_with,
    wanted_status,
)
from gpuquota.kube.client import MERGE_PATCH, STRATEGIC_MERGE_PATCH

log = logging.getLogger(__name__)

Obj = dict[str, Any]
CONFLICT_RETRIES = 5  # a Node changed between our read and our write: read again this often
# one device of the condition's message (status.wanted_status writes it); agents before the
# device's own "since" dated every device by the condition's lastTransitionTime
_DEVICE = re.compile(r"(\S+) \(([^;()]*); action (\w+)\)(?: since ([0-9T:.+Z-]+))?")


def fences_of(node: Obj) -> list[Fence]:
    """Pure: the devices our condition says are fenced, while our taint or condition is up."""
    taints = (node.get("spec") or {}).get("taints") or []
    tainted = any(t.get("key") == TAINT_KEY for t in taints if isinstance(t, dict))
    conditions = (node.get("status") or {}).get("conditions") or []
    ours = next((c for c in conditions if c.get("type") == CONDITION_TYPE), None)
    if ours is None or (ours.get("status") != "True" and not tainted):
        return []
    node_since = parse_time(ours.get("lastTransitionTime")) or 0.0
    fences = []
    for uuid, codes, action, stamp in _DEVICE.findall(str(ours.get("message") or "")):
        since = parse_time(stamp) or node_since
        try:
            fences.append(Fence(uuid, parse_action(action), codes, since))
        except ValueError:
            continue  # an action this version does not know: not ours to guess
    return fences


class NodeStatusUpdater(ListenerThread):
    """A health listener that writes our taint and condition on the Node through a
    gpuquota.kube.client.Kube (raw JSON: other taints stay exactly as the server sent them)."""

    def __init__(
        self,
        kube: Any,
        node_name: str,
        taint: bool,
        condition: bool,
        max_backoff_s: float = 30.0,
        effect: str = TAINT_EFFECT,
        on_fences: Callable[[list[Fence]], None] | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.kube = kube
        self.clock = clock  # the condition's heartbeat and transition times
        self.node_name = node_name
        self.taint = taint
        self.condition = condition
        self.effect = effect
        self.on_fences = on_fences  # the health checker's restore
        taints_with([], True, effect)  # a bad effect fails here, not on the first write
        super().__init__("node-status", max_backoff_s=max_backoff_s)
        self._wanted: Wanted | None = None
        self._applied: Wanted | None = None

    @property
    def path(self) -> str:
        return f"/api/v1/nodes/{self.node_name}"

    def __call__(self, before: NodeHealth, after: NodeHealth) -> None:
        wanted = wanted_status(after)
        with self._cond:
            if wanted != self._wanted:
                self._wanted = wanted
                self._cond.notify_all()

    def _run(self) -> None:
        if not self._read_back():
            return
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
                self._pause(self._failed(f"cannot update node {self.node_name}", exc))
                continue
            self._succeeded()
            with self._cond:
                self._applied = wanted

    def _read_back(self) -> bool:
        """Our fence as the last run left it, handed to the checker; False when stopped."""
        while not self._stopping:
            try:
                node = self.kube.call("GET", self.path)
            except Exception as exc:
                self._pause(self._failed(f"cannot read node {self.node_name}", exc))
                continue
            fences = fences_of(node)
            if self.on_fences is not None:
                self.on_fences(fences)
            return True
        return False

    def apply(self, wanted: Wanted) -> None:
        """Writes our taint and condition for ``wanted`` (raises on API errors)."""
        node = self.kube.call("GET", self.path)
        if self.taint:
            from gpuquota.kube.client import ApiStatusError

            for attempt in range(CONFLICT_RETRIES):
                existing = (node.get("spec") or {}).get("taints") or []
                taints = taints_with(existing, wanted.unhealthy, self.effect)
                if taints is None:
                    break
                patch = {
                    "metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
                    "spec": {"taints": taints},
                }
                try:
                    node = self.kube.call("PATCH", self.path, body=patch, content_type=MERGE_PATCH)
                    break
                except ApiStatusError as exc:
                    if exc.status != 409 or attempt == CONFLICT_RETRIES - 1:
                        raise
                    node = self.kube.call("GET", self.path)  # changed meanwhile: recompute
        if self.condition:
            conditions = (node.get("status") or {}).get("conditions") or []
            condition = condition_for(wanted, conditions, rfc3339(self.clock()))
            self.kube.call(
                "PATCH",
                f"{self.path}/status",
                body={"status": {"conditions": [condition]}},
                content_type=STRATEGIC_MERGE_PATCH,
            )
