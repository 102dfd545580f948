"""The GPU accounting rules (docs/accounting.md), as pure functions of Kubernetes objects.

Objects are plain dicts in Kubernetes JSON form (camelCase). Nothing here does I/O or keeps
state: the engine (quota/engine.py) feeds events through these functions and decides what to
store. Malformed objects raise :class:`AccountingError` naming the field, so the replay
command can reject a bad line before anything is written.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

DEFAULT_GPU_RESOURCES: tuple[str, ...] = ("nvidia.com/gpu", "nvidia.com/gpu.shared", "amd.com/gpu")
DEFAULT_GPU_PREFIXES: tuple[str, ...] = ("nvidia.com/mig-",)
# Labels that name a node's pool on the common managed Kubernetes offerings, first match wins.
DEFAULT_NODE_POOL_LABELS: tuple[str, ...] = (
    "cloud.google.com/gke-nodepool",
    "eks.amazonaws.com/nodegroup",
    "karpenter.sh/nodepool",
    "kubernetes.azure.com/agentpool",
    "agentpool",
    "node.kubernetes.io/pool",
)
# Compute slices of one GPU that support MIG (A100, H100, H200, B200 all have 7).
DEFAULT_MIG_SLICES = 7

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})

# End reasons stored in Allocation.end_reason.
END_TERMINATED = "terminated"
END_DELETION_TIMESTAMP = "deletion_timestamp"
END_DELETED = "deleted"
END_NODE_DELETED = "node_deleted"
END_VANISHED = "vanished"
# Which measured reason names an end when several give the same second: the first listed.
# billing_end and the store's merge of a later observation both follow it, so the stored
# reason does not depend on the order events arrive in.
END_REASON_PRECEDENCE = (END_TERMINATED, END_DELETION_TIMESTAMP, END_DELETED, END_NODE_DELETED)

# The node labels recorded with an interval (GPU feature discovery's names).
LABEL_PRODUCT = "nvidia.com/gpu.product"
LABEL_COUNT = "nvidia.com/gpu.count"
LABEL_REPLICAS = "nvidia.com/gpu.replicas"
LABEL_SHARING = "nvidia.com/gpu.sharing-strategy"
LABEL_MIG_STRATEGY = "nvidia.com/mig.strategy"
RECORDED_NODE_LABELS = (
    LABEL_PRODUCT,
    LABEL_COUNT,
    LABEL_REPLICAS,
    LABEL_SHARING,
    LABEL_MIG_STRATEGY,
)

_MIG_PROFILE = re.compile(r"^(\d+)g\.(\d+)gb(?:\+.*)?$")
_MIG_PRODUCT = re.compile(r"^(?P<model>.+)-MIG-(?P<profile>\d+g\.\d+gb(?:\+\S*)?)$")


class AccountingError(ValueError):
    """A Kubernetes object that the rules cannot read; the message names the field."""


@dataclass(frozen=True)
class AccountingConfig:
    """What counts as a GPU and how partitions convert to physical GPUs."""

    gpu_resources: tuple[str, ...] = DEFAULT_GPU_RESOURCES
    gpu_resource_prefixes: tuple[str, ...] = DEFAULT_GPU_PREFIXES
    node_pool_labels: tuple[str, ...] = DEFAULT_NODE_POOL_LABELS
    mig_slices: int = DEFAULT_MIG_SLICES
    # per-profile override of the physical share of one MIG instance, e.g. {"1g.10gb": 0.125}
    mig_profile_share: Mapping[str, float] = field(default_factory=dict)

    def is_gpu(self, resource_name: str) -> bool:
        return resource_name in self.gpu_resources or any(
            resource_name.startswith(p) for p in self.gpu_resource_prefixes
        )


DEFAULT_CONFIG = AccountingConfig()


# ---------------------------------------------------------------------------------------------
# Parsing helpers


def parse_time(value: Any, where: str) -> int | None:
    """RFC 3339 timestamp (as Kubernetes serves it) -> unix seconds, floored; None stays None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise AccountingError(f"{where}: expected an RFC 3339 timestamp, got {value!r}")
    if isinstance(value, int | float):
        return math.floor(value)
    seconds = _parse_rfc3339(value)
    if seconds is None:
        raise AccountingError(f"{where}: not an RFC 3339 timestamp: {value!r}")
    return seconds


@functools.lru_cache(maxsize=1 << 16)
def _parse_rfc3339(value: str) -> int | None:
    # objects repeat the same few timestamps many times: parse each once
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return math.floor(parsed.timestamp())


def format_time(seconds: int) -> str:
    """Unix seconds -> RFC 3339 in UTC, the way Kubernetes writes it."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_SUFFIXES: dict[str, Decimal | int] = {
    "": 1,
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_QUANTITY = re.compile(
    r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?)$"
)


def parse_quantity(value: Any, where: str) -> Decimal:
    """A Kubernetes resource quantity ("2", "500m", "1Gi", 3) as an exact Decimal."""
    if isinstance(value, bool):
        raise AccountingError(f"{where}: expected a quantity, got {value!r}")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(str(value))
    if not isinstance(value, str):
        raise AccountingError(f"{where}: expected a quantity, got {value!r}")
    match = _QUANTITY.match(value.strip())
    if match is None:
        raise AccountingError(f"{where}: not a Kubernetes quantity: {value!r}")
    try:
        number = Decimal(match.group(1))
    except InvalidOperation:  # pragma: no cover - the regex admits only valid numbers
        raise AccountingError(f"{where}: not a Kubernetes quantity: {value!r}") from None
    return number * _SUFFIXES[match.group(2)]


def _units(value: Any, where: str) -> int:
    """Extended resources are whole numbers; round a fractional one up like the scheduler would
    refuse to split it."""
    quantity = parse_quantity(value, where)
    if quantity < 0:
        raise AccountingError(f"{where}: negative quantity {value!r}")
    return math.ceil(quantity)


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise AccountingError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def _sequence(value: Any, where: str) -> Sequence[Any]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise AccountingError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _str(value: Any, where: str, *, required: bool = False) -> str | None:
    if value is None:
        if required:
            raise AccountingError(f"{where}: missing")
        return None
    if not isinstance(value, str):
        raise AccountingError(f"{where}: expected a string, got {value!r}")
    return value


def _int_label(labels: Mapping[str, str], key: str) -> int | None:
    value = labels.get(key)
    if value is None:
        return None
    try:
        number = int(str(value).strip())
    except ValueError:
        return None  # a label someone typed by hand must not stop accounting
    return number if number > 0 else None


# ---------------------------------------------------------------------------------------------
# Effective request


@dataclass(frozen=True)
class PodRequest:
    """A pod's effective GPU request per resource name, and whether it escapes quota scopes."""

    units: Mapping[str, int]
    qos_class: str
    # a pod that requests GPUs but no cpu/memory is BestEffort, so a NotBestEffort-scoped
    # ResourceQuota does not count it: the report warns about it
    best_effort_gpu: bool

    @property
    def warnings(self) -> tuple[str, ...]:
        if self.best_effort_gpu:
            return ("GPU pod is BestEffort (no cpu/memory requests): NotBestEffort quotas miss it",)
        return ()


def _container_units(
    container: Mapping[str, Any], where: str, config: AccountingConfig
) -> dict[str, int]:
    resources = _mapping(container.get("resources"), f"{where}.resources")
    requests = _mapping(resources.get("requests"), f"{where}.resources.requests")
    limits = _mapping(resources.get("limits"), f"{where}.resources.limits")
    units: dict[str, int] = {}
    # the API server defaults an extended resource's request to its limit; read the admitted
    # request and fall back to the limit only for an object that never went through admission
    for name in {*requests, *limits}:
        if not config.is_gpu(name):
            continue
        if name in requests:
            units[name] = _units(requests[name], f"{where}.resources.requests[{name!r}]")
        else:
            units[name] = _units(limits[name], f"{where}.resources.limits[{name!r}]")
    return units


def _add(total: dict[str, int], more: Mapping[str, int]) -> None:
    for name, value in more.items():
        total[name] = total.get(name, 0) + value


def _max(total: dict[str, int], other: Mapping[str, int]) -> None:
    for name, value in other.items():
        total[name] = max(total.get(name, 0), value)


def effective_units(
    pod: Mapping[str, Any], config: AccountingConfig = DEFAULT_CONFIG
) -> dict[str, int]:
    """Effective GPU request per resource, as the scheduler and quota compute it.

    app = regular containers + sidecars (init containers with restartPolicy Always);
    init peak = max over init containers of its request + the sidecars started before it;
    effective = max(app, init peak) + spec.overhead. Zero entries are left out.
    """
    spec = _mapping(pod.get("spec"), "spec")
    app: dict[str, int] = {}
    for i, container in enumerate(_sequence(spec.get("containers"), "spec.containers")):
        _add(
            app,
            _container_units(
                _mapping(container, f"spec.containers[{i}]"), f"spec.containers[{i}]", config
            ),
        )
    init_peak: dict[str, int] = {}
    sidecars: dict[str, int] = {}
    for i, container in enumerate(_sequence(spec.get("initContainers"), "spec.initContainers")):
        where = f"spec.initContainers[{i}]"
        container = _mapping(container, where)
        units = _container_units(container, where, config)
        if container.get("restartPolicy") == "Always":
            _add(app, units)
            _add(sidecars, units)
            _max(init_peak, sidecars)
        else:
            step = dict(units)
            _add(step, sidecars)
            _max(init_peak, step)
    effective = dict(app)
    _max(effective, init_peak)
    overhead = _mapping(spec.get("overhead"), "spec.overhead")
    for name, value in overhead.items():
        if config.is_gpu(name):
            effective[name] = effective.get(name, 0) + _units(value, f"spec.overhead[{name!r}]")
    return {name: value for name, value in sorted(effective.items()) if value > 0}


def qos_class(pod: Mapping[str, Any]) -> str:
    """The pod's QoS class: the one the API server put in status, else computed like it does
    (only cpu and memory count)."""
    status = _mapping(pod.get("status"), "status")
    served = status.get("qosClass")
    if isinstance(served, str) and served:
        return served
    spec = _mapping(pod.get("spec"), "spec")
    containers = [
        *_sequence(spec.get("containers"), "spec.containers"),
        *_sequence(spec.get("initContainers"), "spec.initContainers"),
    ]
    any_set = False
    guaranteed = True
    for container in containers:
        resources = _mapping(_mapping(container, "container").get("resources"), "resources")
        requests = _mapping(resources.get("requests"), "resources.requests")
        limits = _mapping(resources.get("limits"), "resources.limits")
        for name in ("cpu", "memory"):
            request = requests.get(name)
            limit = limits.get(name)
            if request is not None or limit is not None:
                any_set = True
            if limit is None or (
                request is not None and parse_quantity(request, name) != parse_quantity(limit, name)
            ):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def pod_request(pod: Mapping[str, Any], config: AccountingConfig = DEFAULT_CONFIG) -> PodRequest:
    units = effective_units(pod, config)
    qos = qos_class(pod)
    return PodRequest(
        units=units, qos_class=qos, best_effort_gpu=bool(units) and qos == "BestEffort"
    )


# ---------------------------------------------------------------------------------------------
# Pod facts and the two views


@dataclass(frozen=True)
class PodFacts:
    """What the rules need from one pod object, validated once."""

    uid: str
    namespace: str
    name: str
    node: str | None
    owner_kind: str | None
    owner_name: str | None
    phase: str | None
    created_at: int | None
    started_at: int | None  # status.startTime: the kubelet accepted the bound pod
    finished_at: int | None  # latest container state.terminated.finishedAt
    deletion_at: int | None  # metadata.deletionTimestamp (already includes the grace period)
    deletion_grace_seconds: int | None
    request: PodRequest

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES


def _owner(meta: Mapping[str, Any], labels: Mapping[str, Any]) -> tuple[str | None, str | None]:
    refs = [
        _mapping(r, "metadata.ownerReferences[]")
        for r in _sequence(meta.get("ownerReferences"), "metadata.ownerReferences")
    ]
    if not refs:
        return None, None
    ref = next((r for r in refs if r.get("controller") is True), refs[0])
    kind = _str(ref.get("kind"), "metadata.ownerReferences[].kind")
    name = _str(ref.get("name"), "metadata.ownerReferences[].name")
    # a Deployment's ReplicaSet is named <deployment>-<pod-template-hash>: bill the Deployment,
    # which outlives its ReplicaSets
    template_hash = labels.get("pod-template-hash")
    if (
        kind == "ReplicaSet"
        and name
        and isinstance(template_hash, str)
        and name.endswith("-" + template_hash)
    ):
        return "Deployment", name[: -len(template_hash) - 1]
    return kind, name


def _latest_finish(status: Mapping[str, Any]) -> int | None:
    latest: int | None = None
    for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
        for i, cs in enumerate(_sequence(status.get(key), f"status.{key}")):
            state = _mapping(
                _mapping(cs, f"status.{key}[{i}]").get("state"), f"status.{key}[{i}].state"
            )
            terminated = _mapping(state.get("terminated"), f"status.{key}[{i}].state.terminated")
            finished = parse_time(
                terminated.get("finishedAt"), f"status.{key}[{i}].state.terminated.finishedAt"
            )
            if finished is not None and (latest is None or finished > latest):
                latest = finished
    return latest


def pod_facts(pod: Mapping[str, Any], config: AccountingConfig = DEFAULT_CONFIG) -> PodFacts:
    """Read and validate the fields of a pod the rules use."""
    if not isinstance(pod, Mapping):
        raise AccountingError("pod: expected an object")
    meta = _mapping(pod.get("metadata"), "metadata")
    spec = _mapping(pod.get("spec"), "spec")
    status = _mapping(pod.get("status"), "status")
    labels = _mapping(meta.get("labels"), "metadata.labels")
    uid = _str(meta.get("uid"), "metadata.uid", required=True)
    name = _str(meta.get("name"), "metadata.name", required=True)
    namespace = _str(meta.get("namespace"), "metadata.namespace") or "default"
    grace = meta.get("deletionGracePeriodSeconds")
    if grace is not None and (isinstance(grace, bool) or not isinstance(grace, int)):
        raise AccountingError(
            f"metadata.deletionGracePeriodSeconds: expected an integer, got {grace!r}"
        )
    owner_kind, owner_name = _owner(meta, labels)
    assert uid is not None and name is not None
    return PodFacts(
        uid=uid,
        namespace=namespace,
        name=name,
        node=_str(spec.get("nodeName"), "spec.nodeName") or None,
        owner_kind=owner_kind,
        owner_name=owner_name,
        phase=_str(status.get("phase"), "status.phase"),
        created_at=parse_time(meta.get("creationTimestamp"), "metadata.creationTimestamp"),
        started_at=parse_time(status.get("startTime"), "status.startTime"),
        finished_at=_latest_finish(status),
        deletion_at=parse_time(meta.get("deletionTimestamp"), "metadata.deletionTimestamp"),
        deletion_grace_seconds=grace,
        request=pod_request(pod, config),
    )


def in_quota_view(facts: PodFacts, now: int) -> bool:
    """Whether ResourceQuota counts the pod at ``now``: not terminal and not past its
    deletionTimestamp + deletionGracePeriodSeconds (Pending and unscheduled pods count)."""
    if facts.terminal:
        return False
    if facts.deletion_at is not None and facts.deletion_grace_seconds is not None:
        return now <= facts.deletion_at + facts.deletion_grace_seconds
    return True


@dataclass(frozen=True)
class EndEvidence:
    """Everything observed so far that can end a pod's billing interval.

    Every field is the earliest such observation: merging evidence takes minimums, so the
    result does not depend on the order in which duplicated or reordered events arrive.
    """

    terminated_at: int | None = None  # terminal: latest container finishedAt, else observed
    deletion_at: int | None = None  # metadata.deletionTimestamp
    deleted_at: int | None = None  # the DELETED event
    node_deleted_at: int | None = None  # the pod's node was deleted
    vanished_at: int | None = None  # gone at a relist: last time it was known to exist

    def merge(self, other: EndEvidence) -> EndEvidence:
        return EndEvidence(
            terminated_at=_min(self.terminated_at, other.terminated_at),
            deletion_at=_min(self.deletion_at, other.deletion_at),
            deleted_at=_min(self.deleted_at, other.deleted_at),
            node_deleted_at=_min(self.node_deleted_at, other.node_deleted_at),
            vanished_at=_min(self.vanished_at, other.vanished_at),
        )


def _min(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def observed_evidence(facts: PodFacts, observed_at: int) -> EndEvidence:
    """The end evidence one copy of a pod carries, seen at ``observed_at``."""
    terminated_at: int | None = None
    if facts.terminal:
        terminated_at = facts.finished_at if facts.finished_at is not None else observed_at
    return EndEvidence(terminated_at=terminated_at, deletion_at=facts.deletion_at)


@dataclass(frozen=True)
class BillingEnd:
    at: int
    reason: str
    estimated: bool


def billing_end(started_at: int, evidence: EndEvidence) -> BillingEnd | None:
    """When the pod's GPUs stopped being charged, or None while they still are.

    The earliest of: terminal (latest container finishedAt, else when the phase change was
    observed), deletionTimestamp, the DELETED event, the node's deletion. A pod that vanished
    unobserved ends at the last time it was known to exist, marked estimated, unless a real
    observation gives an end. An end before the start is clamped to an empty interval.
    """
    observed = {
        END_TERMINATED: evidence.terminated_at,
        END_DELETION_TIMESTAMP: evidence.deletion_at,
        END_DELETED: evidence.deleted_at,
        END_NODE_DELETED: evidence.node_deleted_at,
    }
    candidates = [
        (at, rank, reason)
        for rank, reason in enumerate(END_REASON_PRECEDENCE)
        if (at := observed[reason]) is not None
    ]
    if candidates:
        at, _, reason = min(candidates)
        return BillingEnd(at=max(at, started_at), reason=reason, estimated=False)
    if evidence.vanished_at is not None:
        return BillingEnd(
            at=max(evidence.vanished_at, started_at), reason=END_VANISHED, estimated=True
        )
    return None


# ---------------------------------------------------------------------------------------------
# Nodes and physical-GPU equivalents


@dataclass(frozen=True)
class NodeGpus:
    """A node's GPU facts as recorded when an interval starts."""

    name: str
    node_pool: str | None
    gpu_model: str | None  # nvidia.com/gpu.product without -SHARED / -MIG-<profile>
    gpu_count: int | None
    replicas: int | None
    sharing_strategy: str | None
    mig_strategy: str | None
    mig_profile: str | None  # single-strategy MIG: the profile every nvidia.com/gpu is
    capacity: Mapping[str, int]
    allocatable: Mapping[str, int]
    labels: Mapping[str, str]  # the recorded labels, as served
    created_at: int | None
    deletion_at: int | None

    def replica_count(self) -> int | None:
        """Replicas each physical GPU is shared into (time-slicing or MPS), if shared."""
        if self.sharing_strategy in (None, "", "none") and self.replicas is None:
            return None
        if self.replicas is not None and self.replicas > 1:
            return self.replicas
        return None


def node_gpus(node: Mapping[str, Any], config: AccountingConfig = DEFAULT_CONFIG) -> NodeGpus:
    if not isinstance(node, Mapping):
        raise AccountingError("node: expected an object")
    meta = _mapping(node.get("metadata"), "metadata")
    status = _mapping(node.get("status"), "status")
    name = _str(meta.get("name"), "metadata.name", required=True)
    assert name is not None
    labels = {str(k): str(v) for k, v in _mapping(meta.get("labels"), "metadata.labels").items()}
    capacity = {
        k: _units(v, f"status.capacity[{k!r}]")
        for k, v in _mapping(status.get("capacity"), "status.capacity").items()
        if config.is_gpu(k)
    }
    allocatable = {
        k: _units(v, f"status.allocatable[{k!r}]")
        for k, v in _mapping(status.get("allocatable"), "status.allocatable").items()
        if config.is_gpu(k)
    }
    product = labels.get(LABEL_PRODUCT)
    model: str | None = product
    mig_profile: str | None = None
    if model is not None:
        if model.endswith("-SHARED"):
            model = model[: -len("-SHARED")]
        match = _MIG_PRODUCT.match(model)
        if match is not None:
            model, mig_profile = match.group("model"), match.group("profile")
    sharing = labels.get(LABEL_SHARING)
    replicas = _int_label(labels, LABEL_REPLICAS)
    count = _int_label(labels, LABEL_COUNT)
    if replicas is None and product is not None and product.endswith("-SHARED") and count:
        # older GPU feature discovery marks shared GPUs only by the product suffix
        shared_capacity = capacity.get("nvidia.com/gpu") or capacity.get("nvidia.com/gpu.shared")
        if shared_capacity and shared_capacity > count:
            replicas = shared_capacity // count
    pool = next((labels[k] for k in config.node_pool_labels if labels.get(k)), None)
    return NodeGpus(
        name=name,
        node_pool=pool,
        gpu_model=model or None,
        gpu_count=count,
        replicas=replicas,
        sharing_strategy=sharing,
        mig_strategy=labels.get(LABEL_MIG_STRATEGY),
        mig_profile=mig_profile,
        capacity=capacity,
        allocatable=allocatable,
        labels={k: labels[k] for k in RECORDED_NODE_LABELS if k in labels},
        created_at=parse_time(meta.get("creationTimestamp"), "metadata.creationTimestamp"),
        deletion_at=parse_time(meta.get("deletionTimestamp"), "metadata.deletionTimestamp"),
    )


def mig_share(profile: str, config: AccountingConfig = DEFAULT_CONFIG) -> float | None:
    """Physical share of one GPU that one MIG instance of ``profile`` ("3g.40gb") is:
    N compute slices of the GPU's 7, unless the configuration overrides the profile."""
    if profile in config.mig_profile_share:
        return float(config.mig_profile_share[profile])
    match = _MIG_PROFILE.match(profile)
    if match is None:
        return None
    return min(1.0, int(match.group(1)) / config.mig_slices)


@dataclass(frozen=True)
class PhysicalShare:
    """How raw units of one resource on one node convert to physical GPUs."""

    per_unit: float
    replicas: int | None
    sharing_strategy: str | None
    mig_profile: str | None = None


def physical_share(
    resource_name: str, node: NodeGpus | None, config: AccountingConfig = DEFAULT_CONFIG
) -> PhysicalShare:
    """Physical GPUs one unit of ``resource_name`` is worth on ``node``.

    nvidia.com/mig-<N>g.<M>gb: N/7 (overridable per profile); a single-strategy MIG node's
    nvidia.com/gpu: the share of its profile; a time-sliced or MPS replica: 1/replicas;
    anything else one whole GPU. Without node facts a unit counts as one GPU.
    """
    if resource_name.startswith("nvidia.com/mig-"):
        profile = resource_name[len("nvidia.com/mig-") :]
        share = mig_share(profile, config)
        return PhysicalShare(
            per_unit=share if share is not None else 1.0,
            replicas=None,
            sharing_strategy="mig",
            mig_profile=profile,
        )
    if node is None:
        return PhysicalShare(per_unit=1.0, replicas=None, sharing_strategy=None)
    if resource_name.startswith("nvidia.com/gpu") and node.mig_profile is not None:
        share = mig_share(node.mig_profile, config)
        return PhysicalShare(
            per_unit=share if share is not None else 1.0,
            replicas=None,
            sharing_strategy="mig",
            mig_profile=node.mig_profile,
        )
    replicas = node.replica_count()
    if resource_name.startswith("nvidia.com/gpu") and replicas is not None:
        strategy = node.sharing_strategy or "time-slicing"
        return PhysicalShare(per_unit=1.0 / replicas, replicas=replicas, sharing_strategy=strategy)
    return PhysicalShare(per_unit=1.0, replicas=None, sharing_strategy=node.sharing_strategy)


def physical_gpus(
    resource_name: str, units: int, node: NodeGpus | None, config: AccountingConfig = DEFAULT_CONFIG
) -> float:
    return units * physical_share(resource_name, node, config).per_unit


# ---------------------------------------------------------------------------------------------
# Namespaces, quotas, and time


def namespace_labels(
    namespace: Mapping[str, Any],
) -> tuple[str, dict[str, str], int | None, int | None]:
    """(name, labels, creationTimestamp, deletionTimestamp) of a Namespace object."""
    meta = _mapping(namespace.get("metadata"), "metadata")
    name = _str(meta.get("name"), "metadata.name", required=True)
    assert name is not None
    labels = {str(k): str(v) for k, v in _mapping(meta.get("labels"), "metadata.labels").items()}
    return (
        name,
        labels,
        parse_time(meta.get("creationTimestamp"), "metadata.creationTimestamp"),
        parse_time(meta.get("deletionTimestamp"), "metadata.deletionTimestamp"),
    )


@dataclass(frozen=True)
class QuotaFigure:
    """One GPU line of a ResourceQuota: hard and used (None where absent)."""

    resource_name: str  # as in the quota, e.g. requests.nvidia.com/gpu
    hard: float | None
    used: float | None


@dataclass(frozen=True)
class QuotaFacts:
    namespace: str
    name: str
    scopes: tuple[str, ...]
    figures: tuple[QuotaFigure, ...]


# DRA: ResourceQuota limits a device class's devices with this key (docs/accounting.md)
DEVICE_CLASS_QUOTA_SUFFIX = ".deviceclass.resource.k8s.io/devices"
# the device classes whose ResourceQuota lines are stored with the GPU quota history
DEFAULT_GPU_DEVICE_CLASSES: tuple[str, ...] = ("gpu.nvidia.com", "mig.nvidia.com")


def device_class_quota(key: str, classes: Sequence[str] = DEFAULT_GPU_DEVICE_CLASSES) -> str | None:
    """The device class a ResourceQuota key ``<class>.deviceclass.resource.k8s.io/devices``
    (optionally ``requests.``-prefixed) counts, when it is a GPU class; else None."""
    name = key[len("requests.") :] if key.startswith("requests.") else key
    if not name.endswith(DEVICE_CLASS_QUOTA_SUFFIX):
        return None
    device_class = name[: -len(DEVICE_CLASS_QUOTA_SUFFIX)]
    return device_class if device_class in classes else None


def quota_gpu_resource(key: str, config: AccountingConfig = DEFAULT_CONFIG) -> bool:
    """Whether a ResourceQuota key (requests.nvidia.com/gpu, limits.amd.com/gpu, ...) is a GPU."""
    if device_class_quota(key) is not None:
        return True
    for prefix in ("requests.", "limits."):
        if key.startswith(prefix):
            return config.is_gpu(key[len(prefix) :])
    return config.is_gpu(key)


def quota_facts(quota: Mapping[str, Any], config: AccountingConfig = DEFAULT_CONFIG) -> QuotaFacts:
    meta = _mapping(quota.get("metadata"), "metadata")
    spec = _mapping(quota.get("spec"), "spec")
    status = _mapping(quota.get("status"), "status")
    name = _str(meta.get("name"), "metadata.name", required=True)
    assert name is not None
    namespace = _str(meta.get("namespace"), "metadata.namespace") or "default"
    scopes = [str(s) for s in _sequence(spec.get("scopes"), "spec.scopes")]
    selector = _mapping(spec.get("scopeSelector"), "spec.scopeSelector")
    for expr in _sequence(selector.get("matchExpressions"), "spec.scopeSelector.matchExpressions"):
        expr = _mapping(expr, "spec.scopeSelector.matchExpressions[]")
        values = ",".join(str(v) for v in _sequence(expr.get("values"), "values"))
        scopes.append(f"{expr.get('scopeName')} {expr.get('operator')} {values}".rstrip())
    # status.hard is what the quota controller enforces; spec.hard until it has caught up
    hard = _mapping(status.get("hard"), "status.hard") or _mapping(spec.get("hard"), "spec.hard")
    used = _mapping(status.get("used"), "status.used")
    figures = []
    for key in sorted({*hard, *used}):
        if not quota_gpu_resource(key, config):
            continue
        figures.append(
            QuotaFigure(
                resource_name=key,
                hard=float(parse_quantity(hard[key], f"hard[{key!r}]")) if key in hard else None,
                used=float(parse_quantity(used[key], f"used[{key!r}]")) if key in used else None,
            )
        )
    return QuotaFacts(namespace=namespace, name=name, scopes=tuple(scopes), figures=tuple(figures))


def _walk_times(value: Any, keys: frozenset[str], out: list[int]) -> None:
    if isinstance(value, Mapping):
        for key, item in value.items():
            if key in keys and isinstance(item, str):
                try:
                    parsed = parse_time(item, key)
                except AccountingError:
                    continue
                if parsed is not None:
                    out.append(parsed)
            elif key != "managedFields":
                _walk_times(item, keys, out)
    elif isinstance(value, list):
        for item in value:
            _walk_times(item, keys, out)


_TIME_KEYS = frozenset(
    {
        "creationTimestamp",
        "deletionTimestamp",
        "startTime",
        "startedAt",
        "finishedAt",
        "lastTransitionTime",
        "lastProbeTime",
    }
)


def last_written(obj: Mapping[str, Any]) -> int | None:
    """When the object was last written (its spec by a client or its status by a controller):
    the latest ``metadata.managedFields[].time`` the API server stamped, None without one."""
    meta = obj.get("metadata")
    fields = meta.get("managedFields") if isinstance(meta, Mapping) else None
    times: list[int] = []
    for entry in fields if isinstance(fields, list) else []:
        if isinstance(entry, Mapping) and isinstance(entry.get("time"), str):
            try:
                parsed = parse_time(entry["time"], "managedFields[].time")
            except AccountingError:
                continue
            if parsed is not None:
                times.append(parsed)
    return max(times) if times else None


def latest_timestamp(obj: Mapping[str, Any]) -> int | None:
    """The latest timestamp an object carries: a lower bound of when it was observed, used by
    replay for lines without an explicit observation time."""
    found: list[int] = []
    _walk_times(obj, _TIME_KEYS, found)
    return max(found) if found else None
