"""Pod rules: the effective GPU request, the QoS class, the facts a pod carries, and whether
ResourceQuota counts it now."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuquota.quota.accounting.rules.config import DEFAULT_CONFIG, AccountingConfig
from gpuquota.quota.accounting.rules.parse import (
    AccountingError,
    mapping,
    parse_quantity,
    parse_time,
    sequence,
    string,
    units_of,
)

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
# characters no JSON encoder escapes (Go's escapes <, >, &; none escapes these)
_VERBATIM = re.compile(r"[A-Za-z0-9._/-]+")
# a pod that names a ResourceClaim, or was given one for an extended resource, says so in
# these keys' names
_CLAIM_MARKERS = (b"resourceClaims", b"extendedResourceClaimStatus")


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
    resources = mapping(container.get("resources"), f"{where}.resources")
    requests = mapping(resources.get("requests"), f"{where}.resources.requests")
    limits = mapping(resources.get("limits"), f"{where}.resources.limits")
    units: dict[str, int] = {}
    # the API server defaults an extended resource's request to its limit; read the admitted
    # request and fall back to the limit only for an object that never went through admission
    for name in {*requests, *limits}:
        if not config.is_gpu(name):
            continue
        if name in requests:
            units[name] = units_of(requests[name], f"{where}.resources.requests[{name!r}]")
        else:
            units[name] = units_of(limits[name], f"{where}.resources.limits[{name!r}]")
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
    spec = mapping(pod.get("spec"), "spec")
    app: dict[str, int] = {}
    for i, container in enumerate(sequence(spec.get("containers"), "spec.containers")):
        _add(
            app,
            _container_units(
                mapping(container, f"spec.containers[{i}]"), f"spec.containers[{i}]", config
            ),
        )
    init_peak: dict[str, int] = {}
    sidecars: dict[str, int] = {}
    for i, container in enumerate(sequence(spec.get("initContainers"), "spec.initContainers")):
        where = f"spec.initContainers[{i}]"
        container = mapping(container, where)
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
    overhead = mapping(spec.get("overhead"), "spec.overhead")
    for name, value in overhead.items():
        if config.is_gpu(name):
            effective[name] = effective.get(name, 0) + units_of(value, f"spec.overhead[{name!r}]")
    return {name: value for name, value in sorted(effective.items()) if value > 0}


def qos_class(pod: Mapping[str, Any]) -> str:
    """The pod's QoS class: the one the API server put in status, else computed like it does
    (only cpu and memory count)."""
    status = mapping(pod.get("status"), "status")
    served = status.get("qosClass")
    if isinstance(served, str) and served:
        return served
    spec = mapping(pod.get("spec"), "spec")
    containers = [
        *sequence(spec.get("containers"), "spec.containers"),
        *sequence(spec.get("initContainers"), "spec.initContainers"),
    ]
    any_set = False
    guaranteed = True
    for container in containers:
        resources = mapping(mapping(container, "container").get("resources"), "resources")
        requests = mapping(resources.get("requests"), "resources.requests")
        limits = mapping(resources.get("limits"), "resources.limits")
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
        mapping(r, "metadata.ownerReferences[]")
        for r in sequence(meta.get("ownerReferences"), "metadata.ownerReferences")
    ]
    if not refs:
        return None, None
    ref = next((r for r in refs if r.get("controller") is True), refs[0])
    kind = string(ref.get("kind"), "metadata.ownerReferences[].kind")
    name = string(ref.get("name"), "metadata.ownerReferences[].name")
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
        for i, cs in enumerate(sequence(status.get(key), f"status.{key}")):
            state = mapping(
                mapping(cs, f"status.{key}[{i}]").get("state"), f"status.{key}[{i}].state"
            )
            terminated = mapping(state.get("terminated"), f"status.{key}[{i}].state.terminated")
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
    meta = mapping(pod.get("metadata"), "metadata")
    spec = mapping(pod.get("spec"), "spec")
    status = mapping(pod.get("status"), "status")
    labels = mapping(meta.get("labels"), "metadata.labels")
    uid = string(meta.get("uid"), "metadata.uid", required=True)
    name = string(meta.get("name"), "metadata.name", required=True)
    namespace = string(meta.get("namespace"), "metadata.namespace") or "default"
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
        node=string(spec.get("nodeName"), "spec.nodeName") or None,
        owner_kind=owner_kind,
        owner_name=owner_name,
        phase=string(status.get("phase"), "status.phase"),
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


def raw_prefilter(config: AccountingConfig = DEFAULT_CONFIG) -> Callable[[bytes], bool] | None:
    """A test on a pod's JSON bytes that is True for every pod requesting a GPU (by
    ``config``: in any container, init container, sidecar or the overhead) or naming a
    ResourceClaim: each has a GPU resource name or a claim key in its bytes. False
    therefore means the accounting ignores the pod, and it need not be decoded. None when a
    configured name holds a character an encoder may escape (then every pod is decoded)."""
    names = (*config.gpu_resources, *config.gpu_resource_prefixes)
    if not all(_VERBATIM.fullmatch(n) for n in names):
        return None
    markers = (*(n.encode() for n in names), *_CLAIM_MARKERS)

    def may_concern(raw: bytes) -> bool:
        return any(m in raw for m in markers)

    return may_concern
