"""Deterministic cluster workload generator: watch events plus the exact GPU-seconds they imply.

``generate(seed, hours)`` runs a small discrete-event simulation of a GPU cluster (nodes of
several GPU models, time-slicing and MIG, namespaces with labels, ResourceQuotas, pods
arriving, scheduled, running, finishing, failing, deleted, some never scheduled, names reused,
a node deleted under running pods) and returns a :class:`Workload`:

* ``events``: the ordered watch events, each ``WatchEvent(at, type, object)`` where ``at`` is
  the simulated time (unix seconds) the event is observed and ``object`` a plain dict exactly
  as the API server serves it (camelCase, ``kind``/``apiVersion``, ``metadata.uid``, a
  cluster-wide increasing ``metadata.resourceVersion``).
* ``truth``: what the generator itself decided about GPU binding, *not* derived from the
  objects and not using quota/accounting.py: one :class:`TruthInterval` per (pod UID,
  resource) with the effective request it built the pod spec from, the physical-GPU factor of
  the node it bound the pod to, and the seconds ``[start, end)`` it held the GPUs. This is the
  oracle for the accounting, the controller and the report tests.

``dra=True`` (``--dra``) adds Dynamic Resource Allocation: a node whose GPUs NVIDIA's DRA driver
hands out (its ResourceSlice, DeviceClasses), and a team whose pods get GPUs and MIG devices
through ResourceClaims: claims from templates, a claim shared by three pods (overlapping, then
after a gap), MIG devices, a consumable-capacity share, an adminAccess monitor, an
extended-resource request served from DRA, a claim of a driver that is not a GPU driver. The
generator's truth for them is ``truth.dra_intervals``: one :class:`DraTruthInterval` per stretch
of time a claim held its GPUs for at least one pod, from the generator's own record of which
pods it bound and when they let go (the union of their intervals, a shared claim once).
``truth.dra_pod_shares`` splits that time among the pods (the billing view by pod-level keys,
owner and pod): one :class:`DraPodShare` per stretch in which the same pods held a claim, for
each of them, with how many shared it.

Replay lines (``python -m gpuquota.sim.workload --seed N --hours H > events.jsonl``) are
``{"type": ..., "object": ..., "observedAt": "<RFC 3339>"}``: what ``kubectl get --watch
--output-watch-events -o json`` prints, plus the observation time.

``observation_independent=True`` leaves out the cases whose end time exists only as the time
an event was observed (a DELETED event arriving before the deletion deadline, a pod turning
Failed without any container ``finishedAt``, the pod garbage collector lagging behind a node
deletion). A live controller observes events at wall-clock time, so tests that feed a
time-compressed workload through the API server stand-in use this mode: then every GPU release
is written in an object timestamp and the truth holds whenever the events are seen.
"""

from __future__ import annotations

import argparse
import copy
import heapq
import json
import random
import sys
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

from gpuquota.cli_common import exitcodes
from gpuquota.cli_common.commandline import OneLineParser, add_version

Obj = dict[str, Any]

#: 2026-01-01T00:00:00Z, the default start of a simulated span.
DEFAULT_START = 1767225600

GPU = "nvidia.com/gpu"
GPU_SHARED = "nvidia.com/gpu.shared"
MIG_1G = "nvidia.com/mig-1g.10gb"
MIG_3G = "nvidia.com/mig-3g.40gb"


def rfc3339(t: int) -> str:
    """Kubernetes' timestamp format: second resolution, UTC, trailing Z."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class NodeSpec:
    """A node as the generator knows it: what it advertises and what one unit is worth."""

    name: str
    pool: str
    labels: dict[str, str]
    #: GPU resources it advertises: resource name -> (allocatable units, physical GPUs per unit)
    gpus: dict[str, tuple[int, Fraction]]


NODES: tuple[NodeSpec, ...] = (
    NodeSpec(
        "gpu-h100-0",
        "h100",
        {
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "nvidia.com/gpu.count": "8",
            "nvidia.com/gpu.memory": "81559",
        },
        {GPU: (8, Fraction(1))},
    ),
    NodeSpec(
        "gpu-h100-1",
        "h100",
        {
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "nvidia.com/gpu.count": "8",
            "nvidia.com/gpu.memory": "81559",
        },
        {GPU: (8, Fraction(1))},
    ),
    # time-slicing, renameByDefault=false: the product label gets -SHARED, the resource
    # keeps its name, 4 replicas per GPU
    NodeSpec(
        "gpu-a100-ts-0",
        "a100-shared",
        {
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-SHARED",
            "nvidia.com/gpu.count": "4",
            "nvidia.com/gpu.replicas": "4",
            "nvidia.com/gpu.sharing-strategy": "time-slicing",
        },
        {GPU: (16, Fraction(1, 4))},
    ),
    # time-slicing, renameByDefault=true: nvidia.com/gpu.shared, 2 replicas of one T4
    NodeSpec(
        "gpu-t4-ts-0",
        "t4-shared",
        {
            "nvidia.com/gpu.product": "Tesla-T4",
            "nvidia.com/gpu.count": "1",
            "nvidia.com/gpu.replicas": "2",
            "nvidia.com/gpu.sharing-strategy": "time-slicing",
        },
        {GPU_SHARED: (2, Fraction(1, 2))},
    ),
    # MIG mixed strategy: GPU 0 as 7 x 1g.10gb, GPU 1 as 2 x 3g.40gb (7 compute slices each)
    NodeSpec(
        "gpu-a100-mig-0",
        "a100-mig",
        {
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
            "nvidia.com/gpu.count": "2",
            "nvidia.com/mig.strategy": "mixed",
            "nvidia.com/mig.config": "custom",
        },
        {MIG_1G: (7, Fraction(1, 7)), MIG_3G: (2, Fraction(3, 7))},
    ),
    # deleted while pods run on it (see _Sim.run)
    NodeSpec(
        "gpu-l4-0",
        "l4",
        {"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.count": "2"},
        {GPU: (2, Fraction(1))},
    ),
    NodeSpec("cpu-0", "cpu", {}, {}),
)

DOOMED_NODE = "gpu-l4-0"

# --- Dynamic Resource Allocation (generate(..., dra=True)) ---------------------------------
#: a node whose GPUs NVIDIA's DRA driver hands out: no device-plugin resources at all
DRA_NODE = NodeSpec(
    "gpu-h100-dra-0",
    "h100-dra",
    {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "6"},
    {},
)
DRA_DRIVER = "gpu.nvidia.com"
DRA_PRODUCT = "NVIDIA H100 80GB HBM3"  # the slice's productName attribute
DRA_MODEL = "NVIDIA-H100-80GB-HBM3"  # the model the report must show for it
DRA_NAMESPACE = "team-dra"
DRA_LABELS = {"team": "gamma", "cost-center": "cc-400"}
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
EXT_CLASS = "gpu-extended.nvidia.com"  # serves nvidia.com/gpu requests from DRA devices
#: the slice's devices: name -> (type, MIG profile or None, physical GPUs, memory bytes)
DRA_DEVICES: dict[str, tuple[str, str | None, Fraction, int]] = {
    **{f"gpu-{i}": ("gpu", None, Fraction(1), 80 * 2**30) for i in range(5)},
    **{
        f"gpu-5-mig-1g10gb-19-{i}": ("mig", "1g.10gb", Fraction(1, 7), 10 * 2**30) for i in range(3)
    },
    "gpu-5-mig-3g40gb-9-4": ("mig", "3g.40gb", Fraction(3, 7), 40 * 2**30),
}
DRA_SHAREABLE = "gpu-4"  # allowMultipleAllocations: claims consume part of its memory
DRA_QUOTA = {
    f"{GPU_CLASS}.deviceclass.resource.k8s.io/devices": "6",
    f"{MIG_CLASS}.deviceclass.resource.k8s.io/devices": "4",
    f"requests.{GPU}": "2",
}

NAMESPACES: dict[str, dict[str, str]] = {
    "team-a": {"team": "alpha", "cost-center": "cc-100"},
    "team-b": {"team": "beta", "cost-center": "cc-200"},
    "ml-research": {"team": "research", "cost-center": "cc-300"},
    "batch": {"team": "beta", "cost-center": "cc-200"},
    "default": {},
}
#: the label change mid-span: ml-research moves to another cost centre
RELABEL = ("ml-research", {"team": "research", "cost-center": "cc-310"})

QUOTAS: dict[str, tuple[dict[str, str], list[str]]] = {
    "team-a": ({f"requests.{GPU}": "24", f"requests.{MIG_1G}": "4", "requests.cpu": "200"}, []),
    "team-b": ({f"requests.{GPU}": "16", f"requests.{GPU_SHARED}": "2"}, []),
    "ml-research": (
        {f"requests.{GPU}": "12", f"requests.{MIG_3G}": "2", f"requests.{MIG_1G}": "7"},
        [],
    ),
    # a scoped quota: GPU-only (BestEffort) pods escape it
    "batch": ({f"requests.{GPU}": "8"}, ["NotBestEffort"]),
}


#: what the scripted pods of _Sim.run still need of each namespace's GPU quota late in the span
#: (trainer-0 again, the pods on the doomed node): random pods leave it free, so quota
#: admission never turns a scripted case away, whatever the seed
SCRIPTED_HEADROOM: dict[str, int] = {"team-a": 2, "team-b": 1, "batch": 1}


def quota_refusal(
    quota: str, hard: dict[str, str], used: dict[str, str], requested: dict[str, int]
) -> str | None:
    """The ResourceQuota admission rule for one quota: None when ``requested`` (quota keys such
    as ``requests.nvidia.com/gpu`` -> units) fits under ``hard`` beside ``used``, else the
    real server's reason, e.g. ``exceeded quota: gpu, requested: requests.nvidia.com/gpu=1,
    used: requests.nvidia.com/gpu=2, limited: requests.nvidia.com/gpu=2``."""
    over = sorted(
        key
        for key, n in requested.items()
        if n and key in hard and int(used.get(key, "0")) + n > int(hard[key])
    )
    if not over:
        return None

    def listed(values: dict[str, int] | dict[str, str]) -> str:
        return ",".join(f"{k}={values.get(k, 0)}" for k in over)

    return (
        f"exceeded quota: {quota}, requested: {listed(requested)}, used: {listed(used)}, "
        f"limited: {listed(hard)}"
    )


@dataclass(frozen=True)
class WatchEvent:
    at: int  # simulated observation time, unix seconds
    type: str  # ADDED | MODIFIED | DELETED
    object: Obj

    def line(self) -> str:
        """One replay line."""
        return json.dumps(
            {"type": self.type, "object": self.object, "observedAt": rfc3339(self.at)},
            separators=(",", ":"),
        )


@dataclass(frozen=True)
class TruthInterval:
    pod_uid: str
    namespace: str
    pod_name: str
    node: str
    resource: str
    units: int  # effective request the generator built the pod from
    factor: Fraction  # physical GPUs per unit on that node
    start: int
    end: int | None  # None: still bound at the end of the span
    reason: str

    def seconds(self, until: int) -> int:
        end = until if self.end is None else min(self.end, until)
        return max(0, end - self.start)


@dataclass(frozen=True)
class DraTruthInterval:
    """A stretch of time a DRA claim held GPUs of one device class for at least one pod: the
    generator's own record of when the first pod using the claim was bound and started and
    when the last one let go (so a claim shared by several pods is counted once)."""

    claim_uid: str
    namespace: str
    claim_name: str
    device_class: str
    node: str
    units: int  # GPU devices the generator allocated to the claim
    physical: Fraction  # their physical-GPU equivalent (MIG N/7, consumed capacity share)
    model: str
    start: int
    end: int | None

    def seconds(self, until: int) -> int:
        end = until if self.end is None else min(self.end, until)
        return max(0, end - self.start)


@dataclass(frozen=True)
class DraPodShare:
    """One pod's equal share of a stretch of a DRA claim's charged time in which the same pods
    held it (policy: grouped by pod-level keys, a shared claim's time is split equally among
    the pods using it at each instant): the generator's own record of who held it when."""

    claim_uid: str
    namespace: str
    claim_name: str
    device_class: str
    pod_uid: str
    pod_name: str
    owner: str  # Kind/name of what the generator made the pod for (a Deployment's pods: it)
    units: int
    physical: Fraction
    start: int
    end: int | None
    sharers: int  # pods holding the claim over [start, end), this one included

    def seconds(self, until: int) -> int:
        end = until if self.end is None else min(self.end, until)
        return max(0, end - self.start)

    def raw(self, until: int) -> Fraction:
        """This pod's raw device-seconds of the stretch."""
        return Fraction(self.units * self.seconds(until), self.sharers)

    def physical_seconds(self, until: int) -> Fraction:
        return self.physical * self.seconds(until) / self.sharers


@dataclass
class Truth:
    """The oracle: GPU-seconds per namespace and resource, raw and physical, and per label."""

    until: int  # end of the span: open intervals count up to here
    intervals: list[TruthInterval]
    #: (namespace, labels, valid_from, valid_to or None)
    namespace_labels: list[tuple[str, dict[str, str], int, int | None]]
    #: DRA claims (workloads generated with dra=True)
    dra_intervals: list[DraTruthInterval] = field(default_factory=list)
    #: the same time split among the pods holding each claim
    dra_pod_shares: list[DraPodShare] = field(default_factory=list)
    #: every ResourceQuota status the quota controller wrote: (time, namespace, resource key
    #: such as ``requests.nvidia.com/gpu``, used, hard)
    quota_history: list[tuple[int, str, str, int, int]] = field(default_factory=list)
    #: physical GPUs each node offered: (node, GPU model, node pool, GPUs, from, to or None)
    capacity: list[tuple[str, str, str, Fraction, int, int | None]] = field(default_factory=list)
    #: pod creations quota admission refused: (time, namespace, pod name, the server's message)
    refused: list[tuple[int, str, str, str]] = field(default_factory=list)

    def quota_peaks(self) -> dict[tuple[str, str], tuple[int, int]]:
        """(peak used, peak hard) per (namespace, quota resource key) over the span."""
        out: dict[tuple[str, str], tuple[int, int]] = {}
        for _t, ns, key, used, hard in self.quota_history:
            peak_used, peak_hard = out.get((ns, key), (0, 0))
            out[(ns, key)] = (max(peak_used, used), max(peak_hard, hard))
        return out

    def namespace_totals(self) -> dict[str, tuple[int, Fraction]]:
        """(raw, physical) GPU-seconds per namespace, device-plugin requests and DRA claims
        (each claim's time once, however many pods shared it)."""
        out: dict[str, tuple[int, Fraction]] = {}
        for ns, units, phys, seconds in self._held():
            raw, physical = out.get(ns, (0, Fraction(0)))
            out[ns] = (raw + units * seconds, physical + phys * seconds)
        return out

    def label_totals(self, key: str) -> dict[str, int]:
        """Raw GPU-seconds per value of the namespace label ``key`` (``""``: no such label),
        each second under the value the namespace had then."""
        out: dict[str, int] = defaultdict(int)
        spans = [(iv.namespace, iv.units, iv.start, iv.end) for iv in self.intervals] + [
            (iv.namespace, iv.units, iv.start, iv.end) for iv in self.dra_intervals
        ]
        for namespace, units, start, end in spans:
            stop = self.until if end is None else min(end, self.until)
            for ns, labels, lo, hi in self.namespace_labels:
                if ns == namespace:
                    seconds = min(stop, self.until if hi is None else hi) - max(start, lo)
                    out[labels.get(key, "")] += units * max(0, seconds)
        return dict(out)

    def allocated_seconds(self) -> dict[tuple[str, str], Fraction]:
        """Physical GPU-seconds held per (GPU model, node pool), the idle view's allocated."""
        where = {node: (model, pool) for node, model, pool, *_ in self.capacity}
        out: dict[tuple[str, str], Fraction] = defaultdict(Fraction)
        for iv in self.intervals:
            out[where[iv.node]] += iv.units * iv.factor * iv.seconds(self.until)
        for dv in self.dra_intervals:
            out[where[dv.node]] += dv.physical * dv.seconds(self.until)
        return dict(out)

    def _held(self) -> Iterator[tuple[str, int, Fraction, int]]:
        for iv in self.intervals:
            yield iv.namespace, iv.units, iv.units * iv.factor, iv.seconds(self.until)
        for dv in self.dra_intervals:
            yield dv.namespace, dv.units, dv.physical, dv.seconds(self.until)

    def allocatable_seconds(
        self, lo: int | None = None, hi: int | None = None
    ) -> dict[tuple[str, str], Fraction]:
        """Physical GPU-seconds the nodes offered per (GPU model, node pool) in ``[lo, hi)``
        (default: the span), the idle view's allocatable figure."""
        lo = lo if lo is not None else min((c[4] for c in self.capacity), default=0)
        hi = hi if hi is not None else self.until
        out: dict[tuple[str, str], Fraction] = defaultdict(Fraction)
        for _node, model, pool, gpus, start, end in self.capacity:
            seconds = max(0, min(hi, self.until if end is None else end) - max(lo, start))
            out[(model, pool)] += gpus * seconds
        return dict(out)

    def dra_split_seconds(
        self, key: Callable[[DraPodShare], str], until: int | None = None
    ) -> dict[str, tuple[Fraction, Fraction]]:
        """(raw, physical) DRA GPU-seconds per ``key`` of the pod's share (its pod, owner)."""
        out: dict[str, tuple[Fraction, Fraction]] = {}
        for share in self.dra_pod_shares:
            raw, phys = out.get(key(share), (Fraction(0), Fraction(0)))
            stop = until or self.until
            out[key(share)] = (raw + share.raw(stop), phys + share.physical_seconds(stop))
        return out

    def dra_gpu_seconds(self, until: int | None = None) -> dict[tuple[str, str], int]:
        """Raw device-seconds of DRA claims per (namespace, device class)."""
        out: dict[tuple[str, str], int] = defaultdict(int)
        for iv in self.dra_intervals:
            out[(iv.namespace, iv.device_class)] += iv.units * iv.seconds(until or self.until)
        return dict(out)

    def dra_physical_seconds_exact(
        self, until: int | None = None
    ) -> dict[tuple[str, str], Fraction]:
        out: dict[tuple[str, str], Fraction] = defaultdict(Fraction)
        for iv in self.dra_intervals:
            out[(iv.namespace, iv.device_class)] += iv.physical * iv.seconds(until or self.until)
        return dict(out)

    def gpu_seconds(self, until: int | None = None) -> dict[tuple[str, str], int]:
        """Raw unit-seconds per (namespace, resource name)."""
        out: dict[tuple[str, str], int] = defaultdict(int)
        for iv in self.intervals:
            out[(iv.namespace, iv.resource)] += iv.units * iv.seconds(until or self.until)
        return dict(out)

    def physical_seconds_exact(self, until: int | None = None) -> dict[tuple[str, str], Fraction]:
        out: dict[tuple[str, str], Fraction] = defaultdict(Fraction)
        for iv in self.intervals:
            out[(iv.namespace, iv.resource)] += (
                iv.units * iv.factor * iv.seconds(until or self.until)
            )
        return dict(out)

    def physical_seconds(self, until: int | None = None) -> dict[tuple[str, str], float]:
        """Physical-GPU-seconds per (namespace, resource name)."""
        return {k: float(v) for k, v in self.physical_seconds_exact(until).items()}

    def by_label(
        self, key: str, until: int | None = None
    ) -> dict[tuple[str, str], tuple[int, float]]:
        """(raw, physical) GPU-seconds per (label value, resource), split where the label changed.

        A namespace without the label counts under the value ``""``.
        """
        stop = until or self.until
        raw: dict[tuple[str, str], int] = defaultdict(int)
        phys: dict[tuple[str, str], Fraction] = defaultdict(Fraction)
        for iv in self.intervals:
            iv_end = stop if iv.end is None else min(iv.end, stop)
            for ns, labels, lo, hi in self.namespace_labels:
                if ns != iv.namespace:
                    continue
                s = max(iv.start, lo)
                e = min(iv_end, stop if hi is None else hi)
                if e > s:
                    k = (labels.get(key, ""), iv.resource)
                    raw[k] += iv.units * (e - s)
                    phys[k] += iv.units * iv.factor * (e - s)
        return {k: (raw[k], float(phys[k])) for k in raw}

    def to_json(self) -> Obj:
        phys = self.physical_seconds()
        return {
            "until": self.until,
            "gpu_seconds": [
                {"namespace": ns, "resource": r, "raw": v, "physical": phys[(ns, r)]}
                for (ns, r), v in sorted(self.gpu_seconds().items())
            ],
            "intervals": [
                {
                    "pod_uid": iv.pod_uid,
                    "namespace": iv.namespace,
                    "pod_name": iv.pod_name,
                    "node": iv.node,
                    "resource": iv.resource,
                    "units": iv.units,
                    "physical_per_unit": float(iv.factor),
                    "start": iv.start,
                    "end": iv.end,
                    "reason": iv.reason,
                }
                for iv in self.intervals
            ],
            "dra_intervals": [
                {
                    "claim_uid": iv.claim_uid,
                    "namespace": iv.namespace,
                    "claim_name": iv.claim_name,
                    "device_class": iv.device_class,
                    "node": iv.node,
                    "units": iv.units,
                    "physical": float(iv.physical),
                    "model": iv.model,
                    "start": iv.start,
                    "end": iv.end,
                }
                for iv in self.dra_intervals
            ],
            "dra_pod_shares": [
                {
                    "claim_uid": sh.claim_uid,
                    "pod_uid": sh.pod_uid,
                    "namespace": sh.namespace,
                    "pod_name": sh.pod_name,
                    "owner": sh.owner,
                    "device_class": sh.device_class,
                    "units": sh.units,
                    "physical": float(sh.physical),
                    "start": sh.start,
                    "end": sh.end,
                    "sharers": sh.sharers,
                }
                for sh in self.dra_pod_shares
            ],
        }


@dataclass
class Workload:
    seed: int
    start: int
    end: int
    events: list[WatchEvent]
    truth: Truth

    def lines(self) -> Iterator[str]:
        """Replay lines: every event, then a bookmark at the end of the span, which tells
        `gpuquota replay` the recording knew the cluster up to there (its heartbeat)."""
        for ev in self.events:
            yield ev.line()
        yield json.dumps(
            {
                "type": "BOOKMARK",
                "object": {"kind": "Pod", "apiVersion": "v1", "metadata": {}},
                "observedAt": rfc3339(self.end),
            },
            separators=(",", ":"),
        )

    def kinds(self) -> set[str]:
        return {ev.object["kind"] for ev in self.events}


# --- the simulation -------------------------------------------------------------------------


def _written(obj: Obj, manager: str, subresource: str | None, at: int) -> None:
    """Stamp a write the way the API server does: the manager's managedFields entry gets the
    time (the quota controller's status updates are when a quota's used changed)."""
    fields = obj["metadata"].setdefault("managedFields", [])
    entry: Obj = {"manager": manager, "operation": "Update", "apiVersion": "v1"}
    if subresource:
        entry["subresource"] = subresource
    entry["time"] = rfc3339(at)
    entry["fieldsType"] = "FieldsV1"
    entry["fieldsV1"] = {"f:status": {"f:used": {}}} if subresource else {"f:spec": {}}
    kept = [e for e in fields if (e.get("manager"), e.get("subresource")) != (manager, subresource)]
    obj["metadata"]["managedFields"] = [*kept, entry]


def _owner(meta: Obj) -> str:
    """Kind/name of what the generator made a pod for: new_pod names the owner after the pod,
    and a ReplicaSet pod (``<deployment>-<hash>-<suffix>``) belongs to its Deployment."""
    refs = meta.get("ownerReferences") or []
    if not refs:
        return ""
    ref = refs[0]
    if ref["kind"] == "ReplicaSet":
        return f"Deployment/{meta['name'].rsplit('-', 2)[0]}"
    return f"{ref['kind']}/{ref['name']}"


@dataclass
class _Claim:
    """A DRA claim as the generator allocated it, and who holds it now."""

    obj: Obj
    #: device class -> (devices, physical GPUs) that the accounting must charge; empty for a
    #: claim that is not charged (adminAccess, another driver, made for an extended resource)
    charged: dict[str, tuple[int, Fraction]]
    node: str
    template: bool
    holders: set[str] = field(default_factory=set)  # pod UIDs inside their billing interval
    open_since: int = 0
    held_since: int = 0  # since when the current holders have held it together

    def truth(self, start: int, end: int | None) -> list[DraTruthInterval]:
        meta = self.obj["metadata"]
        return [
            DraTruthInterval(
                meta["uid"],
                meta["namespace"],
                meta["name"],
                device_class,
                self.node,
                units,
                physical,
                DRA_MODEL,
                start,
                end,
            )
            for device_class, (units, physical) in sorted(self.charged.items())
        ]


@dataclass
class _Pod:
    obj: Obj
    units: dict[str, int]  # effective request per GPU resource (what the spec was built from)
    node: str | None = None
    start: int | None = None  # status.startTime: GPUs bound from here
    released: bool = False
    terminal: bool = False
    deleted: bool = False
    fate: str = ""
    after_delete: Callable[[], None] | None = None
    claims: list[_Claim] = field(default_factory=list)  # DRA claims the pod uses

    @property
    def uid(self) -> str:
        return str(self.obj["metadata"]["uid"])


@dataclass(order=True)
class _Action:
    at: int
    seq: int
    run: Callable[[], None] = field(compare=False)


class _Sim:
    def __init__(
        self,
        seed: int,
        start: int,
        end: int,
        pods_per_hour: float,
        independent: bool,
        dra: bool = False,
    ):
        self.rng = random.Random(seed)
        self.dra = dra
        self.specs: dict[str, NodeSpec] = {n.name: n for n in (*NODES, DRA_NODE)}
        self.claims: dict[tuple[str, str], _Claim] = {}
        self.dra_intervals: list[DraTruthInterval] = []
        self.dra_pod_shares: list[DraPodShare] = []
        self.start, self.end = start, end
        self.pods_per_hour = pods_per_hour
        self.independent = independent
        self.now = start
        self.rv = 1000
        self.seq = 0
        self.queue: list[_Action] = []
        self.events: list[WatchEvent] = []
        self.intervals: list[TruthInterval] = []
        self.nodes: dict[str, Obj] = {}
        self.node_alive: dict[str, bool] = {}
        self.bound: dict[tuple[str, str], int] = defaultdict(int)  # (node, resource) -> units
        self.namespaces: dict[str, Obj] = {}
        self.ns_labels: list[tuple[str, dict[str, str], int, int | None]] = []
        self.quotas: dict[str, Obj] = {}
        self.pods: dict[str, _Pod] = {}  # by uid
        self.names: dict[tuple[str, str], int] = defaultdict(int)
        self.unreserve: list[tuple[_Claim, str]] = []
        self.quota_history: list[tuple[int, str, str, int, int]] = []
        self.capacity: list[tuple[str, str, str, Fraction, int, int | None]] = []
        self.refused: list[tuple[int, str, str, str]] = []

    # -- plumbing

    def factor(self, node: str, resource: str) -> Fraction:
        """Physical GPUs one unit of ``resource`` is on ``node`` (a DRA node's extended
        resource is a whole GPU the scheduler took from its slice)."""
        gpus = self.specs[node].gpus
        return gpus[resource][1] if resource in gpus else Fraction(1)

    def uid(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def at(self, t: int, fn: Callable[[], None]) -> None:
        if t < self.end:
            self.seq += 1
            heapq.heappush(self.queue, _Action(t, self.seq, fn))

    def emit(self, type_: str, obj: Obj) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.events.append(WatchEvent(self.now, type_, copy.deepcopy(obj)))

    def meta(self, name: str, namespace: str | None = None, created: int | None = None) -> Obj:
        m: Obj = {
            "name": name,
            "uid": self.uid(),
            "resourceVersion": "",
            "creationTimestamp": rfc3339(self.start - 86400 if created is None else created),
        }
        if namespace is not None:
            m["namespace"] = namespace
        return m

    # -- cluster objects

    def add_node(self, spec: NodeSpec) -> None:
        alloc = {r: str(n) for r, (n, _) in spec.gpus.items()}
        obj: Obj = {
            "kind": "Node",
            "apiVersion": "v1",
            "metadata": {
                **self.meta(spec.name),
                "labels": {
                    "kubernetes.io/hostname": spec.name,
                    "kubernetes.io/os": "linux",
                    "node-pool": spec.pool,
                    **spec.labels,
                },
            },
            "spec": {"podCIDR": "10.244.0.0/24", "providerID": f"sim://{spec.name}"},
            "status": {
                "capacity": {"cpu": "64", "memory": "528280960Ki", "pods": "110", **alloc},
                "allocatable": {"cpu": "63500m", "memory": "527154560Ki", "pods": "110", **alloc},
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "lastHeartbeatTime": rfc3339(self.start),
                        "lastTransitionTime": rfc3339(self.start - 86400),
                    }
                ],
                "nodeInfo": {
                    "architecture": "amd64",
                    "bootID": self.uid(),
                    "containerRuntimeVersion": "containerd://1.7.22",
                    "kernelVersion": "6.1.0-26-amd64",
                    "kubeProxyVersion": "v1.31.0",
                    "kubeletVersion": "v1.31.0",
                    "machineID": self.uid().replace("-", ""),
                    "operatingSystem": "linux",
                    "osImage": "Debian GNU/Linux 12 (bookworm)",
                    "systemUUID": self.uid(),
                },
            },
        }
        self.nodes[spec.name] = obj
        self.node_alive[spec.name] = True
        if spec.gpus or spec is DRA_NODE:
            # what can be handed out, in physical GPUs: a MIG layout that leaves a compute
            # slice unused (7 x 1g + 2 x 3g of 14 slices) offers less than its GPU count
            model = DRA_MODEL if spec is DRA_NODE else spec.labels["nvidia.com/gpu.product"]
            gpus = (
                sum((d[2] for d in DRA_DEVICES.values()), Fraction(0))
                if spec is DRA_NODE
                else sum((n * f for n, f in spec.gpus.values()), Fraction(0))
            )
            self.capacity.append(
                (spec.name, model.removesuffix("-SHARED"), spec.pool, gpus, self.now, None)
            )
        self.emit("ADDED", obj)

    def add_namespace(self, name: str, labels: dict[str, str]) -> None:
        obj: Obj = {
            "kind": "Namespace",
            "apiVersion": "v1",
            "metadata": {
                **self.meta(name),
                "labels": {"kubernetes.io/metadata.name": name, **labels},
            },
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"},
        }
        self.namespaces[name] = obj
        self.ns_labels.append((name, dict(labels), self.start, None))
        self.emit("ADDED", obj)

    def relabel_namespace(self, name: str, labels: dict[str, str]) -> None:
        obj = self.namespaces[name]
        obj["metadata"]["labels"] = {"kubernetes.io/metadata.name": name, **labels}
        for i, (ns, old, lo, hi) in enumerate(self.ns_labels):
            if ns == name and hi is None:
                self.ns_labels[i] = (ns, old, lo, self.now)
        self.ns_labels.append((name, dict(labels), self.now, None))
        self.emit("MODIFIED", obj)

    # -- Dynamic Resource Allocation

    def add_dra_objects(self) -> None:
        """The DRA node, its ResourceSlice, the DeviceClasses, and the DRA team's namespace,
        quota and the claims that exist before their pods."""
        self.add_node(DRA_NODE)
        devices = []
        for name, (kind, profile, _physical, memory) in DRA_DEVICES.items():
            attrs: Obj = {
                "type": {"string": kind},
                "uuid": {"string": f"{'MIG' if kind == 'mig' else 'GPU'}-{self.uid()}"},
                "productName": {"string": DRA_PRODUCT},
            }
            if profile:
                attrs["profile"] = {"string": profile}
            device: Obj = {
                "name": name,
                "attributes": attrs,
                "capacity": {"memory": {"value": str(memory)}},
            }
            if name == DRA_SHAREABLE:
                device["allowMultipleAllocations"] = True
            devices.append(device)
        self.emit(
            "ADDED",
            {
                "kind": "ResourceSlice",
                "apiVersion": "resource.k8s.io/v1",
                "metadata": self.meta(f"{DRA_NODE.name}-{DRA_DRIVER}-x7k2p"),
                "spec": {
                    "driver": DRA_DRIVER,
                    "nodeName": DRA_NODE.name,
                    "pool": {"name": DRA_NODE.name, "generation": 1, "resourceSliceCount": 1},
                    "devices": devices,
                },
            },
        )
        selectors = {
            GPU_CLASS: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
            MIG_CLASS: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'",
            EXT_CLASS: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
        }
        for name, expression in selectors.items():
            spec: Obj = {"selectors": [{"cel": {"expression": expression}}]}
            if name == EXT_CLASS:
                spec["extendedResourceName"] = GPU
            self.emit(
                "ADDED",
                {
                    "kind": "DeviceClass",
                    "apiVersion": "resource.k8s.io/v1",
                    "metadata": self.meta(name),
                    "spec": spec,
                },
            )
        self.add_namespace(DRA_NAMESPACE, DRA_LABELS)
        self.add_quota(DRA_NAMESPACE, dict(DRA_QUOTA), [])

    def new_claim(
        self,
        name: str,
        requests: dict[str, tuple[str, int]],
        devices: list[tuple[str, str, str, Obj]],
        *,
        template: bool = False,
        extended: bool = False,
    ) -> _Claim:
        """A ResourceClaim (not yet allocated). ``requests``: request name -> (device class,
        count); ``devices``: what the scheduler will allocate, (request, driver, device,
        extra result fields). A claim made for a pod (from a template, or for its extended
        resources) is created by dra_pod once the pod exists."""
        meta = self.meta(name, DRA_NAMESPACE, created=self.now)
        if extended:
            meta.setdefault("annotations", {})["resource.kubernetes.io/extended-resource-claim"] = (
                "true"
            )
        obj: Obj = {
            "kind": "ResourceClaim",
            "apiVersion": "resource.k8s.io/v1",
            "metadata": meta,
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": req,
                            "exactly": {
                                "deviceClassName": device_class,
                                "allocationMode": "ExactCount",
                                "count": count,
                            },
                        }
                        for req, (device_class, count) in requests.items()
                    ]
                }
            },
            "status": {},
        }
        charged: dict[str, tuple[int, Fraction]] = {}
        results = []
        for req, driver, device, extra in devices:
            results.append(
                {"request": req, "driver": driver, "pool": DRA_NODE.name, "device": device, **extra}
            )
            if driver != DRA_DRIVER or extra.get("adminAccess") or extended:
                continue
            _kind, _profile, physical, memory = DRA_DEVICES[device]
            if "consumedCapacity" in extra:
                physical = physical * Fraction(int(extra["consumedCapacity"]["memory"]), memory)
            device_class = requests[req][0]
            units, total = charged.get(device_class, (0, Fraction(0)))
            charged[device_class] = (units + 1, total + physical)
        claim = _Claim(obj, charged, DRA_NODE.name, template)
        claim.obj["_results"] = results  # taken out when allocated
        if not (template or extended):
            self.claims[(DRA_NAMESPACE, name)] = claim
            self.emit("ADDED", self.claim_view(claim))
            self.refresh_dra_quota()
        return claim

    def claim_view(self, claim: _Claim) -> Obj:
        return {k: v for k, v in claim.obj.items() if not k.startswith("_")}

    def allocate(self, claim: _Claim, pod: _Pod) -> None:
        """The scheduler allocates the claim (once) and reserves it for the pod."""
        status = claim.obj["status"]
        if "allocation" not in status:
            status["allocation"] = {
                "devices": {"results": claim.obj["_results"]},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [claim.node]}
                            ]
                        }
                    ]
                },
            }
        reserved = status.setdefault("reservedFor", [])
        reserved.append({"resource": "pods", "name": pod.obj["metadata"]["name"], "uid": pod.uid})
        self.emit("MODIFIED", self.claim_view(claim))

    def dra_hold(self, pod: _Pod) -> None:
        """The pod's billing interval starts: its claims hold their devices for it."""
        for claim in pod.claims:
            if not claim.holders:
                claim.open_since = self.now
            self.dra_shares(claim, self.now)
            claim.holders.add(pod.uid)

    def dra_shares(self, claim: _Claim, end: int | None) -> None:
        """The current holders' equal shares of the claim since they began holding it together,
        up to ``end`` (None: still held at the end of the span), as the holders change."""
        if claim.holders and (end is None or end > claim.held_since):
            meta = claim.obj["metadata"]
            for uid in sorted(claim.holders):
                holder = self.pods[uid].obj["metadata"]
                for device_class, (units, physical) in sorted(claim.charged.items()):
                    self.dra_pod_shares.append(
                        DraPodShare(
                            meta["uid"],
                            meta["namespace"],
                            meta["name"],
                            device_class,
                            uid,
                            holder["name"],
                            _owner(holder),
                            units,
                            physical,
                            claim.held_since,
                            end,
                            len(claim.holders),
                        )
                    )
        if end is not None:
            claim.held_since = end

    def dra_release(self, pod: _Pod) -> None:
        """The pod's billing interval ends; a claim no pod holds any more stops being charged."""
        for claim in pod.claims:
            if pod.uid not in claim.holders:
                continue
            self.dra_shares(claim, self.now)
            claim.holders.discard(pod.uid)
            if not claim.holders:
                self.dra_intervals.extend(claim.truth(claim.open_since, self.now))
            self.unreserve.append((claim, pod.uid))

    def flush_dra(self) -> None:
        """The resourceclaim controller drops finished pods from reservedFor."""
        for claim, uid in self.unreserve:
            status = claim.obj["status"]
            status["reservedFor"] = [r for r in status.get("reservedFor", []) if r["uid"] != uid]
            if not claim.obj["metadata"].get("deletionTimestamp"):
                self.emit("MODIFIED", self.claim_view(claim))
        self.unreserve.clear()

    def delete_claim(self, claim: _Claim) -> None:
        claim.obj["metadata"]["deletionTimestamp"] = rfc3339(self.now)
        claim.obj["metadata"]["deletionGracePeriodSeconds"] = 0
        claim.obj["status"] = {}
        self.emit("DELETED", self.claim_view(claim))
        del self.claims[(DRA_NAMESPACE, claim.obj["metadata"]["name"])]
        self.refresh_dra_quota()

    def refresh_dra_quota(self) -> None:
        """The quota controller: devices requested by the namespace's claims, per class."""
        quota = self.quotas.get(DRA_NAMESPACE)
        if quota is None:
            return
        used: dict[str, int] = defaultdict(int)
        for claim in self.claims.values():
            for request in claim.obj["spec"]["devices"]["requests"]:
                exactly = request["exactly"]
                used[f"{exactly['deviceClassName']}.deviceclass.resource.k8s.io/devices"] += int(
                    exactly["count"]
                )
        new = {
            k: str(used.get(k, 0)) if k.endswith("/devices") else v
            for k, v in quota["status"]["used"].items()
        }
        if new != quota["status"]["used"]:
            quota["status"]["used"] = new
            _written(quota, "kube-controller-manager", "status", self.now)
            self.emit("MODIFIED", quota)
            self.record_quota(DRA_NAMESPACE, quota)

    def dra_pod(
        self,
        name: str,
        claims: list[tuple[str, _Claim]],
        *,
        run_for: int | None,
        ok: bool = True,
        units: dict[str, int] | None = None,
        owner: str = "Job",
        delete_grace: int | None = None,
    ) -> None:
        """A pod using DRA claims: (its claim entry name, the claim). Template claims are
        named in status.resourceClaimStatuses and go with the pod."""
        entries = [
            {"name": entry, "resourceClaimTemplateName": "gpus"}
            if claim.template
            else {"name": entry, "resourceClaimName": claim.obj["metadata"]["name"]}
            for entry, claim in claims
            if not claim.obj["metadata"]
            .get("annotations", {})
            .get("resource.kubernetes.io/extended-resource-claim")
        ]
        fate = "running" if run_for is None else ("succeeded" if ok else "failed")
        pod = self.new_pod(
            DRA_NAMESPACE,
            name,
            units or {},
            fate,
            shape="plain",
            owner=owner,
            resource_claims=entries,
        )
        if pod is None:
            raise RuntimeError(f"quota admission refused the scripted DRA pod {name}")
        if owner == "ReplicaSet":
            template_hash = name.rsplit("-", 1)[0].rsplit("-", 1)[1]
            pod.obj["metadata"]["labels"]["pod-template-hash"] = template_hash
        pod.claims = [claim for _entry, claim in claims]
        for claim in pod.claims:
            meta = claim.obj["metadata"]
            if (DRA_NAMESPACE, meta["name"]) in self.claims:
                continue
            # made for this pod (from a template, or for its extended resources): owned by it
            meta["ownerReferences"] = [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": name,
                    "uid": pod.uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ]
            self.claims[(DRA_NAMESPACE, meta["name"])] = claim
            self.emit("ADDED", self.claim_view(claim))
            self.refresh_dra_quota()
        status = pod.obj["status"]
        template_claims = [(e, c) for e, c in claims if c.template]
        if template_claims:
            status["resourceClaimStatuses"] = [
                {"name": e, "resourceClaimName": c.obj["metadata"]["name"]}
                for e, c in template_claims
            ]
        extended = [
            c
            for _e, c in claims
            if c.obj["metadata"]
            .get("annotations", {})
            .get("resource.kubernetes.io/extended-resource-claim")
        ]
        if extended:
            status["extendedResourceClaimStatus"] = {
                "resourceClaimName": extended[0].obj["metadata"]["name"],
                "requestMappings": [
                    {
                        "containerName": "train",
                        "resourceName": GPU,
                        "requestName": "container-0-request-0",
                    }
                ],
            }
        if template_claims or extended:
            self.emit("MODIFIED", pod.obj)

        def schedule() -> None:
            for claim in pod.claims:
                self.allocate(claim, pod)
            self.bind(pod, DRA_NODE.name)

        def delete() -> None:
            self.request_delete(pod, delete_grace or 0, delete_grace or 0)

        def gone() -> None:
            for claim in pod.claims:
                owned = claim.obj["metadata"].get("ownerReferences")
                if owned and (DRA_NAMESPACE, claim.obj["metadata"]["name"]) in self.claims:
                    self.delete_claim(claim)

        pod.after_delete = gone
        t = self.now
        self.at(t + 1, schedule)
        self.at(t + 2, lambda: self.accept(pod))
        self.at(t + 4, lambda: self.running(pod))
        if run_for is not None:
            if delete_grace is not None:
                self.at(t + 4 + run_for, delete)
            else:
                self.at(t + 4 + run_for, lambda: self.finish(pod, ok))
                self.at(t + 4 + run_for + 30, lambda: self.request_delete(pod, 0, 0))

    def dra_script(self) -> None:
        """The DRA cases, whatever the seed: a template claim, a claim shared by three pods
        (overlapping, then after a gap), MIG devices, a consumable-capacity share, an
        adminAccess monitor, an extended-resource request served by DRA, and a claim of a
        driver that is not a GPU driver."""
        s, u = self.start, (self.end - self.start) // 12
        gpu = (GPU_CLASS, 1)
        mig = (MIG_CLASS, 1)
        drv = DRA_DRIVER

        def template(pod_name: str, req: tuple[str, int], devices: list[str]) -> _Claim:
            return self.new_claim(
                f"{pod_name}-gpu-{self.rng.randrange(16**5):05x}",
                {"gpu": (req[0], len(devices))},
                [("gpu", drv, d, {}) for d in devices],
                template=True,
            )

        def train() -> None:
            claim = template("dra-train-0", gpu, ["gpu-0", "gpu-1"])
            self.dra_pod("dra-train-0", [("gpu", claim)], run_for=3 * u)

        self.at(s + 20, train)
        shared: dict[str, _Claim] = {}

        def make_shared() -> None:
            shared["c"] = self.new_claim("shared-gpu", {"gpu": gpu}, [("gpu", drv, "gpu-2", {})])
            # a monitor reads every GPU of the node with adminAccess: never charged
            monitor = self.new_claim(
                "monitor-gpus",
                {"all": (GPU_CLASS, 1)},
                [("all", drv, "gpu-2", {"adminAccess": True})],
            )
            self.dra_pod("dcgm-monitor-0", [("gpus", monitor)], run_for=None, owner="DaemonSet")
            # a claim of another driver: counted as a problem, not charged
            fpga = self.new_claim(
                "fpga-0",
                {"fpga": ("fpga.example.com", 1)},
                [("fpga", "fpga.example.com", "fpga-0", {})],
            )
            self.dra_pod("fpga-job-0", [("fpga", fpga)], run_for=u)

        self.at(s + 10, make_shared)
        self.at(
            s + 30,
            lambda: self.dra_pod(
                "infer-7c9d8f-a1b2c", [("gpu", shared["c"])], run_for=3 * u, owner="ReplicaSet"
            ),
        )
        # one second off the first pod's schedule, so that the two overlap an odd number of
        # seconds (for a whole span of hours) and their equal shares are not whole seconds
        self.at(
            s + 31 + 2 * u,
            lambda: self.dra_pod(
                "infer-7c9d8f-d3e4f", [("gpu", shared["c"])], run_for=3 * u, owner="ReplicaSet"
            ),
        )
        self.at(
            s + 60 + 6 * u,
            lambda: self.dra_pod("shared-late-0", [("gpu", shared["c"])], run_for=None),
        )

        def mig_small() -> None:
            claim = template("mig-small-0", mig, ["gpu-5-mig-1g10gb-19-0"])
            self.dra_pod("mig-small-0", [("gpu", claim)], run_for=2 * u, ok=False)

        self.at(s + 40, mig_small)

        def mig_big() -> None:
            claim = self.new_claim(
                "mig-big", {"gpu": mig}, [("gpu", drv, "gpu-5-mig-3g40gb-9-4", {})]
            )
            self.dra_pod("mig-big-0", [("gpu", claim)], run_for=None, owner="StatefulSet")

        self.at(s + 50, mig_big)

        def share() -> None:
            claim = self.new_claim(
                "gpu-share",
                {"gpu": gpu},
                [
                    (
                        "gpu",
                        drv,
                        DRA_SHAREABLE,
                        {
                            "shareID": str(uuid.UUID(int=self.rng.getrandbits(128), version=4)),
                            "consumedCapacity": {"memory": str(20 * 2**30)},
                        },
                    )
                ],
            )
            self.dra_pod("share-0", [("gpu", claim)], run_for=4 * u)

        self.at(s + 60, share)

        def extended() -> None:
            claim = self.new_claim(
                f"ext-0-extended-resources-{self.rng.randrange(16**5):05x}",
                {"container-0-request-0": (EXT_CLASS, 1)},
                [("container-0-request-0", drv, "gpu-3", {})],
                extended=True,
            )
            self.dra_pod("ext-0", [("ext", claim)], run_for=2 * u, units={GPU: 1})

        self.at(s + 70, extended)

        def deleted() -> None:
            claim = template("dra-del-0", gpu, ["gpu-0"])
            self.dra_pod("dra-del-0", [("gpu", claim)], run_for=u, delete_grace=30)

        self.at(s + 5 * u, deleted)

    def add_quota(self, ns: str, hard: dict[str, str], scopes: list[str]) -> None:
        spec: Obj = {"hard": dict(hard)}
        if scopes:
            spec["scopes"] = list(scopes)
        obj: Obj = {
            "kind": "ResourceQuota",
            "apiVersion": "v1",
            "metadata": self.meta("gpu-quota", ns),
            "spec": spec,
            "status": {"hard": dict(hard), "used": {k: "0" for k in hard}},
        }
        self.quotas[ns] = obj
        _written(obj, "kubectl-client-side-apply", None, self.now)
        _written(obj, "kube-controller-manager", "status", self.now)
        self.emit("ADDED", obj)
        self.record_quota(ns, obj)

    def record_quota(self, ns: str, quota: Obj) -> None:
        """The quota's GPU figures as written now (the truth of quota history and peaks)."""
        status = quota["status"]
        for key, hard in status["hard"].items():
            if key.startswith("requests.nvidia.com/") or key.endswith("/devices"):
                used = int(status["used"].get(key, "0"))
                self.quota_history.append((self.now, ns, key, used, int(hard)))

    def refusal(
        self, ns: str, name: str, units: dict[str, int], best_effort: bool, headroom: int = 0
    ) -> str | None:
        """Quota admission of a new pod: the server's message when a quota refuses it
        (``headroom`` GPUs kept free of the quota's ``requests.nvidia.com/gpu``)."""
        quota = self.quotas.get(ns)
        if quota is None or not units:
            return None
        if best_effort and "NotBestEffort" in quota["spec"].get("scopes", []):
            return None  # the scope does not match the pod: not counted, not limited
        requested = {f"requests.{r}": n for r, n in units.items()}
        hard = dict(quota["status"]["hard"])
        if headroom and f"requests.{GPU}" in hard:
            hard[f"requests.{GPU}"] = str(int(hard[f"requests.{GPU}"]) - headroom)
        why = quota_refusal(quota["metadata"]["name"], hard, quota["status"]["used"], requested)
        return f'pods "{name}" is forbidden: {why}' if why else None

    def refresh_quota(self, ns: str) -> None:
        """The quota controller: used = requests of the namespace's live, non-terminal pods."""
        quota = self.quotas.get(ns)
        if quota is None:
            return
        scopes = quota["spec"].get("scopes", [])
        used: dict[str, int] = defaultdict(int)
        for p in self.pods.values():
            if p.deleted or p.terminal or p.obj["metadata"]["namespace"] != ns:
                continue
            if "NotBestEffort" in scopes and p.obj["status"].get("qosClass") == "BestEffort":
                continue
            for r, n in p.units.items():
                used[f"requests.{r}"] += n
        new = {
            k: str(used.get(k, 0)) if k.startswith("requests.nvidia") else v
            for k, v in quota["status"]["used"].items()
        }
        if new != quota["status"]["used"]:
            quota["status"]["used"] = new
            _written(quota, "kube-controller-manager", "status", self.now)
            self.emit("MODIFIED", quota)
            self.record_quota(ns, quota)

    # -- pods

    def pod_spec(self, units: dict[str, int], shape: str, cpu: bool) -> Obj:
        """Containers whose effective GPU request is exactly ``units``, in the given shape."""
        rs = dict(units)
        extra: dict[str, str] = {"cpu": "4", "memory": "16Gi"} if cpu else {}

        def res(gpus: dict[str, int], limits_only: bool = False) -> Obj:
            g = {r: str(n) for r, n in gpus.items() if n}
            out: Obj = {"limits": {**extra, **g}}
            if not limits_only:
                out["requests"] = {**extra, **g}
            return out

        def container(name: str, gpus: dict[str, int], **kw: Any) -> Obj:
            return {
                "name": name,
                "image": f"registry.example/{name}:1.0",
                "resources": res(gpus, kw.pop("limits_only", False)),
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
                **kw,
            }

        spec: Obj = {
            "restartPolicy": "Never",
            "schedulerName": "default-scheduler",
            "terminationGracePeriodSeconds": 30,
            "serviceAccountName": "default",
            "priority": 0,
            "enableServiceLinks": True,
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
        }
        if shape == "limits-only":
            spec["containers"] = [container("train", rs, limits_only=True)]
        elif shape == "two-containers" and all(n >= 2 for n in rs.values()):
            a = {r: n // 2 for r, n in rs.items()}
            b = {r: n - n // 2 for r, n in rs.items()}
            spec["containers"] = [container("train", a), container("helper", b)]
        elif shape == "init-peak":
            # a non-sidecar init container asks for more than the app: the init peak wins
            app = {r: max(1, n - 1) if n > 1 else 1 for r, n in rs.items()}
            init = dict(rs)
            if any(n == 1 for n in rs.values()):
                app = dict(rs)
            spec["initContainers"] = [container("warmup", init)]
            spec["containers"] = [container("train", app)]
        elif shape == "sidecar" and all(n >= 2 for n in rs.values()):
            # sidecar (1) + app (n-1); an init after the sidecar asks n-1, peak n-1+1 = n
            side = {r: 1 for r in rs}
            app = {r: n - 1 for r, n in rs.items()}
            spec["initContainers"] = [
                container("proxy", side, restartPolicy="Always"),
                container("fetch", app),
            ]
            spec["containers"] = [container("train", app)]
        elif shape == "overhead":
            spec["containers"] = [container("train", rs)]
            spec["overhead"] = {"cpu": "250m", "memory": "120Mi"}
            spec["runtimeClassName"] = "kata"
        else:
            spec["containers"] = [container("train", rs)]
        return spec

    def new_pod(
        self,
        ns: str,
        name: str,
        units: dict[str, int],
        fate: str,
        *,
        shape: str | None = None,
        owner: str = "Job",
        resource_claims: list[Obj] | None = None,
        headroom: int = 0,
    ) -> _Pod | None:
        """The pod as created, or None where quota admission refused it (no object, no
        event: the client got a 403). ``headroom`` GPUs of the quota are left unrequested."""
        shape = shape or self.rng.choice(
            ["plain", "plain", "limits-only", "two-containers", "init-peak", "sidecar", "overhead"]
        )
        cpu = self.rng.random() < 0.7
        refused = self.refusal(ns, name, {r: n for r, n in units.items() if n}, not cpu, headroom)
        if refused is not None:
            self.refused.append((self.now, ns, name, refused))
            return None
        meta = self.meta(name, ns, created=self.now)
        meta["labels"] = {"app": name.rsplit("-", 1)[0]}
        if owner:
            meta["ownerReferences"] = [
                {
                    "apiVersion": "apps/v1" if owner == "StatefulSet" else "batch/v1",
                    "kind": owner,
                    "name": name.rsplit("-", 1)[0],
                    "uid": self.uid(),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ]
        obj: Obj = {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": meta,
            "spec": self.pod_spec(units, shape, cpu),
            "status": {"phase": "Pending", "qosClass": "Guaranteed" if cpu else "BestEffort"},
        }
        if resource_claims:
            obj["spec"]["resourceClaims"] = resource_claims
            for c in obj["spec"]["containers"]:
                c["resources"]["claims"] = [{"name": rc["name"]} for rc in resource_claims]
        pod = _Pod(obj, {r: n for r, n in units.items() if n}, fate=fate)
        self.pods[pod.uid] = pod
        self.emit("ADDED", obj)
        self.refresh_quota(ns)
        return pod

    def container_names(self, pod: _Pod) -> tuple[list[str], list[str]]:
        spec = pod.obj["spec"]
        inits = [c["name"] for c in spec.get("initContainers", [])]
        return inits, [c["name"] for c in spec["containers"]]

    def unschedulable(self, pod: _Pod) -> None:
        pod.obj["status"]["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/7 nodes are available: insufficient GPU resources.",
                "lastTransitionTime": rfc3339(self.now),
            }
        ]
        self.emit("MODIFIED", pod.obj)

    def find_node(self, pod: _Pod, pinned: str | None = None) -> str | None:
        names = [pinned] if pinned else [n.name for n in NODES if n.name != DOOMED_NODE]
        self.rng.shuffle(names)
        for name in names:
            spec = self.specs[name]
            if not self.node_alive.get(name):
                continue
            if all(
                r in spec.gpus and self.bound[(name, r)] + n <= spec.gpus[r][0]
                for r, n in pod.units.items()
            ):
                return name
        return None

    def bind(self, pod: _Pod, node: str) -> None:
        """Scheduler binds: GPUs are reserved on the node (billing starts with startTime)."""
        pod.node = node
        for r, n in pod.units.items():
            self.bound[(node, r)] += n
        pod.obj["spec"]["nodeName"] = node
        pod.obj["status"]["conditions"] = [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": rfc3339(self.now)}
        ]
        self.emit("MODIFIED", pod.obj)

    def accept(self, pod: _Pod) -> None:
        """Kubelet accepts the pod: status.startTime, containers still being created."""
        if pod.deleted:
            return
        pod.start = self.now
        self.dra_hold(pod)
        inits, mains = self.container_names(pod)
        st = pod.obj["status"]
        st["startTime"] = rfc3339(self.now)
        st["hostIP"] = "192.168.0.10"
        st["podIP"] = f"10.244.{self.rng.randrange(256)}.{self.rng.randrange(1, 255)}"
        st["containerStatuses"] = [
            {
                "name": c,
                "state": {"waiting": {"reason": "ContainerCreating"}},
                "ready": False,
                "restartCount": 0,
                "image": f"registry.example/{c}:1.0",
                "imageID": "",
            }
            for c in mains
        ]
        if inits:
            st["initContainerStatuses"] = [
                {
                    "name": c,
                    "state": {"waiting": {"reason": "PodInitializing"}},
                    "ready": False,
                    "restartCount": 0,
                    "image": f"registry.example/{c}:1.0",
                    "imageID": "",
                }
                for c in inits
            ]
        self.emit("MODIFIED", pod.obj)

    def running(self, pod: _Pod) -> None:
        if pod.deleted or pod.terminal:
            return
        t = rfc3339(self.now)
        st = pod.obj["status"]
        st["phase"] = "Running"
        for cs in st.get("initContainerStatuses", []):
            sidecar = any(
                c["name"] == cs["name"] and c.get("restartPolicy") == "Always"
                for c in pod.obj["spec"].get("initContainers", [])
            )
            cs["state"] = (
                {"running": {"startedAt": t}}
                if sidecar
                else {
                    "terminated": {
                        "exitCode": 0,
                        "reason": "Completed",
                        "startedAt": st["startTime"],
                        "finishedAt": t,
                        "containerID": f"containerd://{self.uid().replace('-', '')}",
                    }
                }
            )
            cs["ready"] = sidecar
        for cs in st["containerStatuses"]:
            cs["state"] = {"running": {"startedAt": t}}
            cs["ready"] = True
            cs["started"] = True
            cs["containerID"] = f"containerd://{self.uid().replace('-', '')}"
        st["conditions"] = [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": st["startTime"]},
            {"type": "Initialized", "status": "True", "lastTransitionTime": t},
            {"type": "Ready", "status": "True", "lastTransitionTime": t},
            {"type": "ContainersReady", "status": "True", "lastTransitionTime": t},
        ]
        self.emit("MODIFIED", pod.obj)

    def restart_container(self, pod: _Pod) -> None:
        """A container restarts in place: the pod keeps its GPUs (interval unchanged)."""
        if pod.deleted or pod.terminal or pod.obj["status"].get("phase") != "Running":
            return
        cs = pod.obj["status"]["containerStatuses"][0]
        prev = cs["state"].get("running", {}).get("startedAt", rfc3339(self.now))
        cs["lastState"] = {
            "terminated": {
                "exitCode": 137,
                "reason": "OOMKilled",
                "startedAt": prev,
                "finishedAt": rfc3339(self.now),
            }
        }
        cs["state"] = {"running": {"startedAt": rfc3339(self.now)}}
        cs["restartCount"] = cs.get("restartCount", 0) + 1
        self.emit("MODIFIED", pod.obj)

    def release(self, pod: _Pod, reason: str) -> None:
        """The generator's own record of the GPUs coming free: the truth."""
        if pod.released:
            return
        pod.released = True
        if pod.node is not None:
            for r, n in pod.units.items():
                self.bound[(pod.node, r)] -= n
        if pod.start is None or pod.node is None:
            return
        self.dra_release(pod)
        for r, n in sorted(pod.units.items()):
            self.intervals.append(
                TruthInterval(
                    pod.uid,
                    pod.obj["metadata"]["namespace"],
                    pod.obj["metadata"]["name"],
                    pod.node,
                    r,
                    n,
                    self.factor(pod.node, r),
                    pod.start,
                    self.now,
                    reason,
                )
            )

    def finish(self, pod: _Pod, ok: bool, with_finished_at: bool = True) -> None:
        if pod.deleted or pod.terminal:
            return
        t = rfc3339(self.now)
        st = pod.obj["status"]
        pod.terminal = True
        st["phase"] = "Succeeded" if ok else "Failed"
        if with_finished_at:
            # every container (sidecars too) ends in this same second, so the latest
            # finishedAt is unambiguous
            for cs in st.get("containerStatuses", []) + st.get("initContainerStatuses", []):
                if "running" in cs["state"] or "waiting" in cs["state"]:
                    cs["state"] = {
                        "terminated": {
                            "exitCode": 0 if ok else 1,
                            "reason": "Completed" if ok else "Error",
                            "startedAt": cs["state"]
                            .get("running", {})
                            .get("startedAt", st.get("startTime", t)),
                            "finishedAt": t,
                            "containerID": cs.get("containerID", ""),
                        }
                    }
                cs["ready"] = False
        else:
            # evicted: the kubelet reports the phase without container end times
            st["reason"] = "Evicted"
            st["message"] = "The node was low on resource: ephemeral-storage."
            st.pop("containerStatuses", None)
            st.pop("initContainerStatuses", None)
        st["conditions"] = [
            c for c in st.get("conditions", []) if c["type"] not in ("Ready", "ContainersReady")
        ]
        self.release(pod, "terminated")
        self.emit("MODIFIED", pod.obj)
        self.refresh_quota(pod.obj["metadata"]["namespace"])

    def request_delete(self, pod: _Pod, grace: int, lag: int) -> None:
        """A delete request now with ``grace`` seconds; the object goes away ``lag`` s later.

        deletionTimestamp = now + grace is already the deadline; the DELETED event comes when
        the kubelet (or a finalizer) lets go, which can be before or after it.
        """
        if pod.deleted:
            return
        if pod.obj["spec"].get("nodeName") is None or pod.terminal:
            grace = 0  # unscheduled or finished pods are deleted at once
        if self.independent and grace > 0 and lag < grace:
            lag = grace  # the DELETED event never comes before the deadline in this mode
        meta = pod.obj["metadata"]
        meta["deletionTimestamp"] = rfc3339(self.now + grace)
        meta["deletionGracePeriodSeconds"] = grace
        deadline = self.now + grace
        if grace == 0 or lag == 0:
            self.remove(pod, deadline)
            return
        self.emit("MODIFIED", pod.obj)
        self.at(self.now + lag, lambda: self.remove(pod, deadline))

    def remove(self, pod: _Pod, deadline: int) -> None:
        if pod.deleted:
            return
        pod.deleted = True
        if not pod.terminal:
            # the earliest of the deadline and the DELETED event ends the binding
            saved = self.now
            self.now = min(saved, deadline)
            self.release(pod, "deleted")
            self.now = saved
        self.emit("DELETED", pod.obj)
        self.refresh_quota(pod.obj["metadata"]["namespace"])
        if pod.after_delete is not None:
            self.at(self.now + 5, pod.after_delete)

    def delete_node(self, name: str, gc_lag: int) -> None:
        """The node object goes; pod GC force-deletes its pods ``gc_lag`` seconds later."""
        self.node_alive[name] = False
        node = self.nodes[name]
        self.capacity = [
            (n, model, pool, gpus, lo, self.now if n == name and hi is None else hi)
            for n, model, pool, gpus, lo, hi in self.capacity
        ]
        self.emit("DELETED", node)
        doomed = [p for p in self.pods.values() if p.node == name and not p.deleted]
        for p in doomed:
            if not p.terminal:
                self.release(p, "node_deleted")
        when = self.now + gc_lag

        def gc() -> None:
            for p in doomed:
                if not p.deleted:
                    p.obj["metadata"]["deletionTimestamp"] = rfc3339(self.now)
                    p.obj["metadata"]["deletionGracePeriodSeconds"] = 0
                    p.deleted = True
                    self.emit("DELETED", p.obj)
                    self.refresh_quota(p.obj["metadata"]["namespace"])

        if gc_lag == 0:
            gc()
        else:
            self.at(when, gc)

    # -- lifecycles

    def lifecycle(
        self, pod: _Pod, *, pinned: str | None = None, run_for: int | None = None
    ) -> None:
        """Schedule the pod's future according to its fate."""
        rng = self.rng
        fate = pod.fate
        if fate in ("never_scheduled", "deleted_pending"):
            self.at(self.now + rng.randint(1, 5), lambda: self.unschedulable(pod))
            if fate == "deleted_pending":
                self.at(self.now + rng.randint(60, 900), lambda: self.request_delete(pod, 30, 0))
            return
        node = self.find_node(pod, pinned)
        if node is None:
            pod.fate = "never_scheduled"
            self.at(self.now + 1, lambda: self.unschedulable(pod))
            self.at(self.now + rng.randint(120, 1800), lambda: self.request_delete(pod, 30, 0))
            return
        self.bind(pod, node)
        t_accept = self.now + rng.randint(1, 3)
        self.at(t_accept, lambda: self.accept(pod))
        if fate == "deleted_pulling":
            # startTime is set, the image is still pulling: charged until the deletion
            self.at(t_accept + rng.randint(5, 60), lambda: self.request_delete(pod, 30, 0))
            return
        t_run = t_accept + rng.randint(2, 60)
        self.at(t_run, lambda: self.running(pod))
        span = self.end - self.start
        dur = run_for or rng.randint(max(60, span // 60), max(120, span // 3))
        t_end = t_run + dur
        if rng.random() < 0.3:
            self.at(t_run + rng.randint(1, max(1, dur - 1)), lambda: self.restart_container(pod))
        if fate == "succeeded":
            self.at(t_end, lambda: self.finish(pod, True))
            self.at(t_end + rng.randint(30, 600), lambda: self.request_delete(pod, 0, 0))
        elif fate == "failed":
            self.at(t_end, lambda: self.finish(pod, False))
        elif fate == "evicted":
            self.at(t_end, lambda: self.finish(pod, False, with_finished_at=self.independent))
        elif fate == "deleted_running":
            grace = rng.choice([0, 30, 30, 60])
            if self.independent:
                lag = rng.choice([grace, grace + rng.randint(1, 120)])  # finalizer holds it
            else:
                lag = rng.choice([max(1, grace // 3), grace, grace + rng.randint(1, 120)])
            self.at(t_end, lambda: self.request_delete(pod, grace, lag))
        # "running": still running when the span ends; "node_deleted": ended by delete_node

    def arrive(self, ns: str, name: str, units: dict[str, int], fate: str, **kw: Any) -> None:
        pinned = kw.pop("pinned", None)
        run_for = kw.pop("run_for", None)
        after_delete = kw.pop("after_delete", None)
        pod = self.new_pod(ns, name, units, fate, **kw)
        if pod is None:
            return  # refused: a real Job controller would retry later; this one gives up
        pod.after_delete = after_delete
        self.lifecycle(pod, pinned=pinned, run_for=run_for)

    def random_pod(self) -> None:
        rng = self.rng
        ns = rng.choice(["team-a", "team-a", "team-b", "ml-research", "batch", "default"])
        if rng.random() < 0.15:
            units: dict[str, int] = {}  # a CPU-only pod: noise the controller must ignore
        else:
            r = rng.choice([GPU, GPU, GPU, GPU_SHARED, MIG_1G, MIG_3G])
            n = {
                GPU: rng.choice([1, 1, 2, 4, 8]),
                GPU_SHARED: 1,
                MIG_1G: rng.choice([1, 2]),
                MIG_3G: 1,
            }[r]
            units = {r: n}
        fate = rng.choices(
            [
                "succeeded",
                "failed",
                "deleted_running",
                "running",
                "deleted_pending",
                "never_scheduled",
                "deleted_pulling",
                "evicted",
            ],
            weights=[30, 8, 15, 10, 5, 3, 3, 3],
        )[0]
        base = rng.choice(["train", "eval", "infer", "notebook", "etl"])
        self.names[(ns, base)] += 1
        name = f"{base}-{self.names[(ns, base)]:04d}-{rng.randrange(16**5):05x}"
        self.arrive(ns, name, units, fate, headroom=SCRIPTED_HEADROOM.get(ns, 0))

    def run(self) -> None:
        rng = self.rng
        for spec in NODES:
            self.add_node(spec)
        for ns, labels in NAMESPACES.items():
            self.add_namespace(ns, labels)
        for ns, (hard, scopes) in QUOTAS.items():
            self.add_quota(ns, hard, scopes)
        if self.dra:
            self.add_dra_objects()
            self.dra_script()
        span = self.end - self.start
        # scripted pods: every case appears whatever the seed
        s = self.start
        # name reuse: trainer-0 comes back with a new UID after its deletion
        self.at(
            s + 5,
            lambda: self.arrive(
                "team-a",
                "trainer-0",
                {GPU: 2},
                "deleted_running",
                shape="plain",
                owner="StatefulSet",
                run_for=span // 6,
                after_delete=lambda: self.arrive(
                    "team-a", "trainer-0", {GPU: 2}, "running", shape="plain", owner="StatefulSet"
                ),
            ),
        )
        self.at(
            s + 7,
            lambda: self.arrive(
                "team-b",
                "shared-0",
                {GPU_SHARED: 1},
                "succeeded",
                shape="limits-only",
                run_for=span // 5,
            ),
        )
        self.at(
            s + 9,
            lambda: self.arrive(
                "ml-research",
                "mig-small",
                {MIG_1G: 2},
                "succeeded",
                shape="plain",
                run_for=span // 4,
            ),
        )
        self.at(
            s + 11,
            lambda: self.arrive("ml-research", "mig-big", {MIG_3G: 1}, "running", shape="overhead"),
        )
        self.at(
            s + 13,
            lambda: self.arrive(
                "team-a", "sidecar-job", {GPU: 3}, "failed", shape="sidecar", run_for=span // 5
            ),
        )
        self.at(
            s + 15,
            lambda: self.arrive(
                "batch", "init-job", {GPU: 2}, "succeeded", shape="init-peak", run_for=span // 5
            ),
        )
        self.at(
            s + 17,
            lambda: self.arrive("team-b", "too-big", {GPU: 16}, "never_scheduled", shape="plain"),
        )
        self.at(
            s + 19,
            lambda: self.arrive(
                "team-a",
                "ts-job",
                {GPU: 2},
                "running",
                shape="two-containers",
                pinned="gpu-a100-ts-0",
            ),
        )
        # the doomed node: pods running on it when it is deleted at 70% of the span
        t_node = s + span * 7 // 10
        self.at(
            t_node - span // 5,
            lambda: self.arrive(
                "team-b", "l4-infer-0", {GPU: 1}, "node_deleted", pinned=DOOMED_NODE
            ),
        )
        self.at(
            t_node - span // 6,
            lambda: self.arrive(
                "batch", "l4-infer-1", {GPU: 1}, "node_deleted", pinned=DOOMED_NODE
            ),
        )
        self.at(
            t_node,
            lambda: self.delete_node(DOOMED_NODE, 0 if self.independent else rng.randint(5, 40)),
        )
        self.at(s + span // 2, lambda: self.relabel_namespace(*RELABEL))
        # random arrivals (Poisson)
        t = float(s + 30)
        rate = self.pods_per_hour / 3600.0
        while rate > 0:
            t += rng.expovariate(rate)
            if t >= self.end - 60:
                break
            self.at(int(t), self.random_pod)
        while self.queue:
            action = heapq.heappop(self.queue)
            self.now = action.at
            action.run()
            self.flush_dra()
        self.now = self.end
        # what is still bound at the end of the span stays open in the truth
        for pod in self.pods.values():
            if not pod.released and pod.start is not None and pod.node is not None:
                for r, n in sorted(pod.units.items()):
                    self.intervals.append(
                        TruthInterval(
                            pod.uid,
                            pod.obj["metadata"]["namespace"],
                            pod.obj["metadata"]["name"],
                            pod.node,
                            r,
                            n,
                            self.factor(pod.node, r),
                            pod.start,
                            None,
                            "open",
                        )
                    )
        for claim in self.claims.values():
            if claim.holders:
                self.dra_intervals.extend(claim.truth(claim.open_since, None))
                self.dra_shares(claim, None)


def generate(
    seed: int,
    hours: float = 2.0,
    *,
    start: int = DEFAULT_START,
    pods_per_hour: float = 30.0,
    observation_independent: bool = False,
    dra: bool = False,
) -> Workload:
    """Generate a workload; the same arguments always give the same events and truth.

    ``dra`` adds a node whose GPUs NVIDIA's DRA driver hands out and the DRA team's pods and
    ResourceClaims (see _Sim.dra_script); their charged time is ``truth.dra_intervals``."""
    end = start + int(hours * 3600)
    if end - start < 600:
        raise ValueError("the simulated span must be at least 10 minutes")
    sim = _Sim(seed, start, end, pods_per_hour, observation_independent, dra)
    sim.run()
    return Workload(
        seed,
        start,
        end,
        sim.events,
        Truth(
            end,
            sim.intervals,
            sim.ns_labels,
            sim.dra_intervals,
            sim.dra_pod_shares,
            sim.quota_history,
            sim.capacity,
            sim.refused,
        ),
    )


EXAMPLES = """\
examples:
  python -m gpuquota.sim.workload --seed 1 --hours 2 > events.jsonl
  python -m gpuquota.sim.workload --seed 7 --hours 48 --truth truth.json | gpuquota replay - --migrate

""" + exitcodes.help_text()


def _hours(text: str) -> float:
    try:
        hours = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of hours") from None
    if not 0 < hours <= 24 * 366:
        raise argparse.ArgumentTypeError(f"{text!r}: give between 0 and a year of hours")
    return hours


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="python -m gpuquota.sim.workload",
        description=(__doc__ or "").split("\n")[0],
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_version(p)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--hours", type=_hours, default=2.0, help="simulated span (default 2)")
    p.add_argument(
        "--start", type=int, default=DEFAULT_START, help="unix seconds (default 2026-01-01)"
    )
    p.add_argument("--pods-per-hour", type=float, default=30.0)
    p.add_argument("--observation-independent", action="store_true")
    p.add_argument(
        "--dra",
        action="store_true",
        help="add a DRA node and the DRA team's pods and ResourceClaims",
    )
    p.add_argument("--truth", metavar="FILE", help="also write the truth as JSON to FILE")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        wl = generate(
            args.seed,
            args.hours,
            start=args.start,
            pods_per_hour=args.pods_per_hour,
            observation_independent=args.observation_independent,
            dra=args.dra,
        )
    except ValueError as exc:
        print(f"python -m gpuquota.sim.workload: error: {exc}", file=sys.stderr)
        return 2
    out = sys.stdout
    for line in wl.lines():
        out.write(line + "\n")
    if args.truth:
        with open(args.truth, "w") as f:
            json.dump(wl.truth.to_json(), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
