"""A kube-apiserver stand-in: the real kubernetes client talks to it over a real socket.

Serves, over HTTP/1.1 on 127.0.0.1, what the quota controller and its tests use:

* core/v1 pods, nodes, namespaces, resourcequotas, coordination.k8s.io/v1 leases and the
  Dynamic Resource Allocation kinds of resource.k8s.io (ResourceSlices, DeviceClasses,
  ResourceClaims, ResourceClaimTemplates, DeviceTaintRules; see "DRA versions" below): get,
  list (``resourceVersion``, ``limit``/``continue`` over a consistent snapshot), create,
  replace (409 Conflict on a stale ``metadata.resourceVersion``), patch (JSON merge patch and
  strategic merge patch, with ``conditions`` merged by ``type``), delete;
* watch (``?watch=1``): chunked JSON lines from ``resourceVersion``, synthetic ADDED events
  for a watch from "0"/"", ``timeoutSeconds`` ended by the server, and 410 Gone as an ERROR
  event (``reason: Expired``) when the requested version is older than the retained window
  (HTTP 410 for such a list). As on a real server (../shared/kube-apiserver.md), bookmarks
  (``allowWatchBookmarks``) are rare by default: ``bookmarks="rare"`` sends one shortly before
  ``timeoutSeconds`` ends a watch and none in between, ``"none"`` never sends one (a server
  without its watch cache), ``"every-second"`` one every ``bookmark_interval``. A watcher that
  stops reading is closed by the server once a write has waited ``unresponsive_after``
  seconds ("Forcing watcher close due to unresponsiveness"). resourceVersions are opaque
  strings whose numbers start at a fresh random point per server (``first_version`` pins it),
  so a client that stored one from an earlier server may hold one higher than any now;
* ``fieldSelector`` (``=``, ``==``, ``!=``) on the fields the real server indexes: every
  kind's ``metadata.name``/``metadata.namespace``, pods' ``spec.nodeName`` and
  ``status.phase``, ResourceSlices' ``spec.nodeName`` and ``spec.driver``; any other field is
  400 "field label not supported", as on a real server. ``labelSelector`` with equality
  terms (``k=v``, ``k!=v``, ``k``, ``!k``);
* discovery: ``/api``, ``/apis``, ``/apis/<group>`` and ``/apis/<group>/<version>``.

Lists at a version, as the real 1.36 server answered them (docs/real-kube-apiserver.md, "A
stored version the server has not reached"): ``resourceVersionMatch=NotOlderThan`` a version
the kind's watch cache has not reached is 504 "Too large resource version" (the real server
first waits about 3 s; here at once), ``Exact`` a version not handed out is the same 504, and
``Exact`` one older than the retained window is 410. ``progress_notify=False`` is a server
over an etcd without RequestWatchProgress (etcd 3.5): a kind's watch cache then moves only
with that kind's own events, so a quiet kind answers NotOlderThan with 504 even for versions
the server handed out since, while Exact (sent to etcd there) still tells them apart.

DRA versions: ``resource_versions`` names the resource.k8s.io versions that serve
ResourceSlices, DeviceClasses, ResourceClaims and templates (``v1`` from Kubernetes 1.34,
``v1beta2`` from 1.33; their objects have the same shape), ``device_taint_rule_versions``
those that serve DeviceTaintRules (``v1alpha3`` behind the DRADeviceTaints gate up to 1.35,
``v1beta2`` from 1.36, ``v1`` where GA; empty: the gate is off). Objects are stored once
(as ``resource.k8s.io/v1``) and answered in the version asked for.

Fault injection for tests: :meth:`ApiServer.cut_watches` (drop every watch connection),
:meth:`stall_watches` (keep them open, send nothing, not even bookmarks),
:meth:`force_gone` (compact the history: the next resume gets 410), :meth:`refuse_for`
(close the listening socket for a while: connections are refused, then it comes back on the
same port), :meth:`forbid` (answer 403 Forbidden for one resource, as missing RBAC does),
:meth:`queue_watches` (new watch requests wait before they are answered, as API Priority and
Fairness queues them on a busy server). Every watch the server ends without its last chunk is
recorded with why in :attr:`ApiServer.unclean_watch_ends` (a cut, a write that failed or waited
``unresponsive_after``): a client that sees "Response ended prematurely" can be matched to it.

Events (events.k8s.io/v1): created with the real server's required fields checked (422).
A patch whose ``metadata.uid`` is not the object's is 422 (the UID is immutable), so a UID in
a patch is a precondition.

The Eviction API (``POST pods/<name>/eviction``, policy/v1): ``deleteOptions.preconditions.uid``
other than the pod's is 409 Conflict ("Precondition failed"), as the real server's; a Running pod covered by a
PodDisruptionBudget whose ``status.disruptionsAllowed`` is below 1 is refused with 429 and the
real message; otherwise the budget's allowance is decremented (as the real server does until
the disruption controller recounts) and the pod is deleted. The budget's status is what the
test writes, standing in for the disruption controller.

Dry run (``?dryRun=All``) on a patch and an eviction, as the real server's
(pkg/registry/core/pod/storage/eviction.go, API conventions "Dry-run"): every check runs
(admission, the UID and resourceVersion preconditions, a PodDisruptionBudget's 429) and the
answer is the one a real request would get, but nothing is stored, no budget is decremented
and no watch event is sent. Any other value is 422 ("supported values: All"); an eviction
whose ``deleteOptions.dryRun`` differs from the query's is 500 (a plain error there), as on the
real server. The Status bodies of these answers (the 201 of an eviction, the 429's
DisruptionBudget cause, the 409 of a UID precondition, an admission denial's details) are the
real 1.36 server's, as tools/real-cluster recorded them (tests/remediation/test_real_server_answers.py).

Like the real cluster (``garbage_collector=True``; off by default): ownerReferences are acted
on, an object whose owners do not exist is deleted, and pods of a deleted Node go with it
(:meth:`collect_garbage`). :meth:`taint_node` taints a Node as the node-lifecycle controller
does (with ``timeAdded``). :meth:`admit` enforces ValidatingAdmissionPolicies on HTTP writes as
one identity, with the real server's CEL semantics (gpuquota.sim.admission).

Real-size pods: with ``realistic=True`` (the default, as admission and defaulting are always
on in a real server) every pod written is stored dressed by :mod:`gpuquota.sim.realism`
(managedFields, the service-account volume, defaults, conditions: about 4.7 kB of JSON
instead of about 1.5 kB); the fields the accounting reads are never changed.

:class:`Driver` feeds a :class:`gpuquota.sim.workload.Workload` into the server, as fast as it can or
time-compressed. :meth:`ApiServer.write_kubeconfig` writes a kubeconfig for the client.

Simplifications, by design: no authentication; a watch filtered by a selector sends the
events of matching objects only (an object that stops matching is not turned into a DELETED
event: the selectable fields used here are immutable); a DELETE removes the object at once (with ``deletionTimestamp`` set to now when absent); graceful deletion is what
the workload driver replays.
"""

from __future__ import annotations

import base64
import bisect
import contextlib
import copy
import json
import random
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from gpuquota.sim import realism
from gpuquota.sim.clock import SimClock
from gpuquota.sim.workload import Workload, quota_refusal, rfc3339

Obj = dict[str, Any]


@dataclass(frozen=True)
class Resource:
    plural: str
    kind: str
    group_version: str  # "v1" or "coordination.k8s.io/v1"
    namespaced: bool


RESOURCES: dict[str, Resource] = {
    r.plural: r
    for r in (
        Resource("pods", "Pod", "v1", True),
        Resource("nodes", "Node", "v1", False),
        Resource("namespaces", "Namespace", "v1", False),
        Resource("resourcequotas", "ResourceQuota", "v1", True),
        Resource("leases", "Lease", "coordination.k8s.io/v1", True),
        Resource("poddisruptionbudgets", "PodDisruptionBudget", "policy/v1", True),
        Resource("events", "Event", "events.k8s.io/v1", True),
        Resource("resourceslices", "ResourceSlice", "resource.k8s.io/v1", False),
        Resource("deviceclasses", "DeviceClass", "resource.k8s.io/v1", False),
        Resource("resourceclaims", "ResourceClaim", "resource.k8s.io/v1", True),
        Resource("resourceclaimtemplates", "ResourceClaimTemplate", "resource.k8s.io/v1", True),
        Resource("devicetaintrules", "DeviceTaintRule", "resource.k8s.io/v1", False),
    )
}
DRA_GROUP = "resource.k8s.io"
DRA_KINDS = ("resourceslices", "deviceclasses", "resourceclaims", "resourceclaimtemplates")
# versions that may serve them, newest first (v1beta1 is left out: its device shape differs)
DRA_VERSIONS = ("v1", "v1beta2")
DEVICE_TAINT_RULE_VERSIONS = ("v1", "v1beta2", "v1alpha3")
# what a release serves DeviceTaintRules in, with the DRADeviceTaintRules gate on (1.36:
# seen on a real v1.36.2; 1.37: v1 expected): ApiServer(device_taint_rule_versions=...[release])
DEVICE_TAINT_RULE_RELEASES = {
    "1.35": ("v1alpha3",),
    "1.36": ("v1beta2", "v1alpha3"),
    "1.37": ("v1", "v1beta2", "v1alpha3"),
}
# fields a field selector may name, beyond metadata.name and metadata.namespace
SELECTABLE_FIELDS: dict[str, tuple[str, ...]] = {
    "pods": ("spec.nodeName", "status.phase"),
    "resourceslices": ("spec.nodeName", "spec.driver"),
}
BY_KIND = {r.kind: r for r in RESOURCES.values()}
# lists that a strategic merge patch merges by a key instead of replacing
MERGE_KEYS = {"conditions": "type", "containers": "name", "initContainers": "name"}


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> Obj:
        body: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
        }
        if self.reason:  # an internal error (a plain Go error on the real server) has none
            body["reason"] = self.reason
        if self.details is not None:
            body["details"] = self.details
        body["code"] = self.code
        return body


# the answer to an eviction (201), as the real server sends it
EVICTED: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}  # fmt: skip
EVENT_REQUIRED = ("eventTime", "reportingController", "reportingInstance", "action", "reason")


def _check_event(body: Obj) -> None:
    """events.k8s.io/v1 validation of a new Event, as the real server's: the fields it
    requires, a type of Normal or Warning, and a regarding object."""
    missing = [f for f in EVENT_REQUIRED if not body.get(f)]
    if missing:
        raise ApiError(422, "Invalid", f"Event is invalid: {missing[0]}: Required value")
    if body.get("type") not in ("Normal", "Warning"):
        raise ApiError(422, "Invalid", "Event is invalid: type: Unsupported value")
    if not (body.get("regarding") or {}).get("kind"):
        raise ApiError(422, "Invalid", "Event is invalid: regarding.kind: Required value")


def check_dry_run(values: Sequence[str], options_kind: str) -> bool:
    """Whether a write is a dry run: its ``dryRun`` values, each "All" (422 otherwise, naming
    the whole list, as the real server validates CreateOptions/PatchOptions)."""
    if any(value != "All" for value in values):
        given = json.dumps(list(values), separators=(",", ":"))
        raise ApiError(
            422,
            "Invalid",
            f'{options_kind}.meta.k8s.io "" is invalid: dryRun: Unsupported value: {given}: '
            'supported values: "All"',
            {"group": "meta.k8s.io", "kind": options_kind, "causes": [{
                "reason": "FieldValueNotSupported",
                "message": f'Unsupported value: {given}: supported values: "All"',
                "field": "dryRun"}]},
        )  # fmt: skip
    return bool(values)


def go_list(values: Sequence[str]) -> str:
    """A list of strings as Go's %v prints it: [All Other]."""
    return "[" + " ".join(values) + "]"


def budget_refusal(budget: Obj) -> ApiError:
    """The 429 of a PodDisruptionBudget that allows no disruption, with the cause the real
    server gives (pkg/registry/core/pod/storage/eviction.go, checkAndDecrement)."""
    name = budget["metadata"]["name"]
    status = budget.get("status") or {}
    allowed: Obj = next((c for c in status.get("conditions") or [] if c.get("type") == "DisruptionAllowed"), {})  # fmt: skip
    failed = allowed.get("status") == "False" and bool(allowed.get("message"))
    desired, current = (
        int(status.get("desiredHealthy") or 0),
        int(status.get("currentHealthy") or 0),
    )
    if failed and allowed.get("reason") == "SyncFailed":
        cause = f"The disruption budget {name} does not allow evicting pods currently because it failed sync: {allowed['message']}"  # fmt: skip
    elif current <= desired:
        cause = f"The disruption budget {name} needs {desired} healthy pods and has {current} currently"  # fmt: skip
    elif failed:
        cause = f"The disruption budget {name} does not allow evicting pods currently ({allowed['reason']}): {allowed['message']}"  # fmt: skip
    else:
        cause = f"The disruption budget {name} does not allow evicting pods currently"
    return ApiError(
        429,
        "TooManyRequests",
        "Cannot evict pod as it would violate the pod's disruption budget.",
        {"causes": [{"reason": "DisruptionBudget", "message": cause}]},
    )


def merge_patch(target: Any, patch: Any, strategic: bool = False) -> Any:
    """RFC 7386 JSON merge patch; ``strategic`` merges known lists by their merge key."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif (
            strategic
            and key in MERGE_KEYS
            and isinstance(value, list)
            and isinstance(out.get(key), list)
        ):
            mk = MERGE_KEYS[key]
            merged = [copy.deepcopy(x) for x in out[key]]
            for item in value:
                idx = next((i for i, x in enumerate(merged) if x.get(mk) == item.get(mk)), None)
                if idx is None:
                    merged.append(copy.deepcopy(item))
                else:
                    merged[idx] = merge_patch(merged[idx], item, True)
            out[key] = merged
        else:
            out[key] = merge_patch(out.get(key), value, strategic)
    return out


EVICTION = "EvictionInProgress"  # the DeviceTaintRule condition the server maintains
_TERMINAL = ("Succeeded", "Failed")


def _requests(container: Obj) -> dict[str, int]:
    resources = container.get("resources") or {}
    # an extended resource's request defaults to its limit
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    out: dict[str, int] = {}
    for key, value in merged.items():
        with contextlib.suppress(ValueError):
            out[key] = int(str(value))  # whole units only (GPUs); cpu/memory are not charged
    return out


def pod_quota_requests(pod: Obj) -> dict[str, int]:
    """``requests.<resource>`` -> units a pod counts against a quota: the larger of its
    containers' sum (sidecars included) and its init containers' peak, plus overhead."""
    spec = pod.get("spec") or {}
    app: dict[str, int] = {}
    for c in spec.get("containers") or []:
        for k, n in _requests(c).items():
            app[k] = app.get(k, 0) + n
    sidecars: dict[str, int] = {}
    peak: dict[str, int] = {}
    for c in spec.get("initContainers") or []:
        own = _requests(c)
        if c.get("restartPolicy") == "Always":
            for k, n in own.items():
                sidecars[k] = sidecars.get(k, 0) + n
                app[k] = app.get(k, 0) + n
        else:
            for k, n in own.items():
                peak[k] = max(peak.get(k, 0), n + sidecars.get(k, 0))
    total = {k: max(app.get(k, 0), peak.get(k, 0)) for k in app.keys() | peak.keys()}
    for k, v in (spec.get("overhead") or {}).items():
        with contextlib.suppress(ValueError):
            total[k] = total.get(k, 0) + int(str(v))
    return {f"requests.{k}": n for k, n in total.items() if n}


def _quota_matches(quota: Obj, pod: Obj) -> bool:
    """Whether a quota's scopes select the pod (BestEffort: no cpu or memory anywhere)."""
    scopes = quota.get("spec", {}).get("scopes") or []
    containers = [
        *(pod["spec"].get("containers") or []),
        *(pod["spec"].get("initContainers") or []),
    ]
    best_effort = not any(
        k in ("cpu", "memory")
        for c in containers
        for part in ("requests", "limits")
        for k in ((c.get("resources") or {}).get(part) or {})
    )
    if "NotBestEffort" in scopes and best_effort:
        return False
    return not ("BestEffort" in scopes and not best_effort)


def _defaults(res: Resource, body: Obj) -> None:
    """What the real server fills in on create and update."""
    if res.plural == "devicetaintrules":
        taint = (body.get("spec") or {}).get("taint")
        if isinstance(taint, dict):  # "added automatically during create or update"
            taint.setdefault("timeAdded", rfc3339(int(time.time())))
            # as a real 1.36 server reports it (the NoExecute wording is the stand-in's own)
            evicting = taint.get("effect") == "NoExecute"
            status = body.setdefault("status", {})
            conditions = [c for c in status.get("conditions") or [] if c.get("type") != EVICTION]
            old: Obj = next(
                (c for c in status.get("conditions") or [] if c.get("type") == EVICTION), {}
            )
            state = "True" if evicting else "False"
            conditions.append({
                "type": EVICTION,
                "status": state,
                "reason": "PodsPendingEviction" if evicting else "NoEffect",
                "message": "pods using the tainted devices get evicted" if evicting
                else "Eviction only happens for the NoExecute effect.",
                "lastTransitionTime": old.get("lastTransitionTime") if old.get("status") == state
                else rfc3339(int(time.time())),
            })  # fmt: skip
            status["conditions"] = conditions


def _field_value(obj: Obj, path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


@dataclass(frozen=True)
class Selector:
    """A list/watch request's ``fieldSelector`` and ``labelSelector``, parsed."""

    fields: tuple[tuple[str, str, bool], ...] = ()  # (path, value, wanted equal)
    labels: tuple[tuple[str, str | None, bool], ...] = ()  # (key, value or None: exists, wanted)

    @classmethod
    def parse(cls, res: Resource, query: dict[str, str]) -> Selector:
        fields: list[tuple[str, str, bool]] = []
        allowed = {"metadata.name", "metadata.namespace", *SELECTABLE_FIELDS.get(res.plural, ())}
        for term in filter(None, (t.strip() for t in query.get("fieldSelector", "").split(","))):
            path, value, equal = _split_term(term, "fieldSelector")
            if value is None:
                raise ApiError(400, "BadRequest", f"invalid field selector term {term!r}")
            if path not in allowed:
                raise ApiError(400, "BadRequest", f"field label not supported: {path}")
            fields.append((path, value, equal))
        labels: list[tuple[str, str | None, bool]] = []
        for term in filter(None, (t.strip() for t in query.get("labelSelector", "").split(","))):
            if term.startswith("!"):
                labels.append((term[1:], None, False))
                continue
            key, value, equal = _split_term(term, "labelSelector")
            labels.append((key, value, equal))
        return cls(tuple(fields), tuple(labels))

    def __bool__(self) -> bool:
        return bool(self.fields or self.labels)

    def matches(self, obj: Obj) -> bool:
        for path, value, equal in self.fields:
            if (_field_value(obj, path) == value) != equal:
                return False
        have = obj.get("metadata", {}).get("labels") or {}
        for key, label, wanted in self.labels:
            if label is None:
                if (key in have) != wanted:
                    return False
            elif (have.get(key) == label) != wanted:
                return False
        return True


def _split_term(term: str, what: str) -> tuple[str, str | None, bool]:
    for op, equal in (("!=", False), ("==", True), ("=", True)):
        if op in term:
            key, value = term.split(op, 1)
            if not key.strip():
                raise ApiError(400, "BadRequest", f"invalid {what} term {term!r}")
            return key.strip(), value.strip(), equal
    if what == "labelSelector":  # a bare key: the label exists
        return term, None, True
    raise ApiError(400, "BadRequest", f"invalid {what} term {term!r}")


BOOKMARK_MODES = ("rare", "none", "every-second")
RARE_BOOKMARK_LEAD = 2.0  # seconds before timeoutSeconds a "rare" bookmark is sent


class _State:
    """Objects, the event history and the watch bookkeeping, under one lock."""

    def __init__(self, window: int, first_version: int):
        self.lock = threading.Condition()
        self.rv = first_version
        self.objects: dict[str, dict[tuple[str, str], Obj]] = {p: {} for p in RESOURCES}
        # (rv, plural, namespace, encoded line, object); the oldest are dropped beyond ``window``
        self.history: list[tuple[int, str, str, bytes, Obj]] = []
        self.window = window
        self.compacted = self.rv  # a watch from an older version than this gets 410
        # the watch cache's version per kind where etcd reports no progress (progress_notify
        # off): it moves only with the kind's own events
        self.cached: dict[str, int] = dict.fromkeys(RESOURCES, first_version)
        self.snapshots: dict[str, tuple[int, list[Obj]]] = {}
        # id(stored object) -> (the object, its JSON as a list item): encoded once, when it is
        # written, as the real server's watch cache does; a list only joins the bytes
        self.encoded: dict[int, tuple[Obj, bytes]] = {}

    def next_rv(self) -> int:
        self.rv += 1
        return self.rv

    def record(self, plural: str, type_: str, obj: Obj) -> bytes:
        """Append the event to the history; returns the object's JSON."""
        rv = int(obj["metadata"]["resourceVersion"])
        self.cached[plural] = rv
        encoded = json.dumps(obj, separators=(",", ":")).encode()
        line = b'{"type":"' + type_.encode() + b'","object":' + encoded + b"}\n"
        self.history.append((rv, plural, obj["metadata"].get("namespace", ""), line, obj))
        if len(self.history) > self.window * 2:
            drop = len(self.history) - self.window
            self.compacted = self.history[drop - 1][0]
            del self.history[:drop]
        self.lock.notify_all()
        return encoded

    def item(self, obj: Obj) -> bytes:
        """``obj`` as a list item (no kind/apiVersion), from the bytes kept at its write."""
        kept = self.encoded.get(id(obj))
        if kept is not None and kept[0] is obj:
            return kept[1]
        stripped = {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}
        return json.dumps(stripped, separators=(",", ":")).encode()

    def keep_encoded(self, obj: Obj, encoded: bytes) -> None:
        head = (
            json.dumps(
                {"kind": obj.get("kind"), "apiVersion": obj.get("apiVersion")},
                separators=(",", ":"),
            ).encode()[:-1]
            + b","
        )
        if list(obj)[:2] == ["kind", "apiVersion"] and encoded.startswith(head):
            self.encoded[id(obj)] = (obj, b"{" + encoded[len(head) :])


class ApiServer:
    """The stand-in; ``start()`` binds 127.0.0.1 on a free port (or ``port``)."""

    def __init__(
        self,
        *,
        window: int = 100_000,
        bookmarks: str = "rare",
        bookmark_interval: float = 1.0,
        unresponsive_after: float = 5.0,
        first_version: int | None = None,
        port: int = 0,
        resource_versions: Sequence[str] = ("v1",),
        device_taint_rule_versions: Sequence[str] = ("v1",),
        garbage_collector: bool = False,
        realistic: bool = True,
        progress_notify: bool = True,
    ):
        if bookmarks not in BOOKMARK_MODES:
            raise ValueError(f"bookmarks: {bookmarks!r} is not one of {BOOKMARK_MODES}")
        for version in resource_versions:
            if version not in DRA_VERSIONS:
                raise ValueError(f"resource_versions: {version!r} is not one of {DRA_VERSIONS}")
        for version in device_taint_rule_versions:
            if version not in DEVICE_TAINT_RULE_VERSIONS:
                raise ValueError(
                    f"device_taint_rule_versions: {version!r} is not one of "
                    f"{DEVICE_TAINT_RULE_VERSIONS}"
                )
        # group/version -> the plurals it serves
        self.served: dict[str, set[str]] = {}
        for res in RESOURCES.values():
            if not res.group_version.startswith(DRA_GROUP):
                self.served.setdefault(res.group_version, set()).add(res.plural)
        for version in resource_versions:
            self.served.setdefault(f"{DRA_GROUP}/{version}", set()).update(DRA_KINDS)
        for version in device_taint_rule_versions:
            self.served.setdefault(f"{DRA_GROUP}/{version}", set()).add("devicetaintrules")
        self._forbidden: set[str] = set()
        # a fresh epoch per server: versions are not comparable across servers (or restarts)
        first = random.randrange(1_000, 1_000_000) if first_version is None else first_version
        self.state = _State(window, first)
        self.bookmarks = bookmarks
        self.bookmark_interval = bookmark_interval
        self.unresponsive_after = unresponsive_after
        # pods stored as a real 1.36 server returns them (gpuquota.sim.realism), as admission
        # and defaulting do on every write there; off: exactly what was written
        self.realistic = realistic
        self.progress_notify = progress_notify
        self._port = port
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._watch_gen = 0  # bumped to cut every open watch
        self._stalled: set[int] = set()  # watch ids told to go silent
        self._watch_gate = threading.Event()  # cleared: new watches wait (queue_watches)
        self._watch_gate.set()
        # (resource, why) of every watch ended without its last chunk
        self.unclean_watch_ends: list[tuple[str, str]] = []
        self._watch_ids = 0
        self._watch_conns: dict[int, socket.socket] = {}
        self._conns: set[socket.socket] = set()  # every open connection, for refuse_for
        self._refusing = threading.Lock()
        self.requests: dict[str, int] = {}  # "GET pods" -> count, for tests
        # (API group, resource[/subresource], RBAC verb) of every request: what a role needs
        self.calls: set[tuple[str, str, str]] = set()
        self.active_watches = 0
        # the kube-controller-manager's garbage collector and pod GC, in a thread (off: the
        # workload driver replays deletions itself and owns pods by kinds not served here)
        self._gc = garbage_collector
        self._gc_stop = threading.Event()
        self._admission: list[tuple[Obj, Any]] = []  # (policy, gpuquota.sim.admission.Policy)
        self._user: Obj = {}
        self._http = threading.local()  # the subresource of the HTTP write being handled

    # -- life cycle

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def start(self) -> ApiServer:
        handler = type("Handler", (_Handler,), {"api": self})
        httpd = ThreadingHTTPServer(("127.0.0.1", self._port), handler)
        httpd.daemon_threads = True
        self._port = httpd.server_address[1]
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
        )
        self._thread.start()
        if self._gc:
            self._gc_stop.clear()
            threading.Thread(target=self._gc_loop, name="sim-gc", daemon=True).start()
        return self

    def stop(self) -> None:
        self._gc_stop.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        self.cut_watches()

    def __enter__(self) -> ApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "sim", "cluster": {"server": self.url}}],
            "users": [{"name": "sim", "user": {"token": "sim-token"}}],
            "contexts": [
                {
                    "name": "sim",
                    "context": {"cluster": "sim", "user": "sim", "namespace": namespace},
                }
            ],
            "current-context": "sim",
        }
        path.write_text(json.dumps(cfg, indent=1))
        return path

    # -- faults

    def cut_watches(self) -> None:
        """Drop every open watch connection (the client sees the stream end or reset)."""
        with self.state.lock:
            self._watch_gen += 1
            conns = list(self._watch_conns.values())
            self.state.lock.notify_all()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def stall_watches(self) -> None:
        """Every watch open now goes silent: connection kept, nothing sent, ever again."""
        with self.state.lock:
            self._stalled.update(self._watch_conns)

    def queue_watches(self, queued: bool = True) -> None:
        """While queued, a new watch request is answered only once released (``False``): a
        busy real server's API Priority and Fairness queues requests before serving them."""
        (self._watch_gate.clear if queued else self._watch_gate.set)()

    def force_gone(self) -> None:
        """Compact the whole history and cut watches: resuming from any old version gets 410."""
        with self.state.lock:
            self.state.history.clear()
            # every version handed out so far is now too old
            self.state.compacted = self.state.next_rv()
            self.state.snapshots.clear()
        self.cut_watches()

    def refuse_for(self, seconds: float) -> None:
        """Close the listening socket (connections refused) and reopen it after ``seconds``."""
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        self._httpd = None
        self.cut_watches()
        with self.state.lock:
            conns = list(self._conns)
        for conn in conns:  # kept-alive connections go too
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

        def reopen() -> None:
            deadline = time.monotonic() + 5
            while True:
                try:
                    self.start()
                    return
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)

        timer = threading.Timer(seconds, reopen)
        timer.daemon = True
        timer.start()

    def forbid(self, plural: str, forbidden: bool = True) -> None:
        """Answer every request for ``plural`` with 403 Forbidden (RBAC not granted)."""
        if plural not in RESOURCES:
            raise ValueError(f"unknown resource {plural!r}")
        with self.state.lock:
            (self._forbidden.add if forbidden else self._forbidden.discard)(plural)

    def check_allowed(self, res: Resource, verb: str, ns: str) -> None:
        with self.state.lock:
            forbidden = res.plural in self._forbidden
        if forbidden:
            group = res.group_version.rpartition("/")[0]
            where = f'in the namespace "{ns}"' if ns else "at the cluster scope"
            raise ApiError(
                403,
                "Forbidden",
                f"{res.plural}{'.' + group if group else ''} is forbidden: User "
                f'"system:serviceaccount:sim:sim" cannot {verb} resource "{res.plural}" in API '
                f'group "{group}" {where}',
            )

    # -- direct access (the driver and tests; bypasses HTTP)

    def apply(self, type_: str, obj: Obj, *, copy_obj: bool = True) -> Obj:
        """Apply a watch event as if a controller wrote it: ADDED/MODIFIED upsert, DELETED.

        ``copy_obj=False`` stores ``obj`` itself (the caller hands it over: bulk loading)."""
        res = BY_KIND[obj["kind"]]
        ns = obj["metadata"].get("namespace", "") if res.namespaced else ""
        name = obj["metadata"]["name"]
        st = self.state
        with st.lock:
            store = st.objects[res.plural]
            new = copy.deepcopy(obj) if copy_obj else obj
            if self.realistic and res.kind == "Pod":
                new = realism.dress(new)
            new["metadata"]["resourceVersion"] = str(st.next_rv())
            old = store.get((ns, name))
            if old is not None:
                st.encoded.pop(id(old), None)
            if type_ == "DELETED":
                if store.pop((ns, name), None) is None:
                    raise ApiError(404, "NotFound", f'{res.plural} "{name}" not found')
                st.record(res.plural, "DELETED", new)
            else:
                store[(ns, name)] = new
                encoded = st.record(res.plural, "MODIFIED" if old is not None else "ADDED", new)
                st.keep_encoded(new, encoded)
            return new

    def taint_node(
        self, name: str, key: str, effect: str = "NoExecute", value: str | None = None
    ) -> Obj:
        """Adds a taint to a Node as the node-lifecycle controller does (``timeAdded`` set, in
        the API server's RFC 3339 form), e.g. ``node.kubernetes.io/unreachable``."""
        with self.state.lock:
            node = copy.deepcopy(self.state.objects["nodes"][("", name)])
            taint: Obj = {"key": key, "effect": effect, "timeAdded": rfc3339(int(time.time()))}
            if value is not None:
                taint["value"] = value
            taints = node.setdefault("spec", {}).setdefault("taints", [])
            taints[:] = [t for t in taints if t.get("key") != key] + [taint]
            return self.apply("MODIFIED", node, copy_obj=False)

    def admit(self, policies: Iterable[Obj], user: Obj) -> None:
        """Judges every write that comes over HTTP as made by ``user`` (a userInfo: username,
        extra) with these ValidatingAdmissionPolicies, decided with the real server's CEL
        semantics (gpuquota.sim.admission); writes through apply() (other controllers, the
        tests) are not judged. A denial is the real server's 403 with the policy's message; a
        failing expression, its 422."""
        from gpuquota.sim.admission import Policy

        self._admission = [(p, Policy(p)) for p in policies]
        self._user = copy.deepcopy(user)

    def _judge(self, res: Resource, operation: str, new: Obj | None, old: Obj | None) -> None:
        sub = getattr(self._http, "sub", None)
        if sub is None or not self._admission:
            return  # not an HTTP write, or nothing to enforce
        group = res.group_version.rpartition("/")[0]
        resource = f"{res.plural}/{sub}" if sub else res.plural
        request: Obj = {"operation": operation, "userInfo": self._user}
        if sub:
            request["subResource"] = sub
        for raw, policy in self._admission:
            rules = raw["spec"]["matchConstraints"]["resourceRules"]
            if not any(
                group in r.get("apiGroups", []) and resource in r.get("resources", [])
                and operation in r.get("operations", []) for r in rules
            ):  # fmt: skip
                continue
            decision = policy.decide(request, new, old)
            if decision.allowed:
                continue
            name = raw["metadata"]["name"]
            what = (new or old or {}).get("metadata", {}).get("name", "")
            denied = f"ValidatingAdmissionPolicy '{name}' with binding '{name}' denied request: {decision.message}"  # fmt: skip
            text = f'{res.plural} "{what}" is forbidden: {denied}'
            # a denial's details as the real server's (seen on 1.36): the name, the resource, and
            # the policy's message as the one cause
            raise (
                ApiError(422, "Invalid", text)
                if decision.error
                else ApiError(403, "Forbidden", text,
                              {"name": what, "kind": res.plural, "causes": [{"message": denied}]})
            )  # fmt: skip

    def collect_garbage(self) -> list[tuple[str, str, str]]:
        """One pass of the garbage collectors, until nothing more goes; what was deleted.

        As the real ones: an object whose ownerReferences (of kinds served here) all name
        objects that do not exist, by uid, is deleted, and so in turn are its dependents; a
        Pod bound to a Node that does not exist is deleted (pod GC). Owners of kinds not
        served here (a Job, a ReplicaSet) are not judged."""
        gone: list[tuple[str, str, str]] = []
        with self.state.lock:
            while True:
                uids = {
                    (res.kind, o["metadata"].get("uid"))
                    for res in RESOURCES.values()
                    for o in self.state.objects[res.plural].values()
                }
                nodes = {name for _ns, name in self.state.objects["nodes"]}
                doomed = []
                for res in RESOURCES.values():
                    for (ns, name), obj in self.state.objects[res.plural].items():
                        refs = [
                            r
                            for r in obj["metadata"].get("ownerReferences") or []
                            if isinstance(r, dict) and r.get("kind") in BY_KIND
                        ]
                        orphan = bool(refs) and all(
                            (r["kind"], r.get("uid")) not in uids for r in refs
                        )
                        node = (
                            (obj.get("spec") or {}).get("nodeName")
                            if res.plural == "pods"
                            else None
                        )
                        if orphan or (node and node not in nodes):
                            doomed.append((res, ns, name))
                if not doomed:
                    return gone
                for res, ns, name in doomed:
                    self.delete(res, ns, name)
                    gone.append((res.plural, ns, name))

    def _gc_loop(self) -> None:
        seen = -1
        while not self._gc_stop.wait(0.05):
            if self.state.rv != seen:
                seen = self.state.rv
                self.collect_garbage()

    def get(self, plural: str, name: str, namespace: str = "") -> Obj | None:
        with self.state.lock:
            obj = self.state.objects[plural].get((namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def count(self, plural: str) -> int:
        with self.state.lock:
            return len(self.state.objects[plural])

    @property
    def resource_version(self) -> int:
        return self.state.rv

    def changed_since(self, kind: str, version: str) -> list[Obj] | None:
        """For tests and the demo: the objects of ``kind`` written after ``version`` in this
        server's own order (a client never compares versions; the server that issued them
        may), or None when this server cannot tell (compacted, or a version it never handed
        out). The stored copies: read them, never change them."""
        plural = BY_KIND[kind].plural
        with self.state.lock:
            try:
                since = int(version)
            except ValueError:
                return None
            if since < self.state.compacted or since > self.state.rv:
                return None
            hist = self.state.history
            i = bisect.bisect_right(hist, since, key=lambda h: h[0])
            return [h[4] for h in hist[i:] if h[1] == plural]

    # -- HTTP operations (called by the handler)

    def list(self, res: Resource, ns: str, query: dict[str, str]) -> Obj:
        meta, page = self._page(res, ns, query)
        # list items carry no kind/apiVersion, as the real server sends them
        stripped = [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")} for o in page]
        return {
            "kind": f"{res.kind}List",
            "apiVersion": res.group_version,
            "metadata": meta,
            "items": stripped,
        }

    def list_json(self, res: Resource, ns: str, query: dict[str, str], group_version: str) -> bytes:
        """:meth:`list` encoded, its items from the bytes kept when they were written."""
        meta, page = self._page(res, ns, query)
        with self.state.lock:
            items = b",".join(self.state.item(o) for o in page)
        head = {"kind": f"{res.kind}List", "apiVersion": res.group_version, "metadata": meta}
        encoded = json.dumps(as_version(head, group_version), separators=(",", ":")).encode()
        return encoded[:-1] + b',"items":[' + items + b"]}"

    def _page(self, res: Resource, ns: str, query: dict[str, str]) -> tuple[Obj, Sequence[Obj]]:
        """One page of a list: its metadata and the stored objects (not to be changed)."""
        st = self.state
        selector = Selector.parse(res, query)
        limit = int(query.get("limit") or 0)
        token = query.get("continue")
        with st.lock:
            rv_q = query.get("resourceVersion", "")
            match = query.get("resourceVersionMatch")
            if rv_q and match == "Exact" and int(rv_q) > st.rv:
                # a revision etcd has not reached (with progress_notify off the server asks
                # etcd at once; with it, after waiting ~3 s for its cache)
                raise ApiError(
                    504, "Timeout", f"Too large resource version: {rv_q}, current: {st.rv}"
                )
            if rv_q and match == "Exact" and int(rv_q) < st.compacted:
                # as etcd refuses a compacted revision (the watch's wording differs)
                raise ApiError(
                    410, "Expired", "The resourceVersion for the provided list is too old."
                )
            cached = st.rv if self.progress_notify else st.cached[res.plural]
            if rv_q and match == "NotOlderThan" and int(rv_q) > cached:
                # a version the kind's watch cache has not reached: the real server waits ~3 s
                # for it, then says so (here at once); without progress_notify, also one the
                # server handed out since the kind last changed
                raise ApiError(
                    504, "Timeout", f"Too large resource version: {rv_q}, current: {cached}"
                )
            if token:
                try:
                    key, offset = json.loads(base64.urlsafe_b64decode(token))
                    rv, items = st.snapshots[key]
                except (ValueError, KeyError, TypeError) as exc:
                    raise ApiError(
                        410, "Expired", "the provided continue parameter is too old"
                    ) from exc
            else:
                rv = st.rv
                items = sorted(
                    (
                        o
                        for (ons, _), o in st.objects[res.plural].items()
                        if (not ns or ons == ns) and (not selector or selector.matches(o))
                    ),
                    key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]),
                )
                key, offset = uuid.uuid4().hex, 0
                if limit and len(items) > limit:
                    st.snapshots[key] = (rv, items)
        page = items[offset : offset + limit] if limit else items
        meta: Obj = {"resourceVersion": str(rv)}
        if limit and offset + limit < len(items):
            meta["continue"] = base64.urlsafe_b64encode(
                json.dumps([key, offset + limit]).encode()
            ).decode()
            meta["remainingItemCount"] = len(items) - offset - limit
        elif token:
            with st.lock:
                st.snapshots.pop(key, None)
        return meta, page

    def read(self, res: Resource, ns: str, name: str) -> Obj:
        obj = self.get(res.plural, name, ns)
        if obj is None:
            raise ApiError(404, "NotFound", f'{res.plural} "{name}" not found')
        return obj

    def create(self, res: Resource, ns: str, body: Obj) -> Obj:
        meta = body.setdefault("metadata", {})
        name = meta.get("name")
        if not name:
            raise ApiError(422, "Invalid", "metadata.name: Required value")
        if res.namespaced:
            meta["namespace"] = ns
        with self.state.lock:
            if (ns, name) in self.state.objects[res.plural]:
                raise ApiError(409, "AlreadyExists", f'{res.plural} "{name}" already exists')
            if res.plural == "events":
                _check_event(body)
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", rfc3339(int(time.time())))
            body["kind"], body["apiVersion"] = res.kind, res.group_version
            _defaults(res, body)
            self._judge(res, "CREATE", body, None)
            if res.plural == "pods":
                self._charge_quotas(ns, name, body, +1)
            return self.apply("ADDED", body)

    def _charge_quotas(self, ns: str, name: str, pod: Obj, sign: int) -> None:
        """ResourceQuota admission (sign +1: a pod is created) and release (-1: deleted):
        refuse a pod that a matching quota has no room for (403, the real message), else
        update each matching quota's status.used at once, one write per pod, as the real
        admission plugin does (several in one second when pods come that fast). Call with
        the lock held."""
        requested = pod_quota_requests(pod)
        quotas = [q for (qns, _), q in self.state.objects["resourcequotas"].items() if qns == ns]
        matching = [q for q in quotas if _quota_matches(q, pod)]
        if sign > 0:
            for quota in matching:
                status = quota.get("status") or {}
                hard = status.get("hard") or quota.get("spec", {}).get("hard", {})
                why = quota_refusal(
                    quota["metadata"]["name"], hard, status.get("used") or {}, requested
                )
                if why:
                    raise ApiError(403, "Forbidden", f'pods "{name}" is forbidden: {why}')
        for quota in matching:
            hard = quota.get("spec", {}).get("hard", {})
            counted = {k: n for k, n in requested.items() if k in hard}
            if not counted:
                continue
            new = copy.deepcopy(quota)
            status = new.setdefault("status", {})
            status.setdefault("hard", dict(hard))
            used = status.setdefault("used", {})
            for key, n in counted.items():
                used[key] = str(max(0, int(used.get(key, "0")) + sign * n))
            self.apply("MODIFIED", new, copy_obj=False)

    def replace(self, res: Resource, ns: str, name: str, body: Obj) -> Obj:
        with self.state.lock:
            cur = self.state.objects[res.plural].get((ns, name))
            if cur is None:
                raise ApiError(404, "NotFound", f'{res.plural} "{name}" not found')
            want = body.get("metadata", {}).get("resourceVersion")
            if want and want != cur["metadata"]["resourceVersion"]:
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {res.plural} "{name}": the object has been '
                    "modified; please apply your changes to the latest version and try again",
                )
            body.setdefault("metadata", {})
            for k in ("uid", "creationTimestamp", "name"):
                body["metadata"][k] = cur["metadata"].get(k)
            if res.namespaced:
                body["metadata"]["namespace"] = ns
            body["kind"], body["apiVersion"] = res.kind, res.group_version
            _defaults(res, body)
            self._judge(res, "UPDATE", body, cur)
            return self.apply("MODIFIED", body)

    def patch(
        self, res: Resource, ns: str, name: str, body: Any, content_type: str, dry_run: bool = False
    ) -> Obj:
        with self.state.lock:
            cur = self.state.objects[res.plural].get((ns, name))
            if cur is None:
                raise ApiError(404, "NotFound", f'{res.plural} "{name}" not found')
            if "json-patch" in content_type:
                raise ApiError(
                    415, "UnsupportedMediaType", "json-patch is not supported by the stand-in"
                )
            want = ((body or {}).get("metadata") or {}).get("resourceVersion")
            if want and want != cur["metadata"]["resourceVersion"]:  # a precondition, as on a PUT
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {res.plural} "{name}": the object has been '
                    "modified; please apply your changes to the latest version and try again",
                )
            uid = ((body or {}).get("metadata") or {}).get("uid")
            if uid and uid != cur["metadata"]["uid"]:  # ObjectMeta update validation
                # the cause twice, as the real server lists it (seen on pods/status, 1.36): the
                # generic update checks the metadata, then the type's own update validation
                cause = {"reason": "FieldValueInvalid", "field": "metadata.uid",
                         "message": f'Invalid value: "{uid}": field is immutable'}  # fmt: skip
                raise ApiError(
                    422,
                    "Invalid",
                    f'{res.kind} "{name}" is invalid: metadata.uid: Invalid value: "{uid}": '
                    "field is immutable",
                    {"name": name, "kind": res.kind, "causes": [cause, cause]},
                )
            new = merge_patch(cur, body, strategic="strategic" in content_type)
            new["metadata"]["name"], new["metadata"]["uid"] = name, cur["metadata"]["uid"]
            self._judge(res, "UPDATE", new, cur)
            if dry_run:  # validated and admitted, never stored
                new["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"]
                return dict(new)
            return self.apply("MODIFIED", new)

    def delete(self, res: Resource, ns: str, name: str) -> Obj:
        with self.state.lock:
            cur = self.state.objects[res.plural].get((ns, name))
            if cur is None:
                raise ApiError(404, "NotFound", f'{res.plural} "{name}" not found')
            self._judge(res, "DELETE", None, cur)
            gone = copy.deepcopy(cur)
            gone["metadata"].setdefault("deletionTimestamp", rfc3339(int(time.time())))
            gone["metadata"].setdefault("deletionGracePeriodSeconds", 0)
            if res.plural == "pods" and cur.get("status", {}).get("phase") not in _TERMINAL:
                self._charge_quotas(ns, name, cur, -1)  # the quota controller's recount
            return self.apply("DELETED", gone)

    def evict(self, ns: str, name: str, body: Any, dry_run: Sequence[str] | None = None) -> Obj:
        """POST pods/<name>/eviction: honour the pod's PodDisruptionBudgets, then delete it
        (``dry_run``: the query's dryRun values; with ["All"] every check, no change)."""
        if not isinstance(body, dict) or body.get("kind") not in (None, "Eviction"):
            raise ApiError(400, "BadRequest", "the body of an eviction must be an Eviction")
        in_body = (body.get("deleteOptions") or {}).get("dryRun") or []
        if dry_run and in_body and list(in_body) != list(dry_run):  # propagateDryRun
            # a plain Go error there: 500 with no reason (seen on the real 1.36 server)
            raise ApiError(
                500,
                "",
                "Non-matching dry-run options in request and content: "
                f"{go_list(dry_run)} and {go_list(in_body)}",
            )
        dry = bool(check_dry_run(dry_run or in_body, "CreateOptions"))
        # admission judges the Eviction (a CREATE of pods/eviction); the delete it leads to is
        # the server's own
        self._judge(RESOURCES["pods"], "CREATE", body, None)
        self._http.sub = None
        with self.state.lock:
            pod = self.state.objects["pods"].get((ns, name))
            if pod is None:
                raise ApiError(404, "NotFound", f'pods "{name}" not found')
            want = ((body.get("deleteOptions") or {}).get("preconditions") or {}).get("uid")
            if want and want != pod["metadata"]["uid"]:  # the real server's storage check
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on Pod "{name}": the UID in the precondition '
                    f"({want}) does not match the UID in record ({pod['metadata']['uid']}). The "
                    "object might have been deleted and then recreated",
                    {"name": name, "kind": "Pod"},
                )
            labels = pod["metadata"].get("labels") or {}
            budgets = [
                b
                for (bns, _), b in self.state.objects["poddisruptionbudgets"].items()
                if bns == ns
                and all(
                    labels.get(k) == v
                    for k, v in (((b.get("spec") or {}).get("selector") or {}).get("matchLabels")
                                 or {}).items()
                )
            ]  # fmt: skip
            running = (pod.get("status") or {}).get("phase") == "Running"
            if running:
                for budget in budgets:
                    if int((budget.get("status") or {}).get("disruptionsAllowed") or 0) < 1:
                        raise budget_refusal(budget)
            if dry:  # the real server stops here: no budget written, no pod deleted
                return dict(EVICTED)
            if running:
                for budget in budgets:
                    new = copy.deepcopy(budget)
                    new["status"]["disruptionsAllowed"] -= 1
                    new["status"].setdefault("disruptedPods", {})[name] = now_rfc3339()
                    self.apply("MODIFIED", new, copy_obj=False)
            self.delete(RESOURCES["pods"], ns, name)
        return dict(EVICTED)

    # -- watch

    def _register(self, conn: socket.socket) -> tuple[int, int]:
        with self.state.lock:
            self._watch_ids += 1
            self._watch_conns[self._watch_ids] = conn
            self.active_watches += 1
            return self._watch_ids, self._watch_gen

    def _unregister(self, wid: int) -> None:
        with self.state.lock:
            self._watch_conns.pop(wid, None)
            self._stalled.discard(wid)
            self.active_watches -= 1

    def watch_lines(
        self, res: Resource, ns: str, query: dict[str, str], wid: int, gen: int
    ) -> Iterable[bytes]:
        """The lines of one watch response, until timeout, a cut, or the client going away."""
        st = self.state
        timeout = float(query.get("timeoutSeconds") or 1800)
        deadline = time.monotonic() + timeout
        asked = query.get("allowWatchBookmarks") in ("true", "1", "True")
        bookmarks = asked and self.bookmarks != "none"
        if self.bookmarks == "every-second":
            interval = self.bookmark_interval
        else:  # rare: one, shortly before the server ends the watch
            interval = max(timeout - RARE_BOOKMARK_LEAD, 0.0)
            bookmarks = bookmarks and timeout > RARE_BOOKMARK_LEAD
        selector = Selector.parse(res, query)
        rv_q = query.get("resourceVersion", "")
        with st.lock:
            if rv_q in ("", "0"):
                since = st.rv
                initial = [
                    json.dumps({"type": "ADDED", "object": o}, separators=(",", ":")).encode()
                    + b"\n"
                    for (ons, _), o in sorted(st.objects[res.plural].items())
                    if (not ns or ons == ns) and (not selector or selector.matches(o))
                ]
            else:
                initial = []
                try:
                    since = int(rv_q)
                except ValueError:
                    bad = ApiError(400, "BadRequest", f"invalid resource version {rv_q!r}")
                    yield json.dumps({"type": "ERROR", "object": bad.status()}).encode() + b"\n"
                    return
                if since > st.rv:
                    # a version this server never handed out (one of an earlier server, or
                    # from before an etcd restore): a real one (watch cache on) answers HTTP
                    # 200 and then nothing, no event and no bookmark, until timeoutSeconds
                    # (docs/real-kube-apiserver.md); a list NotOlderThan it says 504
                    while time.monotonic() < deadline and self._watch_gen == gen:
                        st.lock.wait(min(0.2, max(0.0, deadline - time.monotonic())))
                    return
                if since < st.compacted:
                    err = ApiError(
                        410, "Expired", f"too old resource version: {since} ({st.compacted})"
                    ).status()
                    yield json.dumps({"type": "ERROR", "object": err}).encode() + b"\n"
                    return
        yield from initial
        next_bookmark = time.monotonic() + interval
        while True:
            out: list[bytes] = []
            with st.lock:
                while True:
                    if self._watch_gen != gen:
                        return
                    if wid in self._stalled:
                        # silently stalled: not even timeoutSeconds ends it, only a cut
                        st.lock.wait(0.2)
                        continue
                    now = time.monotonic()
                    if now >= deadline:
                        return
                    if st.history and st.history[-1][0] > since:
                        break
                    if bookmarks and now >= next_bookmark:
                        break
                    st.lock.wait(
                        min(deadline, next_bookmark) - now if bookmarks else deadline - now
                    )
                if since < st.compacted:
                    err = ApiError(410, "Expired", f"too old resource version: {since}").status()
                    yield json.dumps({"type": "ERROR", "object": err}).encode() + b"\n"
                    return
                hist = st.history
                i = bisect.bisect_right(hist, since, key=lambda h: h[0])
                for rv, plural, ons, line, obj in hist[i:]:
                    if (
                        plural == res.plural
                        and (not ns or ons == ns)
                        and (not selector or selector.matches(obj))
                    ):
                        out.append(line)
                    since = rv
                if bookmarks and time.monotonic() >= next_bookmark:
                    bm = {
                        "type": "BOOKMARK",
                        "object": {
                            "kind": res.kind,
                            "apiVersion": res.group_version,
                            "metadata": {
                                "resourceVersion": str(st.rv),
                                "annotations": {"k8s.io/initial-events-end": "true"},
                            },
                        },
                    }
                    since = st.rv
                    out.append(json.dumps(bm).encode() + b"\n")
                    next_bookmark = (
                        time.monotonic() + interval
                        if self.bookmarks == "every-second"
                        else deadline
                    )
            if out:
                yield b"".join(out)


def _route(path: str, served: dict[str, set[str]]) -> tuple[Resource, str, str, str, str]:
    """(resource, namespace, name, subresource, group/version asked for) of an API path;
    raises 404 for a path, or a version, the server does not serve."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group_version, rest = "v1", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group_version, rest = f"{parts[1]}/{parts[2]}", parts[3:]
    else:
        group_version, rest = "", []
    plurals = served.get(group_version, set())
    ns = ""
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] in plurals:
        ns, rest = rest[1], rest[2:]
    if not rest or rest[0] not in plurals:
        raise ApiError(
            404, "NotFound", f"the server could not find the requested resource ({path})"
        )
    res = RESOURCES[rest[0]]
    name = rest[1] if len(rest) > 1 else ""
    sub = rest[2] if len(rest) > 2 else ""
    return res, ns, name, sub, group_version


def _version_rank(version: str) -> tuple[int, int, int]:
    """Kubernetes' version priority: GA before beta before alpha, then higher numbers first."""
    match = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", version)
    if match is None:
        return (-1, 0, 0)
    major, stage, minor = match.groups()
    return ({"alpha": 0, "beta": 1}.get(stage or "", 2), int(major), int(minor or 0))


def discovery(served: dict[str, set[str]], path: str) -> Obj | None:
    """The discovery document at ``path`` (/api, /apis, /apis/<group>[/<version>]), or None."""
    parts = [p for p in path.split("/") if p]
    groups: dict[str, list[str]] = {}
    for group_version in served:
        if "/" in group_version:
            group, version = group_version.split("/")
            groups.setdefault(group, []).append(version)
    for versions in groups.values():
        versions.sort(key=_version_rank, reverse=True)

    def group_doc(group: str) -> Obj:
        versions = [{"groupVersion": f"{group}/{v}", "version": v} for v in groups[group]]
        return {"name": group, "versions": versions, "preferredVersion": versions[0]}

    if parts == ["api"]:
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
    if parts == ["apis"]:
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [group_doc(g) for g in sorted(groups)],
        }
    if len(parts) == 2 and parts[0] == "apis" and parts[1] in groups:
        return {"kind": "APIGroup", "apiVersion": "v1", **group_doc(parts[1])}
    group_version = "v1" if parts == ["api", "v1"] else "/".join(parts[1:3])
    if (parts == ["api", "v1"] or (len(parts) == 3 and parts[0] == "apis")) and (
        group_version in served
    ):
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": group_version,
            "resources": [
                {
                    "name": plural,
                    "singularName": RESOURCES[plural].kind.lower(),
                    "namespaced": RESOURCES[plural].namespaced,
                    "kind": RESOURCES[plural].kind,
                    "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
                }
                for plural in sorted(served[group_version])
            ],
        }
    return None


def as_version(obj: Obj, group_version: str) -> Obj:
    """``obj`` as answered at ``group_version`` (stored once, served in every version)."""
    if obj.get("kind") != "Status" and obj.get("apiVersion", group_version) != group_version:
        return {**obj, "apiVersion": group_version}
    return obj


class _Handler(BaseHTTPRequestHandler):
    api: ApiServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        with self.api.state.lock:
            self.api._conns.add(self.connection)

    def finish(self) -> None:
        with self.api.state.lock:
            self.api._conns.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def _send_json(self, code: int, body: Obj) -> None:
        self._send_bytes(code, json.dumps(body, separators=(",", ":")).encode())

    def _send_bytes(self, code: int, data: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        try:
            return json.loads(raw) if raw else {}
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"invalid JSON body: {exc}") from exc

    def _handle(self, method: str) -> None:
        try:
            split = urlsplit(self.path)
            every = parse_qs(split.query)
            query = {k: v[-1] for k, v in every.items()}
            if split.path in ("/version", "/version/"):
                self._send_json(200, {"major": "1", "minor": "31", "gitVersion": "v1.31.0-sim"})
                return
            if split.path in ("/healthz", "/readyz", "/livez"):
                self._send_json(200, {"status": "ok"})
                return
            if method == "GET":
                doc = discovery(self.api.served, split.path)
                if doc is not None:
                    self._send_json(200, doc)
                    return
            res, ns, name, sub, gv = _route(split.path, self.api.served)
            key = f"{method} {res.plural}" + (" dryRun" if "dryRun" in every else "")
            self.api.requests[key] = self.api.requests.get(key, 0) + 1
            watch = query.get("watch") in ("1", "true", "True")
            verbs = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
            verb = verbs.get(method, "watch" if watch else ("get" if name else "list"))
            group = res.group_version.rpartition("/")[0]
            self.api.calls.add((group, f"{res.plural}/{sub}" if sub else res.plural, verb))
            self.api.check_allowed(res, verb, ns)
            self.api._http.sub = sub if method != "GET" else None  # writes are judged
            if method == "GET" and not name:
                if watch:
                    Selector.parse(res, query)  # a bad selector is a 400, not a broken stream
                    self._watch(res, ns, query, gv)
                else:
                    self._send_bytes(200, self.api.list_json(res, ns, query, gv))
            elif method == "GET":
                self._send_json(200, as_version(self.api.read(res, ns, name), gv))
            elif method == "POST" and res.plural == "pods" and name and sub == "eviction":
                self._send_json(201, self.api.evict(ns, name, self._body(), every.get("dryRun")))
            elif method == "POST":
                self._send_json(201, as_version(self.api.create(res, ns, self._body()), gv))
            elif method == "PUT":
                body = self.api.replace(res, ns, name, self._body())
                self._send_json(200, as_version(body, gv))
            elif method == "PATCH":
                ctype = self.headers.get("Content-Type", "application/merge-patch+json")
                patch = self._body()  # read first: the connection carries the next request
                dry = check_dry_run(every.get("dryRun", []), "PatchOptions")
                body = self.api.patch(res, ns, name, patch, ctype, dry_run=dry)
                self._send_json(200, as_version(body, gv))
            elif method == "DELETE":
                self._body()
                self._send_json(200, as_version(self.api.delete(res, ns, name), gv))
            else:
                raise ApiError(405, "MethodNotAllowed", f"{method} is not supported")
        except ApiError as err:
            self._send_json(err.code, err.status())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _watch(self, res: Resource, ns: str, query: dict[str, str], group_version: str) -> None:
        while not self.api._watch_gate.wait(0.1):  # queued (queue_watches)
            pass
        wid, gen = self.api._register(self.connection)
        # a watcher that stops reading: the write blocks once the socket buffers are full, and
        # the server gives up on it (a real one: "Forcing watcher close due to unresponsiveness")
        self.connection.settimeout(self.api.unresponsive_after)
        unclean = "cut"
        try:
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            # this server closes the connection after a watch: say so, or a client may reuse
            # it for its next request before it sees the close
            self.send_header("Connection", "close")
            self.end_headers()
            for chunk in self.api.watch_lines(res, ns, query, wid, gen):
                if group_version != res.group_version:
                    chunk = _reversioned(chunk, group_version)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            if self.api._watch_gen == gen:  # a cut ends without the last chunk, like a reset
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
                unclean = ""
        except OSError as exc:
            unclean = f"write failed: {exc!r}"
        except BaseException as exc:
            unclean = f"server error: {exc!r}"
            raise
        finally:
            self.close_connection = True
            self.api._unregister(wid)
            if unclean:
                self.api.unclean_watch_ends.append((res.plural, unclean))

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")


class Driver:
    """Feeds a workload's events into the server in order, in a background thread.

    ``speed`` None replays as fast as possible; otherwise simulated seconds per wall second.
    ``until`` stops before the first event at or after that simulated time.

    ``clock`` (sim/clock.py) puts the watchers on the cluster's own clock: it is moved to each
    event's time before the event is applied. A watcher stamps some facts with the time it
    reads them (a namespace's labels, a node's deletion, a slice's devices): before the clock
    moves past such an event, ``settle()`` is called to wait until the watchers have read it.
    """

    #: kinds whose events a watcher dates by when it reads them, not by an object timestamp
    OBSERVED_KINDS = frozenset({"Namespace", "Node", "ResourceSlice"})

    def __init__(
        self,
        api: ApiServer,
        workload: Workload,
        speed: float | None = None,
        *,
        clock: SimClock | None = None,
        settle: Callable[[], object] | None = None,
    ):
        self.api, self.workload, self.speed = api, workload, speed
        self.clock, self.settle = clock, settle
        self._unsettled = False
        self.position = 0  # events applied so far
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def run(self, until: int | None = None) -> None:
        """Apply events synchronously (from where the last call stopped)."""
        wl = self.workload
        t0 = time.monotonic()
        first_at = wl.events[self.position].at if self.position < len(wl.events) else wl.start
        while self.position < len(wl.events) and not self._stop.is_set():
            ev = wl.events[self.position]
            if until is not None and ev.at >= until:
                return
            if self.speed:
                delay = t0 + (ev.at - first_at) / self.speed - time.monotonic()
                if delay > 0 and self._stop.wait(delay):
                    return
            if self.clock is not None and ev.at > self.clock.now:
                self.settled()
                self.clock.set(ev.at)
            self.api.apply(ev.type, ev.object)
            self._unsettled |= ev.object["kind"] in self.OBSERVED_KINDS
            self.position += 1

    def settled(self) -> None:
        """Wait (``settle``) until the watchers have read the events dated by observation."""
        if self._unsettled and self.settle is not None:
            self.settle()
        self._unsettled = False

    def start(self, until: int | None = None) -> Driver:
        def target() -> None:
            try:
                self.run(until)
            except BaseException as exc:  # surfaced by wait()
                self.error = exc

        self._thread = threading.Thread(target=target, daemon=True, name="workload-driver")
        self._thread.start()
        return self

    def wait(self, timeout: float | None = None) -> bool:
        """True once every event (up to ``until``) has been applied."""
        if self._thread is not None:
            self._thread.join(timeout)
            if self.error is not None:
                raise self.error
            return not self._thread.is_alive()
        return True

    def stop(self) -> None:
        self._stop.set()
        self.wait(5)

    @property
    def done(self) -> bool:
        return self.position >= len(self.workload.events)


def _reversioned(chunk: bytes, group_version: str) -> bytes:
    """Watch lines re-encoded with their objects at ``group_version``."""
    out = []
    for line in chunk.splitlines():
        event = json.loads(line)
        event["object"] = as_version(event["object"], group_version)
        out.append(json.dumps(event, separators=(",", ":")).encode() + b"\n")
    return b"".join(out)


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
