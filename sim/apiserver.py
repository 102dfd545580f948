"""A kube-apiserver stand-in: the real kubernetes client talks to it over a real socket.

Serves, over HTTP/1.1 on 127.0.0.1, what the quota controller and its tests use:

* core/v1 pods, nodes, namespaces, resourcequotas, coordination.k8s.io/v1 leases and the
  Dynamic Resource Allocation kinds of resource.k8s.io (ResourceSlices, DeviceClasses,
  ResourceClaims, ResourceClaimTemplates, DeviceTaintRules; see "DRA versions" below): get,
  list (``resourceVersion``, ``limit``/``continue`` over a consistent snapshot), create,
  replace (409 Conflict on a stale ``metadata.resourceVersion``), patch (JSON merge patch and
  strategic merge patch, with ``conditions`` merged by ``type``), delete;
* watch (``?watch=1``): chunked JSON lines from ``resourceVersion``, synthetic ADDED events
  for a watch from "0"/"", ``allowWatchBookmarks`` -> BOOKMARK events, ``timeoutSeconds``
  ended by the server, and 410 Gone as an ERROR event (``reason: Expired``) when the requested
  version is older than the retained window (HTTP 410 for such a list);
* ``fieldSelector`` (``=``, ``==``, ``!=``) on the fields the real server indexes: every
  kind's ``metadata.name``/``metadata.namespace``, pods' ``spec.nodeName`` and
  ``status.phase``, ResourceSlices' ``spec.nodeName`` and ``spec.driver``; any other field is
  400 "field label not supported", as on a real server. ``labelSelector`` with equality
  terms (``k=v``, ``k!=v``, ``k``, ``!k``);
* discovery: ``/api``, ``/apis``, ``/apis/<group>`` and ``/apis/<group>/<version>``.

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
same port), :meth:`forbid` (answer 403 Forbidden for one resource, as missing RBAC does).

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
# fields a field selector may name, beyond metadata.name and metadata.namespace
SELECTABLE_FIELDS: dict[str, tuple[str, ...]] = {
    "pods": ("spec.nodeName", "status.phase"),
    "resourceslices": ("spec.nodeName", "spec.driver"),
}
BY_KIND = {r.kind: r for r in RESOURCES.values()}
# lists that a strategic merge patch merges by a key instead of replacing
MERGE_KEYS = {"conditions": "type", "containers": "name", "initContainers": "name"}


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def status(self) -> Obj:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }


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


class _State:
    """Objects, the event history and the watch bookkeeping, under one lock."""

    def __init__(self, window: int):
        self.lock = threading.Condition()
        self.rv = 100
        self.objects: dict[str, dict[tuple[str, str], Obj]] = {p: {} for p in RESOURCES}
        # (rv, plural, namespace, encoded line, object); the oldest are dropped beyond ``window``
        self.history: list[tuple[int, str, str, bytes, Obj]] = []
        self.window = window
        self.compacted = self.rv  # a watch from an older version than this gets 410
        self.snapshots: dict[str, tuple[int, list[Obj]]] = {}

    def next_rv(self) -> int:
        self.rv += 1
        return self.rv

    def record(self, plural: str, type_: str, obj: Obj) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        line = json.dumps({"type": type_, "object": obj}, separators=(",", ":")).encode() + b"\n"
        self.history.append((rv, plural, obj["metadata"].get("namespace", ""), line, obj))
        if len(self.history) > self.window * 2:
            drop = len(self.history) - self.window
            self.compacted = self.history[drop - 1][0]
            del self.history[:drop]
        self.lock.notify_all()


class ApiServer:
    """The stand-in; ``start()`` binds 127.0.0.1 on a free port (or ``port``)."""

    def __init__(
        self,
        *,
        window: int = 100_000,
        bookmark_interval: float = 1.0,
        port: int = 0,
        resource_versions: Sequence[str] = ("v1",),
        device_taint_rule_versions: Sequence[str] = ("v1",),
    ):
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
        self.state = _State(window)
        self.bookmark_interval = bookmark_interval
        self._port = port
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._watch_gen = 0  # bumped to cut every open watch
        self._stalled: set[int] = set()  # watch ids told to go silent
        self._watch_ids = 0
        self._watch_conns: dict[int, socket.socket] = {}
        self._conns: set[socket.socket] = set()  # every open connection, for refuse_for
        self._refusing = threading.Lock()
        self.requests: dict[str, int] = {}  # "GET pods" -> count, for tests
        # (API group, resource[/subresource], RBAC verb) of every request: what a role needs
        self.calls: set[tuple[str, str, str]] = set()
        self.active_watches = 0

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
        return self

    def stop(self) -> None:
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
            new["metadata"]["resourceVersion"] = str(st.next_rv())
            if type_ == "DELETED":
                if store.pop((ns, name), None) is None:
                    raise ApiError(404, "NotFound", f'{res.plural} "{name}" not found')
                st.record(res.plural, "DELETED", new)
            else:
                existed = (ns, name) in store
                store[(ns, name)] = new
                st.record(res.plural, "MODIFIED" if existed else "ADDED", new)
            return new

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

    # -- HTTP operations (called by the handler)

    def list(self, res: Resource, ns: str, query: dict[str, str]) -> Obj:
        st = self.state
        selector = Selector.parse(res, query)
        limit = int(query.get("limit") or 0)
        token = query.get("continue")
        with st.lock:
            rv_q = query.get("resourceVersion", "")
            if rv_q and query.get("resourceVersionMatch") == "Exact" and int(rv_q) < st.compacted:
                raise ApiError(410, "Expired", f"too old resource version: {rv_q} ({st.compacted})")
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
        # list items carry no kind/apiVersion, as the real server sends them
        stripped = [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")} for o in page]
        return {
            "kind": f"{res.kind}List",
            "apiVersion": res.group_version,
            "metadata": meta,
            "items": stripped,
        }

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
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", rfc3339(int(time.time())))
            body["kind"], body["apiVersion"] = res.kind, res.group_version
            _defaults(res, body)
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
            return self.apply("MODIFIED", body)

    def patch(self, res: Resource, ns: str, name: str, body: Any, content_type: str) -> Obj:
        with self.state.lock:
            cur = self.state.objects[res.plural].get((ns, name))
            if cur is None:
                raise ApiError(404, "NotFound", f'{res.plural} "{name}" not found')
            if "json-patch" in content_type:
                raise ApiError(
                    415, "UnsupportedMediaType", "json-patch is not supported by the stand-in"
                )
            new = merge_patch(cur, body, strategic="strategic" in content_type)
            new["metadata"]["name"], new["metadata"]["uid"] = name, cur["metadata"]["uid"]
            return self.apply("MODIFIED", new)

    def delete(self, res: Resource, ns: str, name: str) -> Obj:
        with self.state.lock:
            cur = self.state.objects[res.plural].get((ns, name))
            if cur is None:
                raise ApiError(404, "NotFound", f'{res.plural} "{name}" not found')
            gone = copy.deepcopy(cur)
            gone["metadata"].setdefault("deletionTimestamp", rfc3339(int(time.time())))
            gone["metadata"].setdefault("deletionGracePeriodSeconds", 0)
            if res.plural == "pods" and cur.get("status", {}).get("phase") not in _TERMINAL:
                self._charge_quotas(ns, name, cur, -1)  # the quota controller's recount
            return self.apply("DELETED", gone)

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
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1", "True")
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
                since = int(rv_q)
                initial = []
                if since < st.compacted:
                    err = ApiError(
                        410, "Expired", f"too old resource version: {since} ({st.compacted})"
                    ).status()
                    yield json.dumps({"type": "ERROR", "object": err}).encode() + b"\n"
                    return
        yield from initial
        next_bookmark = time.monotonic() + self.bookmark_interval
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
                    next_bookmark = time.monotonic() + self.bookmark_interval
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
        data = json.dumps(body, separators=(",", ":")).encode()
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
            query = {k: v[-1] for k, v in parse_qs(split.query).items()}
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
            key = f"{method} {res.plural}"
            self.api.requests[key] = self.api.requests.get(key, 0) + 1
            watch = query.get("watch") in ("1", "true", "True")
            verbs = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
            verb = verbs.get(method, "watch" if watch else ("get" if name else "list"))
            group = res.group_version.rpartition("/")[0]
            self.api.calls.add((group, f"{res.plural}/{sub}" if sub else res.plural, verb))
            self.api.check_allowed(res, verb, ns)
            if method == "GET" and not name:
                if watch:
                    Selector.parse(res, query)  # a bad selector is a 400, not a broken stream
                    self._watch(res, ns, query, gv)
                else:
                    self._send_json(200, as_version(self.api.list(res, ns, query), gv))
            elif method == "GET":
                self._send_json(200, as_version(self.api.read(res, ns, name), gv))
            elif method == "POST":
                self._send_json(201, as_version(self.api.create(res, ns, self._body()), gv))
            elif method == "PUT":
                body = self.api.replace(res, ns, name, self._body())
                self._send_json(200, as_version(body, gv))
            elif method == "PATCH":
                ctype = self.headers.get("Content-Type", "application/merge-patch+json")
                body = self.api.patch(res, ns, name, self._body(), ctype)
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
        wid, gen = self.api._register(self.connection)
        try:
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for chunk in self.api.watch_lines(res, ns, query, wid, gen):
                if group_version != res.group_version:
                    chunk = _reversioned(chunk, group_version)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            if self.api._watch_gen == gen:  # a cut ends without the last chunk, like a reset
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
        except OSError:
            pass
        finally:
            self.close_connection = True
            self.api._unregister(wid)

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
