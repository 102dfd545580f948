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
:func:`wanted_rules` is pure; :class:`DeviceTaintPublisher` is the I/O, on its own thread,
coalescing changes and retrying with jittered back-off (one log line per failure, metrics
``gpuquota_exporter_api_write_*{writer="dra-taints"}``), so a slow API server never delays
health. It calls the API only when the wanted rules change, and while there are rules, once
a minute to repair them.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any

from gpuquota.exporter.dra.slices import DraDevice, SliceIndex
from gpuquota.exporter.health.engine import Fence
from gpuquota.exporter.health.verdict import NodeHealth, State, parse_action
from gpuquota.exporter.listener_thread import ListenerThread, parse_time
from gpuquota.exporter.nodestatus.status import TAINT_KEY

log = logging.getLogger(__name__)

Obj = dict[str, Any]
GROUP = "resource.k8s.io"
VERSIONS = ("v1", "v1beta2", "v1alpha3")  # newest first
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "gpuquota-exporter"
NODE_LABEL = "gpuquota.io/node"
EFFECTS = ("NoSchedule", "NoExecute")
CONFLICT_RETRIES = 5  # a rule changed between our list and our update: list again this often
UUID_ANNOTATION = "gpuquota.io/device-uuid"
REASONS_ANNOTATION = "gpuquota.io/reasons"
ACTION_ANNOTATION = "gpuquota.io/action"


def fences_of(rules: list[Obj]) -> list[Fence]:
    """Pure: the fences our listed rules stand for (a rule without a readable device UUID or
    action is left out: nothing to hold)."""
    fences = []
    for rule in rules:
        meta = rule.get("metadata") or {}
        notes = meta.get("annotations") or {}
        uuid = notes.get(UUID_ANNOTATION)
        try:
            action = parse_action(str(notes.get(ACTION_ANNOTATION, "")))
        except ValueError:
            continue
        if not uuid:
            continue
        taint = (rule.get("spec") or {}).get("taint") or {}
        since = (
            parse_time(taint.get("timeAdded")) or parse_time(meta.get("creationTimestamp")) or 0.0
        )
        fences.append(Fence(str(uuid), action, str(notes.get(REASONS_ANNOTATION, "")), since))
    return fences


def rule_name(node: str, device: str) -> str:
    """``gpuquota-<node>-<device>``; a DNS subdomain of at most 253 characters."""
    name = f"gpuquota-{node}-{device}".lower()
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{name[:242]}-{digest}"


def owner_labels(node: str) -> dict[str, str]:
    return {MANAGED_BY: MANAGER, NODE_LABEL: node}


def wanted_rules(
    health: NodeHealth, devices: list[DraDevice], node: str, effect: str = "NoSchedule"
) -> dict[str, Obj]:
    """Pure: rule name -> rule body (without apiVersion) for every unhealthy DRA device."""
    if effect not in EFFECTS:
        raise ValueError(f"taint effect must be one of {', '.join(EFFECTS)}, not {effect!r}")
    verdicts = health.by_uuid()
    rules: dict[str, Obj] = {}
    for device in devices:
        verdict = verdicts.get(device.uuid)
        if (verdict is None or verdict.state is not State.UNHEALTHY) and device.parent_uuid:
            verdict = verdicts.get(device.parent_uuid)  # the GPU's verdict covers its MIG
        if verdict is None or verdict.state is not State.UNHEALTHY:
            continue
        codes = sorted({r.code for r in verdict.reasons if r.state is State.UNHEALTHY})
        name = rule_name(node, device.name)
        rules[name] = {
            "kind": "DeviceTaintRule",
            "metadata": {
                "name": name,
                "labels": owner_labels(node),
                "annotations": {
                    UUID_ANNOTATION: device.uuid,
                    REASONS_ANNOTATION: ",".join(codes),
                    ACTION_ANNOTATION: verdict.action.label,
                },
            },
            "spec": {
                "deviceSelector": {
                    "driver": device.driver,
                    "pool": device.pool,
                    "device": device.name,
                },
                "taint": {"key": TAINT_KEY, "value": verdict.action.label, "effect": effect},
            },
        }
    return rules


def _same(have: Obj, want: Obj) -> bool:
    hm, wm = have.get("metadata") or {}, want["metadata"]
    return bool(
        have.get("spec", {}).get("deviceSelector") == want["spec"]["deviceSelector"]
        and {k: v for k, v in (have.get("spec", {}).get("taint") or {}).items() if k != "timeAdded"}
        == want["spec"]["taint"]
        and (hm.get("annotations") or {}) == wm["annotations"]
        and (hm.get("labels") or {}) == wm["labels"]
    )


class DeviceTaintPublisher(ListenerThread):
    """A health listener keeping this node's DeviceTaintRules in step with the verdict.

    ``kube`` is a gpuquota.kube.client.Kube (raw calls through the official client).
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
            elif not _same(have, want):
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
