"""The GPU accounting rules for Dynamic Resource Allocation (resource.k8s.io), as pure functions.

A pod gets DRA GPUs through ResourceClaims; the node's ResourceSlices describe each device.
This module reads those objects (plain dicts, camelCase, v1 and the v1beta1/v1beta2 shapes)
and states the billing rules of docs/accounting.md "GPUs allocated through Dynamic Resource
Allocation":

* a result counts as GPUs when its driver is in the configured list (``gpu.nvidia.com``);
  ``adminAccess`` results are never charged; claims made for an extended-resource request
  are not charged again (the pod's ``nvidia.com/gpu`` request is);
* raw units = the claim's GPU devices per device class; physical: a whole GPU is 1, a MIG
  device N/7 of its parent (``profile`` ``Ng.Mgb``), a device shared through consumable
  capacity (``shareID``) the consumed share where the device declares that capacity, else
  the whole device, marked estimated;
* the model is the device's ``productName`` written as GPU feature discovery writes the node
  label (spaces as dashes, so both paths price alike), recorded when the claim is allocated;
* a claim is charged while at least one pod using it is inside its own billing interval:
  :func:`charged_pieces` cuts that union into disjoint per-pod pieces, so the pieces add up
  to the union and a shared claim is charged once.

Nothing here does I/O or keeps state: quota/accounting/trackers/claims.py feeds events
through it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any

from gpuquota.quota.accounting.rules.config import DEFAULT_CONFIG, AccountingConfig
from gpuquota.quota.accounting.rules.parse import (
    mapping,
    parse_quantity,
    parse_time,
    sequence,
    string,
)
from gpuquota.quota.accounting.rules.quotas import device_class_quota as device_class_quota
from gpuquota.quota.accounting.rules.shares import mig_share

DEFAULT_GPU_DRIVERS: tuple[str, ...] = ("gpu.nvidia.com",)
# the annotation the scheduler puts on a claim it made for an extended-resource request
EXTENDED_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
ALLOCATION_PATH_DEVICE_PLUGIN = "device-plugin"
ALLOCATION_PATH_DRA = "dra"

_PROFILE = re.compile(r"^\d+g\.\d+gb")


def gpu_model(product_name: str | None) -> str | None:
    """``NVIDIA H100 80GB HBM3`` -> ``NVIDIA-H100-80GB-HBM3``: the node label's spelling."""
    if not product_name:
        return None
    return "-".join(product_name.split())


# ---------------------------------------------------------------------------------------------
# ResourceSlices


@dataclass(frozen=True)
class SliceDevice:
    """One device a ResourceSlice lists, with what the accounting needs."""

    driver: str
    pool: str
    name: str
    node: str | None
    type: str | None  # NVIDIA: "gpu" | "mig"
    product_name: str | None
    profile: str | None  # MIG profile, e.g. "1g.10gb"
    capacity: Mapping[str, Decimal]

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.name)


def _attribute(attrs: Mapping[str, Any], driver: str, name: str) -> str | None:
    for key in (name, f"{driver}/{name}"):
        value = attrs.get(key)
        if isinstance(value, Mapping):
            for kind in ("string", "version"):
                if isinstance(value.get(kind), str):
                    return str(value[kind])
    return None


def slice_devices(obj: Mapping[str, Any]) -> tuple[str, list[SliceDevice]]:
    """(slice name, its devices). Raises AccountingError naming a malformed field."""
    meta = mapping(obj.get("metadata"), "metadata")
    spec = mapping(obj.get("spec"), "spec")
    name = string(meta.get("name"), "metadata.name", required=True)
    driver = string(spec.get("driver"), "spec.driver", required=True)
    pool = mapping(spec.get("pool"), "spec.pool")
    pool_name = string(pool.get("name"), "spec.pool.name", required=True)
    node = string(spec.get("nodeName"), "spec.nodeName")
    assert name is not None and driver is not None and pool_name is not None
    devices = []
    for i, item in enumerate(sequence(spec.get("devices"), "spec.devices")):
        where = f"spec.devices[{i}]"
        device = mapping(item, where)
        # v1beta1 nests attributes and capacity under "basic"
        body = mapping(device.get("basic"), f"{where}.basic") or device
        attrs = mapping(body.get("attributes"), f"{where}.attributes")
        capacity: dict[str, Decimal] = {}
        for key, value in mapping(body.get("capacity"), f"{where}.capacity").items():
            raw = value.get("value") if isinstance(value, Mapping) else value
            capacity[str(key)] = parse_quantity(raw, f"{where}.capacity[{key!r}]")
        device_name = string(device.get("name"), f"{where}.name", required=True)
        assert device_name is not None
        devices.append(
            SliceDevice(
                driver=driver,
                pool=pool_name,
                name=device_name,
                node=node,
                type=_attribute(attrs, driver, "type"),
                product_name=_attribute(attrs, driver, "productName"),
                profile=_attribute(attrs, driver, "profile"),
                capacity=capacity,
            )
        )
    return name, devices


# ---------------------------------------------------------------------------------------------
# ResourceClaims


@dataclass(frozen=True)
class ClaimResult:
    """One allocated device of a claim (``status.allocation.devices.results[]``)."""

    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool
    share_id: str | None
    consumed: Mapping[str, Decimal]

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.device)


@dataclass(frozen=True)
class ClaimFacts:
    uid: str
    namespace: str
    name: str
    created_at: int | None
    allocated: bool
    results: tuple[ClaimResult, ...]
    # request name -> device class (``exactly.deviceClassName``, firstAvailable sub-requests
    # as "<request>/<sub-request>")
    request_classes: Mapping[str, str]
    reserved_for: tuple[str, ...]  # pod UIDs in status.reservedFor
    node: str | None  # the node the allocation is bound to, where it names one
    extended: bool  # made by the scheduler for an extended-resource request


def _request_classes(spec: Mapping[str, Any]) -> dict[str, str]:
    devices = mapping(spec.get("devices"), "spec.devices")
    out: dict[str, str] = {}
    for i, item in enumerate(sequence(devices.get("requests"), "spec.devices.requests")):
        where = f"spec.devices.requests[{i}]"
        request = mapping(item, where)
        name = string(request.get("name"), f"{where}.name") or ""
        exactly = mapping(request.get("exactly"), f"{where}.exactly")
        # v1: exactly.deviceClassName; v1beta1: deviceClassName on the request
        device_class = exactly.get("deviceClassName") or request.get("deviceClassName")
        if isinstance(device_class, str):
            out[name] = device_class
        for j, sub in enumerate(sequence(request.get("firstAvailable"), "firstAvailable")):
            sub = mapping(sub, f"{where}.firstAvailable[{j}]")
            if isinstance(sub.get("deviceClassName"), str) and isinstance(sub.get("name"), str):
                out[f"{name}/{sub['name']}"] = str(sub["deviceClassName"])
    return out


def _allocation_node(allocation: Mapping[str, Any]) -> str | None:
    selector = mapping(allocation.get("nodeSelector"), "status.allocation.nodeSelector")
    for term in sequence(selector.get("nodeSelectorTerms"), "nodeSelectorTerms"):
        term = mapping(term, "nodeSelectorTerms[]")
        for expr in sequence(term.get("matchFields"), "matchFields"):
            expr = mapping(expr, "matchFields[]")
            values = sequence(expr.get("values"), "matchFields[].values")
            if expr.get("key") == "metadata.name" and len(values) == 1:
                return str(values[0])
    return None


def claim_facts(obj: Mapping[str, Any]) -> ClaimFacts:
    """What the rules read from one ResourceClaim; AccountingError names a malformed field."""
    meta = mapping(obj.get("metadata"), "metadata")
    spec = mapping(obj.get("spec"), "spec")
    status = mapping(obj.get("status"), "status")
    uid = string(meta.get("uid"), "metadata.uid", required=True)
    name = string(meta.get("name"), "metadata.name", required=True)
    assert uid is not None and name is not None
    namespace = string(meta.get("namespace"), "metadata.namespace") or "default"
    allocation = mapping(status.get("allocation"), "status.allocation")
    devices = mapping(allocation.get("devices"), "status.allocation.devices")
    results = []
    for i, item in enumerate(sequence(devices.get("results"), "devices.results")):
        where = f"status.allocation.devices.results[{i}]"
        result = mapping(item, where)
        consumed = {
            str(k): parse_quantity(v, f"{where}.consumedCapacity[{k!r}]")
            for k, v in mapping(result.get("consumedCapacity"), "consumedCapacity").items()
        }
        fields = [
            string(result.get(f), f"{where}.{f}", required=True)
            for f in ("request", "driver", "pool", "device")
        ]
        request, driver, pool, device = (str(f) for f in fields)
        results.append(
            ClaimResult(
                request=request,
                driver=driver,
                pool=pool,
                device=device,
                admin_access=result.get("adminAccess") is True,
                share_id=string(result.get("shareID"), f"{where}.shareID"),
                consumed=consumed,
            )
        )
    reserved = []
    for i, item in enumerate(sequence(status.get("reservedFor"), "status.reservedFor")):
        ref = mapping(item, f"status.reservedFor[{i}]")
        if ref.get("resource", "pods") == "pods" and isinstance(ref.get("uid"), str):
            reserved.append(str(ref["uid"]))
    annotations = mapping(meta.get("annotations"), "metadata.annotations")
    return ClaimFacts(
        uid=uid,
        namespace=namespace,
        name=name,
        created_at=parse_time(meta.get("creationTimestamp"), "metadata.creationTimestamp"),
        allocated=bool(allocation),
        results=tuple(results),
        request_classes=_request_classes(spec),
        reserved_for=tuple(reserved),
        node=_allocation_node(allocation) if allocation else None,
        extended=str(annotations.get(EXTENDED_CLAIM_ANNOTATION, "")).lower() == "true",
    )


@dataclass(frozen=True)
class PodClaims:
    """The claims a pod names (resolved to claim names), and the one made for its extended
    resources."""

    uid: str
    namespace: str
    names: tuple[str, ...]
    extended: str | None


def pod_claims(pod: Mapping[str, Any]) -> PodClaims:
    """``spec.resourceClaims[]`` resolved through ``status.resourceClaimStatuses[]`` (a
    template's generated claim), and ``status.extendedResourceClaimStatus.resourceClaimName``."""
    meta = mapping(pod.get("metadata"), "metadata")
    spec = mapping(pod.get("spec"), "spec")
    status = mapping(pod.get("status"), "status")
    uid = string(meta.get("uid"), "metadata.uid", required=True)
    assert uid is not None
    namespace = string(meta.get("namespace"), "metadata.namespace") or "default"
    generated = {}
    for i, item in enumerate(
        sequence(status.get("resourceClaimStatuses"), "status.resourceClaimStatuses")
    ):
        entry = mapping(item, f"status.resourceClaimStatuses[{i}]")
        if isinstance(entry.get("name"), str) and isinstance(entry.get("resourceClaimName"), str):
            generated[entry["name"]] = entry["resourceClaimName"]
    names = []
    for i, item in enumerate(sequence(spec.get("resourceClaims"), "spec.resourceClaims")):
        entry = mapping(item, f"spec.resourceClaims[{i}]")
        direct = entry.get("resourceClaimName")
        if isinstance(direct, str) and direct:
            names.append(direct)
        elif isinstance(entry.get("name"), str) and entry["name"] in generated:
            names.append(str(generated[entry["name"]]))
    extended_status = mapping(
        status.get("extendedResourceClaimStatus"), "status.extendedResourceClaimStatus"
    )
    extended = extended_status.get("resourceClaimName")
    return PodClaims(
        uid=uid,
        namespace=namespace,
        names=tuple(names),
        extended=str(extended) if isinstance(extended, str) and extended else None,
    )


def names_claims(pod: Mapping[str, Any]) -> bool:
    """Whether a pod object names any ResourceClaim (cheap; for the controller's pod filter)."""
    spec = pod.get("spec")
    return isinstance(spec, Mapping) and bool(spec.get("resourceClaims"))


# ---------------------------------------------------------------------------------------------
# What a claim charges


@dataclass(frozen=True)
class Charge:
    """The GPUs of one device class a claim holds, as recorded at allocation."""

    device_class: str
    units: int  # allocated GPU devices
    physical: Fraction  # physical-GPU equivalent of all of them, exactly
    gpu_model: str | None
    node: str | None
    mig_profile: str | None
    sharing: str | None  # "mig" | "consumable-capacity" | None
    estimated: bool  # a share of a device whose capacity is not declared: whole device


@dataclass(frozen=True)
class Problem:
    """A result the rules cannot account as asked: logged and counted by the caller."""

    reason: str  # "driver" (not a GPU driver) | "device" (no slice lists it)
    detail: str


def device_share(device: SliceDevice, config: AccountingConfig = DEFAULT_CONFIG) -> Fraction:
    """Physical GPUs one device is: a MIG device N/7 of its parent, anything else one."""
    if device.profile and _PROFILE.match(device.profile):
        share = mig_share(device.profile, config)
        if share is not None:
            return share
    return Fraction(1)


def _share(result: ClaimResult, device: SliceDevice | None) -> tuple[Fraction, bool]:
    """The part of the device a result holds (exact), and whether that is an estimate."""
    whole = Fraction(1)
    if result.share_id is None or not result.consumed:
        return whole, False
    if device is not None:
        for key in sorted(result.consumed, key=lambda k: (k != "memory", k)):
            total = device.capacity.get(key)
            if total:
                return min(whole, Fraction(result.consumed[key]) / Fraction(total)), False
    return whole, True  # the driver declares no such capacity: an upper bound


def charges(
    claim: ClaimFacts,
    device_of: Mapping[tuple[str, str, str], SliceDevice],
    drivers: Sequence[str] = DEFAULT_GPU_DRIVERS,
    config: AccountingConfig = DEFAULT_CONFIG,
) -> tuple[list[Charge], list[Problem]]:
    """The GPUs a claim charges per device class, and the results it could not read fully."""
    problems: list[Problem] = []
    groups: dict[str, list[tuple[ClaimResult, SliceDevice | None]]] = {}
    for result in claim.results:
        if result.admin_access:
            continue  # monitoring access: never charged
        if result.driver not in drivers:
            problems.append(
                Problem("driver", f"result {result.device!r} of driver {result.driver!r}")
            )
            continue
        device = device_of.get(result.key)
        if device is None:
            problems.append(
                Problem(
                    "device",
                    f"result names device {'/'.join(result.key)!r}, which no slice lists",
                )
            )
        device_class = claim.request_classes.get(result.request) or claim.request_classes.get(
            result.request.split("/", 1)[0], result.driver
        )
        groups.setdefault(device_class, []).append((result, device))
    out = []
    for device_class, members in sorted(groups.items()):
        physical = Fraction(0)
        estimated = False
        models = set()
        profiles = set()
        sharing: str | None = None
        node = claim.node
        for result, device in members:
            share, guessed = _share(result, device)
            estimated |= guessed
            if result.share_id is not None:
                sharing = "consumable-capacity"
            per_device = Fraction(1)
            if device is not None:
                node = node or device.node
                if device.product_name:
                    models.add(gpu_model(device.product_name))
                profile = device.profile if device.type == "mig" or device.profile else None
                if profile and _PROFILE.match(profile):
                    mig = mig_share(profile, config)
                    if mig is not None:
                        per_device = mig
                        profiles.add(profile)
                        sharing = sharing or "mig"
            physical += per_device * share
        out.append(
            Charge(
                device_class=device_class,
                units=len(members),
                physical=physical,
                gpu_model=",".join(sorted(m for m in models if m)) or None,
                node=node,
                mig_profile=profiles.pop() if len(profiles) == 1 else None,
                sharing=sharing,
                estimated=estimated,
            )
        )
    return out, problems


# ---------------------------------------------------------------------------------------------
# The union of the pods' billing intervals


@dataclass(frozen=True)
class PodSpan:
    """A pod using the claim, over its own billing interval [start, end) (end None: open)."""

    pod_uid: str
    start: int
    end: int | None


def charged_pieces(spans: Sequence[PodSpan]) -> dict[str, tuple[int, int | None]]:
    """Cut the union of the pods' intervals into one disjoint piece per pod.

    Pods in order of start (then UID): each pod's piece is the part of its interval after
    every earlier pod's end, ``[min(max(start, M), end), end)`` with M the latest end among
    the earlier pods. As the earlier pods all started no later, the part of their union past
    this pod's start is ``[start, M)``, so the pieces are disjoint and add up to the union. A
    pod whose interval lies inside earlier ones gets an empty piece (start == end). An open
    piece behind an open earlier pod has not begun: ``(start, start)`` with start = the
    pod's start stands for it until the earlier pod ends (then the piece is recomputed).
    """
    pieces: dict[str, tuple[int, int | None]] = {}
    latest: int | None = None  # latest end among earlier pods; None before any
    open_before = False
    for span in sorted(spans, key=lambda s: (s.start, s.pod_uid)):
        if open_before:
            at = span.start if span.end is None else span.end
            pieces[span.pod_uid] = (at, at)
            continue
        begin = span.start if latest is None else max(span.start, latest)
        if span.end is None:
            pieces[span.pod_uid] = (begin, None)
            open_before = True
        else:
            begin = min(begin, span.end)
            pieces[span.pod_uid] = (begin, span.end)
            latest = span.end if latest is None else max(latest, span.end)
    return pieces


def check_dra(kind: str, obj: Mapping[str, Any]) -> None:
    """Validate a DRA object with the rules the claim tracker applies (replay's check):
    AccountingError names the field."""
    if kind == "ResourceClaim":
        claim_facts(obj)
    elif kind == "ResourceSlice":
        slice_devices(obj)
    elif kind == "DeviceClass":
        meta = mapping(obj.get("metadata"), "metadata")
        string(meta.get("name"), "metadata.name", required=True)
