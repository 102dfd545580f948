"""The health verdict as DeviceTaintRules: DRA's way for an external monitor to fence devices.

On a node whose GPUs a DRA driver hands out, the device plugin's health stream does not exist;
instead a DeviceTaintRule (resource.k8s.io, cluster-scoped) taints the devices it selects, and
the scheduler keeps claims that do not tolerate the taint off them (``NoSchedule``), or also
evicts the pods using them (``NoExecute``, only when configured). For every UNHEALTHY device
(the same verdict the metrics, /health and the device plugin show) whose DRA device the node's
ResourceSlices list, the exporter keeps one rule selecting exactly that device
(``driver``/``pool``/``device``); a MIG-enabled GPU's verdict covers its MIG devices. The rule
goes away when the device recovers.

Ownership: every rule carries the labels ``app.kubernetes.io/managed-by=gpuquota-exporter``
and ``gpuquota.io/node=<node>``, and the exporter only ever lists, changes and deletes rules
with both labels: a rule someone else made, even one that happens to have our name, is never
touched. Rules left over from an earlier run are read back and held (below); one whose
device is not unhealthy once the checker released it is deleted at the next reconcile.

Fences survive restarts: at start the publisher lists its own rules and hands them (device
UUID, action, reasons from the annotations; time from ``spec.taint.timeAdded``) to the health
checker before it acts on any verdict, so a restarted exporter never deletes the rule of a GPU
that still waits for its reboot (exporter/health/engine.py says when such a fence is released).

The API version is the newest one the cluster serves DeviceTaintRules in (``v1`` from
Kubernetes 1.37, else ``v1beta2`` as 1.36 serves, else ``v1alpha3``), found through discovery
and found again after a 404. An update is a PUT of the rule as listed (its
``resourceVersion``, the server's ``timeAdded`` and status kept) with only our spec and
annotations changed; a 409 (changed meanwhile) lists again and retries at once, a few times.
:func:`wanted_rules` (exporter/dra/taintrules.py) is pure; :class:`DeviceTaintPublisher` here is the I/O, on its own thread,
coalescing changes and retrying with jittered back-off (one log line per failure, metrics
``gpuquota_exporter_api_write_*{writer="dra-taints"}``), so a slow API server never delays
health. It calls the API only when the wanted rules change, and while there are rules, once
a minute to repair them.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from typing import Any

from gpuquota.exporter.dra.taintrules import (
    EFFECTS,
    GROUP,
    MANAGED_BY,
    MANAGER,
    NODE_LABEL,
    REASONS_ANNOTATION,
    VERSIONS,
    Obj,
    fences_of,
    same_rule,
    wanted_rules,
)
from gpuquota.exporter.enrich.slices import SliceIndex
from gpuquota.exporter.health.engine import Fence
from gpuquota.exporter.health.verdict import NodeHealth
from gpuquota.exporter.listener_thread import ListenerThread

log = logging.getLogger(__name__)

CONFLICT_RETRIES = 5  # a rule changed between our list and our update: list again this often


class DeviceTaintPublisher(ListenerThread):
    """A health listener keeping this node's DeviceTaintRules in step with the verdict.

    ``kube`` is a gpuquota.kube.client.Kube (raw calls, gpuquota/kube/rest.py in the agent).
    """

    def __init__(
        self,
        kube: Any,
        index: SliceIndex,
        node_name: str,
        effect: str = "NoSchedule",
        resync_s: float = 60.0,
        max_backoff_s: float = 30.0,
        on_fences: Callable[[list[Fence]], None] | None = None,
    ) -> None:
        if effect not in EFFECTS:
            raise ValueError(f"taint effect must be one of {', '.join(EFFECTS)}, not {effect!r}")
        self.kube = kube
        self.index = index
        self.node_name = node_name
        self.effect = effect
        self.resync_s = resync_s
        self.on_fences = on_fences  # the health checker's restore
        self.version: str | None = None
        self.published = 0  # rules in place after the last successful reconcile
        super().__init__("dra-taints", join_timeout=10, max_backoff_s=max_backoff_s)
        self._health: NodeHealth | None = None
        self._dirty = False
        self._foreign_logged: set[str] = set()

    @property
    def errors_total(self) -> int:
        """Failed attempts (gpuquota_exporter_dra_taint_errors_total)."""
        return self.failures_total

    # -- life cycle and the health listener

    def __call__(self, before: NodeHealth, after: NodeHealth) -> None:
        with self._cond:
            self._health = after
            self._dirty = True
            self._cond.notify_all()

    def _run(self) -> None:
        if not self._read_back():
            return
        applied: dict[str, Obj] | None = None  # what the last successful reconcile made
        last = 0.0
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stopping or self._dirty, self.resync_s)
                if self._stopping:
                    return
                health, self._dirty = self._health, False
            if health is None:
                continue  # no verdict yet: nothing to decide from
            if not self.index.synced:  # slices not listed yet: decide once they are
                with self._cond:
                    self._dirty = True
                    self._cond.wait_for(lambda: self._stopping, 0.2)
                continue
            wanted = wanted_rules(health, self.index.devices(), self.node_name, self.effect)
            # unchanged: no API call, except a periodic check that our rules are still there
            # (someone may have deleted one); with nothing to publish, no call at all
            due = time.monotonic() - last >= self.resync_s
            if wanted == applied and not (due and wanted):
                continue
            try:
                self._reconcile_retrying(wanted)
            except Exception as exc:  # the API server is down or refuses: again later
                delay = self._failed("cannot update DeviceTaintRules", exc)
                with self._cond:
                    self._dirty = True
                self._pause(delay)
                continue
            applied, last = wanted, time.monotonic()
            self.published = len(wanted)
            self._succeeded()

    def _read_back(self) -> bool:
        """Our rules as the last run left them, handed to the checker; False when stopped."""
        while not self._stopping:
            try:
                fences = fences_of(list(self._mine().values()))
            except Exception as exc:
                self._pause(self._failed("cannot list DeviceTaintRules", exc))
                continue
            if self.on_fences is not None:
                self.on_fences(fences)
            return True
        return False

    def _reconcile_retrying(self, wanted: dict[str, Obj]) -> None:
        from gpuquota.kube.client import ApiStatusError

        for attempt in range(CONFLICT_RETRIES):
            try:
                self.reconcile(wanted)
                return
            except ApiStatusError as exc:
                if exc.status != 409 or attempt == CONFLICT_RETRIES - 1:
                    raise

    # -- the API

    def _discover(self) -> str:
        group = self.kube.call("GET", f"/apis/{GROUP}")
        served = {v.get("version") for v in group.get("versions") or [] if isinstance(v, dict)}
        for version in VERSIONS:
            if version not in served:
                continue
            resources = self.kube.call("GET", f"/apis/{GROUP}/{version}")
            if any(r.get("name") == "devicetaintrules" for r in resources.get("resources") or []):
                log.info("publishing device health as %s/%s DeviceTaintRules", GROUP, version)
                return version
        raise RuntimeError(
            f"the API server serves no DeviceTaintRules in {GROUP} ({', '.join(VERSIONS)}); "
            "is the DRADeviceTaints feature gate on?"
        )

    def _path(self, name: str = "") -> str:
        assert self.version is not None
        base = f"/apis/{GROUP}/{self.version}/devicetaintrules"
        return f"{base}/{name}" if name else base

    def _mine(self) -> dict[str, Obj]:
        """This node's own rules, by name (discovering the version first)."""
        from gpuquota.kube.client import ApiStatusError

        if self.version is None:
            self.version = self._discover()
        selector = f"{MANAGED_BY}={MANAGER},{NODE_LABEL}={self.node_name}"
        try:
            listed = self.kube.call("GET", self._path(), [("labelSelector", selector)])
        except ApiStatusError as exc:
            if exc.status == 404:
                self.version = None  # the cluster changed versions: discover again
            raise
        return {
            o["metadata"]["name"]: o
            for o in listed.get("items") or []
            if (o.get("metadata") or {}).get("labels", {}).get(MANAGED_BY) == MANAGER
            and o["metadata"]["labels"].get(NODE_LABEL) == self.node_name
        }

    def reconcile(self, wanted: dict[str, Obj]) -> None:
        """Make this node's own rules exactly ``wanted`` (raises on API errors)."""
        from gpuquota.kube.client import ApiStatusError

        mine = self._mine()
        api_version = f"{GROUP}/{self.version}"
        for name in mine:
            if name not in wanted:
                self.kube.call("DELETE", self._path(name))
                log.info("DeviceTaintRule %s deleted: the device is healthy again", name)
        for name, want in wanted.items():
            body = {"apiVersion": api_version, **want}
            have = mine.get(name)
            if have is None:
                try:
                    self.kube.call("POST", self._path(), body=body)
                except ApiStatusError as exc:
                    if exc.status != 409:
                        raise
                    if name not in self._foreign_logged:  # someone else's rule: left alone
                        self._foreign_logged.add(name)
                        log.warning(
                            "DeviceTaintRule %s exists but is not ours (no %s=%s label): "
                            "leaving it alone",
                            name,
                            MANAGED_BY,
                            MANAGER,
                        )
                    continue
                sel = want["spec"]["deviceSelector"]
                log.info(
                    "DeviceTaintRule %s created: %s taint on %s/%s/%s (%s)",
                    name,
                    self.effect,
                    sel["driver"],
                    sel["pool"],
                    sel["device"],
                    want["metadata"]["annotations"][REASONS_ANNOTATION],
                )
            elif not same_rule(have, want):
                # the rule as listed (resourceVersion: a 409 if it changed since; status and
                # the server's fields kept), with our labels, annotations and spec: the rule
                # is ours, and the admission policy allows exactly these
                body = copy.deepcopy(have)
                body["apiVersion"], body["kind"] = api_version, want["kind"]
                body["metadata"]["labels"] = want["metadata"]["labels"]
                body["metadata"]["annotations"] = want["metadata"]["annotations"]
                body["spec"] = copy.deepcopy(want["spec"])
                added = (have.get("spec", {}).get("taint") or {}).get("timeAdded")
                if added:  # the taint is not new: NoExecute toleration times count from it
                    body["spec"]["taint"]["timeAdded"] = added
                self.kube.call("PUT", self._path(name), body=body)
