"""Real-size pods: dress a pod the way a real kube-apiserver 1.36 returns it.

A pod written by a test or the workload generator is about 1.5 kB of JSON; the same pod read
back from a real 1.36 server is about 4.7 kB (../shared/kube-apiserver.md): the server's
defaults, the projected service-account token volume mounted into every container,
``metadata.managedFields`` of three writers (the owner's controller, the scheduler, the
kubelet; about 1.7 kB), status conditions, host and pod IPs, container IDs and image digests.
The controller's cost per pod is its size, so the stand-in serves pods this size
(``ApiServer(realistic=True)``, the default) and the controller's benchmark measures them.

Pure: :func:`dress` reads the object and returns a new one; nothing here does I/O. It only
adds what the real server adds and never changes a field the accounting reads (requests and
limits, overhead, nodeName, phase, startTime, termination times, deletion, owners, claims),
so the accounting answers the same with and without it. Dressing a dressed pod changes
nothing (the stand-in dresses on every create, update and delete).

Field order follows the Go structs (``kind``, ``apiVersion``, ``metadata`` with ``name``,
``generateName``, ``namespace``, ``uid``, ``resourceVersion`` first), as the real server
encodes them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from gpuquota.quota.accounting.rules.pods import qos_class

Obj = dict[str, Any]

SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
# metadata keys in the order of ObjectMeta's fields
_META_ORDER = (
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
)
_TOLERATIONS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
_RUNNING = frozenset({"Running", "Succeeded", "Failed"})


def _digest(*parts: str) -> str:
    """A stable 64-hex digest (container IDs, image digests): the same pod dresses the same."""
    return hashlib.sha256("/".join(parts).encode()).hexdigest()


def _ip(seed: str, first: int) -> str:
    d = hashlib.blake2b(seed.encode(), digest_size=3).digest()
    return f"{first}.{d[0]}.{d[1]}.{d[2] or 1}"


def _ordered(d: Mapping[str, Any], order: tuple[str, ...]) -> Obj:
    """``d`` with the keys of ``order`` first (in that order), the rest after, as they were."""
    out = {k: d[k] for k in order if k in d}
    out.update((k, v) for k, v in d.items() if k not in out)
    return out


def fields_of(
    value: Any, list_keys: Mapping[str, str] | None = None, skip: frozenset[str] = frozenset()
) -> Any:
    """The managedFields ``fieldsV1`` set owning every leaf of ``value``: objects become
    ``{".": {}, "f:<key>": ...}``, lists of named items ``{"k:{\\"name\\":\\"x\\"}": ...}``
    (the key the server merges them by), anything else ``{}``; keys sorted, as the server
    writes them. Keys in ``skip`` are left out at every depth (fields another writer owns)."""
    keys = list_keys or {}
    if isinstance(value, dict):
        return {
            f"f:{k}": _field_entry(k, value[k], keys, skip) for k in sorted(value) if k not in skip
        }
    return {}


def _field_entry(key: str, value: Any, keys: Mapping[str, str], skip: frozenset[str]) -> Any:
    if key in _ATOMIC:
        return {}
    if isinstance(value, dict):
        return {".": {}, **fields_of(value, keys, skip)} if value else {}
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        merge_key = keys.get(key, "name")
        out: Obj = {}
        for item in value:
            k = item.get(merge_key)
            if isinstance(k, str | int):
                quoted = f'"{k}"' if isinstance(k, str) else str(k)
                out[f'k:{{"{merge_key}":{quoted}}}'] = {".": {}, **fields_of(item, keys, skip)}
        return out
    return {}


# the keys real servers merge these lists by (strategic merge patch "patchMergeKey")
_MERGE_KEYS = {
    "conditions": "type",
    "tolerations": "key",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "env": "name",
    "ownerReferences": "uid",
    "hostIPs": "ip",
    "podIPs": "ip",
}
# set by admission plugins (service account, default tolerations, priority) or the binding:
# not in the writer's field set
_ADMITTED = frozenset(
    {
        "nodeName",
        "volumes",
        "volumeMounts",
        "tolerations",
        "priority",
        "preemptionPolicy",
        "serviceAccount",
    }
)
# lists the server replaces whole (atomic): their field set is the list itself
_ATOMIC = frozenset({"containerStatuses", "initContainerStatuses", "sources", "hostIPs"})


def _entry(manager: str, time: str, fields: Obj, subresource: str | None = None) -> Obj:
    entry: Obj = {"manager": manager, "operation": "Update", "apiVersion": "v1"}
    if time:  # unknown for an object written without creationTimestamp (direct apply)
        entry["time"] = time
    entry |= {"fieldsType": "FieldsV1", "fieldsV1": fields}
    if subresource:
        entry["subresource"] = subresource
    return entry


def _sa_volume_name(uid: str) -> str:
    # the real server's suffix is random (generateName); derived from the UID here so a pod
    # dresses the same however often it is written
    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    n = int(_digest(uid)[:10], 16)
    suffix = ""
    for _ in range(5):
        n, r = divmod(n, len(alphabet))
        suffix += alphabet[r]
    return f"kube-api-access-{suffix}"


def _dress_container(c: Mapping[str, Any], volume: str, sa: bool) -> Obj:
    c = dict(c)
    c.setdefault("resources", {})
    if sa:
        mounts = list(c.get("volumeMounts") or [])
        if not any(isinstance(m, dict) and m.get("mountPath") == SA_MOUNT for m in mounts):
            mounts.append({"name": volume, "readOnly": True, "mountPath": SA_MOUNT})
        c["volumeMounts"] = mounts
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    c.setdefault("imagePullPolicy", "IfNotPresent")
    return c


def _dress_spec(spec: Mapping[str, Any], uid: str) -> Obj:
    out = dict(spec)
    volume = _sa_volume_name(uid)
    sa = out.get("automountServiceAccountToken") is not False
    if sa:
        volumes = list(out.get("volumes") or [])
        if not any(
            isinstance(v, dict) and str(v.get("name", "")).startswith("kube-api-access-")
            for v in volumes
        ):
            volumes.append(
                {
                    "name": volume,
                    "projected": {
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {
                                "configMap": {
                                    "name": "kube-root-ca.crt",
                                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                                }
                            },
                            {
                                "downwardAPI": {
                                    "items": [
                                        {
                                            "path": "namespace",
                                            "fieldRef": {
                                                "apiVersion": "v1",
                                                "fieldPath": "metadata.namespace",
                                            },
                                        }
                                    ]
                                }
                            },
                        ],
                        "defaultMode": 420,
                    },
                }
            )
        out["volumes"] = volumes
    for key in ("initContainers", "containers"):
        if isinstance(out.get(key), list):
            out[key] = [
                _dress_container(c, volume, sa) if isinstance(c, dict) else c for c in out[key]
            ]
    out.setdefault("restartPolicy", "Always")
    out.setdefault("terminationGracePeriodSeconds", 30)
    out.setdefault("dnsPolicy", "ClusterFirst")
    out.setdefault("serviceAccountName", "default")
    out.setdefault("serviceAccount", out["serviceAccountName"])
    out.setdefault("securityContext", {})
    out.setdefault("schedulerName", "default-scheduler")
    tolerations = list(out.get("tolerations") or [])
    for key in _TOLERATIONS:
        if not any(isinstance(t, dict) and t.get("key") == key for t in tolerations):
            tolerations.append(
                {
                    "key": key,
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                }
            )
    out["tolerations"] = tolerations
    out.setdefault("priority", 0)
    out.setdefault("enableServiceLinks", True)
    out.setdefault("preemptionPolicy", "PreemptLowerPriority")
    # volumes first, as in the Go struct
    return _ordered(out, ("volumes", "initContainers", "containers"))


def _conditions(status: Mapping[str, Any], scheduled: bool, since: str) -> list[Any]:
    phase = status.get("phase")
    have = list(status.get("conditions") or [])
    types = {c.get("type") for c in have if isinstance(c, dict)}
    if phase in _RUNNING:
        ready = "True" if phase == "Running" else "False"
        wanted = [
            ("PodReadyToStartContainers", "True" if phase == "Running" else "False"),
            ("Initialized", "True"),
            ("Ready", ready),
            ("ContainersReady", ready),
            ("PodScheduled", "True"),
        ]
    elif scheduled:
        wanted = [("PodScheduled", "True")]
    else:
        wanted = []
    for kind, value in wanted:
        if kind not in types:
            cond: Obj = {
                "type": kind,
                "status": value,
                "lastProbeTime": None,
                "lastTransitionTime": since or None,
            }
            if value == "False" and phase in ("Succeeded", "Failed"):
                cond["reason"] = "PodCompleted"
            have.append(cond)
    return have


def _dress_status(pod: Mapping[str, Any], spec: Mapping[str, Any], volume: str) -> Obj:
    status = dict(pod.get("status") or {})
    meta = pod.get("metadata") or {}
    uid = str(meta.get("uid", ""))
    node = spec.get("nodeName")
    since = str(status.get("startTime") or meta.get("creationTimestamp") or "")
    phase = status.get("phase")
    status["conditions"] = _conditions(status, bool(node), since)
    if node:
        host = _ip(str(node), 192)
        status.setdefault("hostIP", host)
        status.setdefault("hostIPs", [{"ip": status["hostIP"]}])
    if node and phase in _RUNNING:
        ip = _ip(uid, 10)
        status.setdefault("podIP", ip)
        status.setdefault("podIPs", [{"ip": status["podIP"]}])
    if phase == "Running" and not status.get("containerStatuses"):
        started = status.get("startTime")
        status["containerStatuses"] = [
            {
                "name": c.get("name"),
                "state": {"running": {"startedAt": started}},
                "lastState": {},
                "ready": True,
                "restartCount": 0,
                "image": c.get("image"),
                "started": True,
            }
            for c in spec.get("containers") or []
            if isinstance(c, dict)
        ]
    images = {
        c.get("name"): c
        for key in ("initContainers", "containers")
        for c in spec.get(key) or []
        if isinstance(c, dict)
    }
    for key in ("initContainerStatuses", "containerStatuses"):
        if isinstance(status.get(key), list):
            status[key] = [
                _dress_container_status(cs, images.get(cs.get("name")) or {}, uid, volume)
                if isinstance(cs, dict)
                else cs
                for cs in status[key]
            ]
    status.setdefault("qosClass", qos_class(pod))
    return _ordered(
        status,
        (
            "observedGeneration",
            "phase",
            "conditions",
            "message",
            "reason",
            "hostIP",
            "hostIPs",
            "podIP",
            "podIPs",
            "startTime",
            "initContainerStatuses",
            "containerStatuses",
            "qosClass",
        ),
    )


def _dress_container_status(
    cs: Mapping[str, Any], c: Mapping[str, Any], uid: str, volume: str
) -> Obj:
    out = dict(cs)
    name = str(out.get("name", ""))
    image = str(out.get("image") or c.get("image") or "")
    out.setdefault("image", image)
    repo = image.rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image
    state = out.get("state")
    if isinstance(state, dict) and ("running" in state or "terminated" in state):
        if not out.get("imageID"):  # "" while the image is pulled
            out["imageID"] = f"{repo}@sha256:{_digest(image)}"
        out.setdefault("containerID", f"containerd://{_digest(uid, name)}")
        out.setdefault("started", "running" in state)
    out.setdefault("lastState", {})
    out.setdefault("ready", False)
    out.setdefault("restartCount", 0)
    out.setdefault(
        "volumeMounts",
        [
            {
                "name": volume,
                "mountPath": SA_MOUNT,
                "readOnly": True,
                "recursiveReadOnly": "Disabled",
            }
        ],
    )
    return out


def _managed_fields(pod: Obj) -> list[Obj]:
    meta, spec, status = pod["metadata"], pod["spec"], pod["status"]
    created = str(meta.get("creationTimestamp") or "")
    started = str(status.get("startTime") or created)
    owner_meta = {k: meta[k] for k in ("generateName", "labels", "ownerReferences") if k in meta}
    owner = meta.get("ownerReferences") or [{}]
    manager = "kube-controller-manager" if owner[0].get("kind") else "kubectl-create"
    entries = [
        _entry(
            manager,
            created,
            {
                "f:metadata": fields_of(owner_meta, _MERGE_KEYS),
                "f:spec": fields_of(spec, _MERGE_KEYS, _ADMITTED),
            },
        )
    ]
    scheduled = [
        c
        for c in status.get("conditions") or []
        if isinstance(c, dict) and c.get("type") == "PodScheduled"
    ]
    if scheduled:
        entries.append(
            _entry(
                "kube-scheduler",
                created,
                {
                    "f:status": {
                        "f:conditions": fields_of({"conditions": scheduled}, _MERGE_KEYS)[
                            "f:conditions"
                        ]
                    }
                },
                "status",
            )
        )
    kubelet = {k: v for k, v in status.items() if k not in ("qosClass",) and k != "conditions"}
    kubelet["conditions"] = [
        c
        for c in status.get("conditions") or []
        if isinstance(c, dict) and c.get("type") != "PodScheduled"
    ]
    if spec.get("nodeName") and status.get("phase"):
        entries.append(
            _entry("kubelet", started, {"f:status": fields_of(kubelet, _MERGE_KEYS)}, "status")
        )
    return entries


def dress(pod: Mapping[str, Any]) -> Obj:
    """``pod`` as a real 1.36 API server returns it (a new object; ``pod`` is not changed)."""
    meta = dict(pod.get("metadata") or {})
    uid = str(meta.get("uid", ""))
    spec = _dress_spec(pod.get("spec") or {}, uid)
    volume = next(
        (
            str(v["name"])
            for v in spec.get("volumes") or []
            if isinstance(v, dict) and str(v.get("name", "")).startswith("kube-api-access-")
        ),
        _sa_volume_name(uid),
    )
    out: Obj = {"kind": pod.get("kind", "Pod"), "apiVersion": pod.get("apiVersion", "v1")}
    meta.setdefault("resourceVersion", "")  # its place in the order; the server sets it
    meta.setdefault("generation", 1)
    out["metadata"] = meta
    out["spec"] = spec
    out["status"] = _dress_status({**pod, "spec": spec, "metadata": meta}, spec, volume)
    out.update((k, v) for k, v in pod.items() if k not in out)
    if not meta.get("managedFields"):
        meta["managedFields"] = _managed_fields(out)
    out["metadata"] = _ordered(meta, _META_ORDER)
    return out
