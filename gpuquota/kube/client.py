"""Kubernetes API access for the controller: config loading, raw paged lists, raw watch lines.

Objects stay plain dicts: requests go through the official client's ApiClient in the
controller, or gpuquota/kube/rest.py's RestApi in the node agent (which must not load the
official client's memory); either way its configuration, authentication, TLS and connection
pool, with the response left unread
(preload off), and the bytes are parsed with json.loads. This skips the generated API classes
and their model deserialisation: importing CoreV1Api alone builds hundreds of pydantic models
(seconds of start-up), and turning a large list into models is far slower and larger than
plain dicts. List items get their ``kind`` back (the API server leaves it out of list items).

A raw pre-filter per kind (``raw_filters``) skips decoding the objects a caller will ignore:
given an object's JSON bytes it answers whether the caller may want it. A list page is split
into its items on the bytes (items as the real server encodes them, see
:func:`filtered_page`) and only the wanted ones are decoded; a watch event whose object is
not wanted becomes a stub holding only its type, kind and the metadata the watch needs
(name, namespace, uid, resourceVersion: :func:`stub_event`). Anything not in the expected
shape is decoded whole, so the filter only ever saves work, never loses an object. On a real
cluster (4.7 kB pods, 3 % with GPUs) this is most of the controller's CPU at start-up
(docs/benchmarks.md).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from urllib3 import BaseHTTPResponse

from gpuquota.kube.rest import KubeConfigError as KubeConfigError  # re-exported: one class
from gpuquota.kube.rest import RestApi, keepalive_options

if TYPE_CHECKING:  # the official client is imported where it is used (the controller)
    from kubernetes import client

Obj = dict[str, Any]
# an object's JSON -> whether the caller may want it (False: it certainly does not)
RawFilter = Callable[[bytes], bool]

# what the rules never read and real objects carry in bulk: dropped on arrival
_DROP_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)
# kinds whose managedFields are kept (without their field sets): a quota's samples are timed
# by when each manager last wrote it
_MANAGER_TIMES = frozenset({"ResourceQuota"})


WATCH_READ_BYTES = 1 << 16
# the content types of a PATCH (Kube.call)
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"

# Go's encoding of a list: ListMeta before the items, each item's ObjectMeta first (list items
# carry no kind/apiVersion), its name first
_ITEMS = b'"items":['
_ITEM_START = b'{"metadata":{"name":"'
_ITEM_SEP = b"}," + _ITEM_START
# a watch event as Go encodes it: type, then the object's TypeMeta, then ObjectMeta's fields
# in struct order up to resourceVersion
_EVENT_HEAD = re.compile(
    rb'\{"type":"(ADDED|MODIFIED|DELETED)","object":\{"kind":"([A-Za-z]+)",'
    rb'"apiVersion":"([^"\\]*)","metadata":\{"name":"([^"\\]*)",(?:"generateName":"[^"\\]*",)?'
    rb'(?:"namespace":"([^"\\]*)",)?"uid":"([^"\\]*)","resourceVersion":"([^"\\]*)"'
)


def filtered_page(data: bytes, wanted: RawFilter, cut_managed_fields: bool = True) -> Obj | None:
    """A list answer with only the items ``wanted`` accepts decoded, or None when ``data`` is
    not in the shape the real server encodes (then decode it whole).

    The items are found by splitting on ``},{"metadata":{"name":"``, which only item
    boundaries contain in the kinds filtered here (no Pod field is a list of objects whose
    first field is ``metadata``; inside a string the quotes would be escaped). A split that
    is wrong anyway fails to decode or gives another item count than was kept: then None.
    Kept items lose their managedFields first (:func:`without_managed_fields`) unless
    ``cut_managed_fields`` is False."""
    data = data.rstrip()  # the real server ends its answer with a newline
    at = data.find(_ITEMS)
    if at < 0 or not data.endswith(b"]}"):
        return None
    head, body = data[: at + len(_ITEMS)], data[at + len(_ITEMS) : -2]
    if body and not body.startswith(_ITEM_START):
        return None
    kept: list[bytes] = []
    if body:
        parts = body.split(_ITEM_SEP)
        last = len(parts) - 1
        for i, part in enumerate(parts):
            if not wanted(part):
                continue
            item = part if i == 0 else _ITEM_START + part
            item = item if i == last else item + b"}"
            kept.append(without_managed_fields(item) if cut_managed_fields else item)
    try:
        page = json.loads(head + b",".join(kept) + b"]}")
    except ValueError:
        return None
    if not isinstance(page, dict) or len(page.get("items") or []) != len(kept):
        return None
    return page


_MANAGED_FIELDS = b',"managedFields":['
_AFTER_METADATA = b'},"spec":'


def without_managed_fields(raw: bytes) -> bytes:
    """``raw`` with its ``metadata.managedFields`` cut out before it is decoded (a third of a
    real pod's bytes, which :func:`slim` would drop anyway), or ``raw`` itself when they are
    not where Go puts them: the last field of metadata, right before spec.

    The cut ends at the first ``]`` after ``"managedFields":[`` and only when ``},"spec":``
    follows it: managedFields entries hold no lists (fieldsV1 is objects only), and a ``]``
    inside a string cannot be followed by those bytes (a quote in a string is escaped, and a
    closing quote cannot be followed by ``spec``), so that ``]`` closes managedFields."""
    start = raw.find(_MANAGED_FIELDS)
    if start < 0:
        return raw
    end = raw.find(b"]", start + len(_MANAGED_FIELDS))
    if end < 0 or not raw.startswith(_AFTER_METADATA, end + 1):
        return raw
    return raw[:start] + raw[end + 1 :]


def stub_event(line: bytes) -> Obj | None:
    """A watch event of an unwanted object, decoded only as far as its metadata's
    resourceVersion: its type, kind, apiVersion, name, namespace, uid and resourceVersion.
    None when the line is not in the shape the real server encodes (then decode it whole)."""
    m = _EVENT_HEAD.match(line)
    if m is None:
        return None
    etype, kind, api_version, name, namespace, uid, version = (
        (g or b"").decode() for g in m.groups()
    )
    meta = {"name": name, "uid": uid, "resourceVersion": version}
    if namespace:
        meta["namespace"] = namespace
    return {
        "type": etype,
        "object": {"kind": kind, "apiVersion": api_version, "metadata": meta},
    }


class ApiStatusError(RuntimeError):
    """The API server answered with an error status."""

    def __init__(self, status: int, reason: str, message: str):
        super().__init__(f"API server answered {status} {reason}: {message}")
        self.status = status


PATHS = {
    "Pod": "/api/v1/pods",
    "Node": "/api/v1/nodes",
    "Namespace": "/api/v1/namespaces",
    "ResourceQuota": "/api/v1/resourcequotas",
    # the exporter follows its node's slices (exporter/enrich/slicewatcher.py); v1beta2 (Kubernetes
    # 1.33) has the same shape
    "ResourceSlice": "/apis/resource.k8s.io/v1/resourceslices",
    "ResourceClaim": "/apis/resource.k8s.io/v1/resourceclaims",
    "DeviceClass": "/apis/resource.k8s.io/v1/deviceclasses",
    "ResourceSlice.v1beta2": "/apis/resource.k8s.io/v1beta2/resourceslices",
}


# resource.k8s.io versions the controller reads claims from, newest first
DRA_VERSIONS = ("v1", "v1beta2")


@dataclass(frozen=True)
class Timeouts:
    connect: float = 5.0
    read: float = 90.0  # each read of a list or a call
    watch: int = 300  # timeoutSeconds asked of the server for each watch
    # timeoutSeconds of the first watch resumed from a stored version: its clean end (without
    # 410 Gone) proves the kind current when no event or bookmark arrives before
    proof: int = 5

    def watch_read(self, timeout_seconds: int) -> float:
        """A watch's read timeout: a last resort comfortably above its timeoutSeconds, for a
        quiet watch is normal (no event, no bookmark for minutes) and the server ends it
        then; a dead connection is found by TCP keepalive before."""
        return timeout_seconds + max(2.0, timeout_seconds / 10)


# TCP keepalive on every API connection: an idle watch is probed after 30 s, and a dead peer
# is dropped after 3 unanswered probes 10 s apart (client-go probes after 30 s too)
def load(kubeconfig: str | None, context: str | None = None) -> client.ApiClient:
    """An ApiClient from ``kubeconfig``, else in-cluster, else $KUBECONFIG / ~/.kube/config.
    (gpu-exporter uses gpuquota.kube.rest.load instead: the same calls without the official
    client's memory.)"""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    try:
        if kubeconfig:
            if not Path(kubeconfig).exists():
                raise KubeConfigError(f"kubeconfig {kubeconfig}: no such file")
            cfg = client.Configuration()
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, context=context, client_configuration=cfg
            )
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            cfg = client.Configuration()
            config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        else:
            cfg = client.Configuration()
            config.load_kube_config(context=context, client_configuration=cfg)  # type: ignore[no-untyped-call]
    except KubeConfigError:
        raise
    except (ConfigException, ValueError, TypeError, KeyError, AttributeError, OSError) as exc:
        where = kubeconfig or "in-cluster/default kubeconfig"
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise KubeConfigError(f"kubeconfig {where}: {msg}") from None
    except Exception as exc:  # yaml errors and the like: still one clear line
        where = kubeconfig or "default kubeconfig"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise KubeConfigError(f"kubeconfig {where}: {first}") from None
    # the watch loops retry with their own back-off; urllib3's silent retries would only hide
    # the outage from them
    cfg.retries = 0
    # a watch that stays silent for minutes is normal: a dead connection is found by TCP
    cfg.socket_options = keepalive_options()
    # the Lease lock of kubernetes.leaderelection uses the default configuration
    client.Configuration.set_default(cfg)
    return client.ApiClient(cfg)


def slim(obj: Obj, kind: str) -> Obj:
    """Give a list item its kind back and drop bulky fields the rules never read."""
    obj.setdefault("kind", kind)
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        fields = meta.pop("managedFields", None)
        if kind in _MANAGER_TIMES and isinstance(fields, list):
            # keep when each manager last wrote it (the quota sample's time), not the field sets
            meta["managedFields"] = [
                {k: v for k, v in entry.items() if k != "fieldsV1"}
                for entry in fields
                if isinstance(entry, dict)
            ]
        ann = meta.get("annotations")
        if isinstance(ann, dict):
            for key in _DROP_ANNOTATIONS:
                ann.pop(key, None)
    return obj


class Kube:
    """Raw list and watch of the kinds the controller follows."""

    KINDS = ("Node", "Namespace", "ResourceQuota", "Pod")
    # Dynamic Resource Allocation (resource.k8s.io/v1, Kubernetes 1.34+): watched where the
    # cluster serves them and RBAC allows, before the pods (slices before the claims)
    DRA_KINDS = ("DeviceClass", "ResourceSlice", "ResourceClaim")

    def __init__(
        self,
        api: client.ApiClient | RestApi,
        timeouts: Timeouts = Timeouts(),
        page_size: int = 500,
        field_selectors: dict[str, str] | None = None,
        raw_filters: Mapping[str, RawFilter] | None = None,
    ):
        self.api = api
        self.timeouts = timeouts
        self.page_size = page_size
        # kind -> fieldSelector for its lists and watches (e.g. slices of one node)
        self.field_selectors = dict(field_selectors or {})
        self.paths = dict(PATHS)  # the DRA kinds' version is chosen by dra_unavailable()
        # kind -> which objects are worth decoding (module docstring)
        self.raw_filters = dict(raw_filters or {})

    @property
    def host(self) -> str:
        return str(self.api.configuration.host)

    def version(self) -> str:
        """The API server's gitVersion (GET /version): proves it can be reached."""
        resp = self._get("", [], path="/version")
        try:
            return str(json.loads(resp.data).get("gitVersion", "?"))
        finally:
            resp.release_conn()

    def dra_unavailable(self) -> str | None:
        """Why the DRA kinds cannot be watched (not served, forbidden), None when they can:
        one small list of each, at resource.k8s.io/v1 or else v1beta2 (Kubernetes 1.33 with
        DRA on: the same object shape), whose paths are then used."""
        for version in DRA_VERSIONS:
            paths = {kind: PATHS[kind].replace("/v1/", f"/{version}/") for kind in self.DRA_KINDS}
            try:
                for kind in self.DRA_KINDS:
                    self.call("GET", paths[kind], [("limit", "1")])
            except ApiStatusError as exc:
                if exc.status == 404:
                    continue
                if exc.status in (401, 403):
                    return (
                        f"listing {paths[kind]} is forbidden ({exc}): grant list, watch on "
                        "resourceclaims, resourceslices and deviceclasses"
                    )
                raise
            self.paths.update(paths)
            return None
        versions = ", ".join(DRA_VERSIONS)
        return f"the cluster serves no resource.k8s.io ResourceClaims ({versions})"

    def _get(
        self,
        kind: str,
        query: list[tuple[str, str]],
        path: str = "",
        read_timeout: float | None = None,
    ) -> BaseHTTPResponse:
        return self.request("GET", path or self.paths[kind], query, read_timeout=read_timeout)

    def request(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]] | None = None,
        body: Obj | None = None,
        content_type: str = "application/json",
        read_timeout: float | None = None,
    ) -> BaseHTTPResponse:
        """One raw call; the response unread (release it). Raises ApiStatusError on >= 400.
        ``content_type`` of a PATCH: application/merge-patch+json or
        application/strategic-merge-patch+json."""
        header_params = {"Accept": "application/json"} | (
            {"Content-Type": content_type} if body is not None else {}
        )
        timeout = (
            self.timeouts.connect,
            self.timeouts.read if read_timeout is None else read_timeout,
        )
        if isinstance(self.api, RestApi):
            raw = self.api.send(method, path, query or [], header_params, body, timeout)
            status, reason = raw.status, raw.reason
        else:
            method, url, headers, data, post = self.api.param_serialize(
                method,
                path,
                query_params=query or [],
                header_params=header_params,
                body=body,
                auth_settings=["BearerToken"],
            )
            resp = self.api.call_api(method, url, headers, data, post, _request_timeout=timeout)
            raw, status, reason = resp.response, resp.status, resp.reason
        if status >= 400:
            try:
                message = str(json.loads(raw.data).get("message", ""))
            except (ValueError, AttributeError):
                message = ""
            finally:
                raw.release_conn()
            raise ApiStatusError(status, str(reason), message)
        return raw

    def call(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]] | None = None,
        body: Obj | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        """One raw call, its JSON answer as a dict."""
        resp = self.request(method, path, query, body, content_type)
        try:
            answer = json.loads(resp.data) if resp.data else {}
        finally:
            resp.release_conn()
        return answer if isinstance(answer, dict) else {}

    def _selector(self, kind: str) -> list[tuple[str, str]]:
        selector = self.field_selectors.get(kind)
        return [("fieldSelector", selector)] if selector else []

    def reached(self, kind: str, version: str) -> bool:
        """Whether the server has handed out ``version`` of ``kind`` (one stored before an
        etcd restore may be ahead of it, and a real server answers a watch from it with
        silence until timeoutSeconds). Compared by the server, never here.

        First a consistent list (a watch cache serves one only once it caught up with etcd,
        so it no longer lags the versions handed out), then a one-item list NotOlderThan
        ``version``: answered from the watch cache, at once where it reached the version.
        "Too large resource version" there is not proof: a watch cache over an etcd without
        RequestWatchProgress (3.5) never catches up on a quiet kind and says it, after 3 s,
        even for versions the server handed out (docs/real-kube-apiserver.md). Only then a
        one-item list at exactly ``version``: that server sends it to etcd, which refuses a
        revision it has not reached ("Too large resource version" again: not reached) and
        serves, or has compacted (410), any other."""
        query = [("limit", "1"), *self._selector(kind)]
        self.call("GET", self.paths[kind], query)
        for match in ("NotOlderThan", "Exact"):
            try:
                self.call(
                    "GET",
                    self.paths[kind],
                    [*query, ("resourceVersion", version), ("resourceVersionMatch", match)],
                )
            except ApiStatusError as exc:
                if match == "Exact" and exc.status == 410:
                    return True  # compacted away: etcd had reached it
                if "too large resource version" not in str(exc).lower():
                    raise
            else:
                return True
        return False

    def list(self, kind: str, keep: Callable[[Obj], bool] | None = None) -> tuple[list[Obj], str]:
        """Every object of ``kind`` (paged, one consistent snapshot) and the list's version.

        ``keep`` filters each page as it arrives, so what it drops is never held all at once."""
        items: list[Obj] = []
        token: str | None = None
        version = ""
        while True:
            query = [("limit", str(self.page_size)), *self._selector(kind)]
            if token:
                query.append(("continue", token))
            resp = self._get(kind, query)
            wanted = self.raw_filters.get(kind)
            try:
                data = resp.data
            finally:
                resp.release_conn()
            page = filtered_page(data, wanted, kind not in _MANAGER_TIMES) if wanted else None
            if page is None:
                page = json.loads(data)
            del data
            meta = page.get("metadata") or {}
            version = str(meta.get("resourceVersion") or version)
            items.extend(
                o
                for o in (slim(o, kind) for o in page.get("items") or [])
                if keep is None or keep(o)
            )
            del page
            token = meta.get("continue") or None
            if not token:
                return items, version

    def watch(
        self,
        kind: str,
        resource_version: str,
        on_open: Callable[[], None] | None = None,
        timeout_seconds: int | None = None,
    ) -> Iterator[Obj]:
        """Watch events from ``resource_version`` as dicts, until the server ends the stream
        (at ``timeout_seconds``, default :attr:`Timeouts.watch`); ``on_open`` is called once
        the server accepted the watch.

        Raises urllib3's ProtocolError when the connection is cut (keepalive included), and
        its ReadTimeoutError only past the last-resort read timeout.
        """
        asked = self.timeouts.watch if timeout_seconds is None else timeout_seconds
        resp = self._get(
            kind,
            [
                ("watch", "true"),
                ("resourceVersion", resource_version),
                ("allowWatchBookmarks", "true"),
                ("timeoutSeconds", str(asked)),
                *self._selector(kind),
            ],
            read_timeout=self.timeouts.watch_read(asked),
        )
        if on_open is not None:
            on_open()
        wanted = self.raw_filters.get(kind)
        try:
            buf = b""
            # at most 64 KiB at a time: a server may send a backlog of thousands of events as
            # one HTTP chunk (the stand-in does), and reading it whole would hold hundreds of
            # MB of real-size pods at once
            for chunk in resp.stream(amt=WATCH_READ_BYTES, decode_content=False):
                # one chunk can hold thousands of lines: split once (slicing the rest of the
                # buffer line by line would be quadratic)
                lines = (buf + chunk).split(b"\n")
                buf = lines.pop()
                for line in lines:
                    if line.strip():
                        stub = None if wanted is None or wanted(line) else stub_event(line)
                        if stub is not None:
                            yield stub
                            continue
                        if kind not in _MANAGER_TIMES:
                            line = without_managed_fields(line)
                        event = json.loads(line)
                        obj = event.get("object")
                        if isinstance(obj, dict) and event.get("type") != "ERROR":
                            slim(obj, kind)
                        yield event
        finally:
            resp.close()
            resp.release_conn()
