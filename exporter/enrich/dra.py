"""Pod attribution of DRA allocations: pod-resources ``dynamic_resources`` -> GPU/MIG UUIDs.

The kubelet's pod-resources List names, per container, the ResourceClaims it uses and each
claim's devices as ``(driver, pool, device)``. :func:`resolve` turns them into the same
``device UUID -> pod containers`` mapping the device-plugin path produces (so a DRA-held GPU
is attributed exactly like a device-plugin one), plus the claim behind each holder
(:class:`ClaimRef`). A claim shared by several pods lists every one of them on its devices.

A MIG device the driver creates only when it is allocated (dynamic MIG) has no UUID in its
slice: it is keyed by :func:`partition_key` and :func:`resolve_partition` finds it in the
snapshot by parent GPU and profile (the only MIG device of that profile on that GPU), else
attributes the parent GPU.

Devices a claim holds with ``adminAccess`` (monitoring agents) are left out where the claim
could be read (exporter/enrich/claimreader.py, by the rule in admin_access.py).

Results that cannot be resolved are never fatal: a device of a driver not in the configured
GPU drivers (``unknown_driver``: NICs and other DRA devices are not GPUs) and a device no
current slice lists (``unknown_device``: a slice that disappeared, or a stale claim) are
skipped, logged once per device and counted (:class:`DraAttribution.problems`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gpuquota.exporter.enrich.claimreader import AdminAccessClaims
from gpuquota.exporter.kubeletapi import podresources_v1_pb2 as pb
from gpuquota.exporter.snapshot import ClaimRef, DraStatus, NodeSnapshot, PodRef

log = logging.getLogger(__name__)

PROBLEM_REASONS = ("unknown_driver", "unknown_device", "bad_slice")


class SlicedDevice(Protocol):
    """One device a ResourceSlice lists, as far as attribution needs it."""

    @property
    def uuid(self) -> str | None: ...
    @property
    def parent_uuid(self) -> str | None: ...
    @property
    def profile(self) -> str | None: ...


class SliceIndex(Protocol):
    """The node's ResourceSlices as a lookup (exporter/enrich/slicewatcher.py keeps one up to date
    from the API server; attribution only reads it, so it imports nothing from there)."""

    drivers: frozenset[str]
    synced: bool

    def lookup(self, driver: str, pool: str, device: str) -> SlicedDevice | None: ...
    def devices(self) -> Sequence[object]: ...


PARTITION_PREFIX = "dra-partition:"


def partition_key(parent_uuid: str, profile: str) -> str:
    """The mapping key of a dynamically created MIG device, until the snapshot resolves it."""
    return f"{PARTITION_PREFIX}{parent_uuid}/{profile}"


def resolve_partition(key: str, snapshot: NodeSnapshot) -> str | None:
    """The UUID a :func:`partition_key` stands for in ``snapshot``, or None (not ours)."""
    if not key.startswith(PARTITION_PREFIX):
        return None
    parent, _, profile = key[len(PARTITION_PREFIX) :].rpartition("/")
    migs = [
        d.uuid
        for d in snapshot.devices
        if d.mig is not None and d.mig.parent_uuid == parent and d.mig.profile == profile
    ]
    return migs[0] if len(migs) == 1 else parent


@dataclass(frozen=True, slots=True)
class Resolution:
    """What one List answer attributes through DRA."""

    devices: dict[str, tuple[PodRef, ...]] = field(default_factory=dict)
    claims: dict[str, tuple[ClaimRef, ...]] = field(default_factory=dict)
    problems: tuple[tuple[str, str, str], ...] = ()  # (reason, key, message)


def ordered_claims(refs: Iterable[ClaimRef]) -> tuple[ClaimRef, ...]:
    return tuple(sorted(set(refs), key=lambda r: (r.namespace, r.pod, r.container, r.claim)))


def resolve(
    response: pb.ListPodResourcesResponse,
    index: SliceIndex,
    admin: Callable[[str, str], frozenset[tuple[str, str, str]]] | None = None,
) -> Resolution:
    """Pure apart from reading ``index``: the DRA holders of each device UUID.

    ``admin(namespace, claim)`` names the claim's devices allocated with adminAccess
    (monitoring): those are left out."""
    holders: dict[str, set[PodRef]] = {}
    claims: dict[str, set[ClaimRef]] = {}
    problems: list[tuple[str, str, str]] = []
    for pod in response.pod_resources:
        for container in pod.containers:
            ref = PodRef(namespace=pod.namespace, pod=pod.name, container=container.name)
            for dynamic in container.dynamic_resources:
                claim = f"{dynamic.claim_namespace}/{dynamic.claim_name}"
                watching = admin(dynamic.claim_namespace, dynamic.claim_name) if admin else ()
                for res in dynamic.claim_resources:
                    if (res.driver_name, res.pool_name, res.device_name) in watching:
                        continue  # adminAccess: a monitoring agent, not a user of the device
                    key = f"{res.driver_name}/{res.pool_name}/{res.device_name}"
                    if res.driver_name not in index.drivers:
                        problems.append(
                            (
                                "unknown_driver",
                                res.driver_name,
                                f"claim {claim} of pod {pod.namespace}/{pod.name}: driver "
                                f"{res.driver_name!r} is not a GPU driver this exporter knows "
                                f"({', '.join(sorted(index.drivers))}); its devices are not "
                                "attributed",
                            )
                        )
                        continue
                    device = index.lookup(res.driver_name, res.pool_name, res.device_name)
                    if device is None:
                        problems.append(
                            (
                                "unknown_device",
                                key,
                                f"claim {claim} of pod {pod.namespace}/{pod.name}: device {key} "
                                "is in no ResourceSlice of this node; not attributed",
                            )
                        )
                        continue
                    uuid = device.uuid or partition_key(
                        device.parent_uuid or "", device.profile or ""
                    )
                    holders.setdefault(uuid, set()).add(ref)
                    claims.setdefault(uuid, set()).add(
                        ClaimRef(
                            claim_namespace=dynamic.claim_namespace,
                            claim=dynamic.claim_name,
                            namespace=pod.namespace,
                            pod=pod.name,
                            container=container.name,
                            driver=res.driver_name,
                            pool=res.pool_name,
                            device=res.device_name,
                        )
                    )
    return Resolution(
        devices={
            uuid: tuple(sorted(refs, key=lambda r: (r.namespace, r.pod, r.container)))
            for uuid, refs in holders.items()
        },
        claims={uuid: ordered_claims(refs) for uuid, refs in claims.items()},
        problems=tuple(problems),
    )


class DraAttribution:
    """The stateful side: logs each problem once, counts them, reports its status."""

    def __init__(self, index: SliceIndex, slices_up: object = None) -> None:
        self.index = index
        self._slices_up = slices_up  # a SliceWatcher (its ``up``), or None: always up
        # which claimed devices are adminAccess (exporter/enrich/claimreader.py), or None: not read
        self.admin: AdminAccessClaims | None = None
        self._lock = threading.Lock()
        self._problems: dict[str, int] = dict.fromkeys(PROBLEM_REASONS, 0)
        self._seen: set[tuple[str, str]] = set()  # problems outstanding (logged once)

    def count_problem(self, reason: str, message: str) -> None:
        with self._lock:
            self._problems[reason] = self._problems.get(reason, 0) + 1

    def resolve(self, response: pb.ListPodResourcesResponse) -> Resolution:
        admin = self.admin
        result = resolve(response, self.index, admin.devices if admin is not None else None)
        if admin is not None:
            admin.keep_only(
                (d.claim_namespace, d.claim_name)
                for pod in response.pod_resources
                for c in pod.containers
                for d in c.dynamic_resources
            )
        if not self.index.synced:
            # before the first slice list every device is unknown: not a problem yet
            return Resolution(result.devices, result.claims)
        current = {(reason, key) for reason, key, _ in result.problems}
        with self._lock:
            for reason, key, message in result.problems:
                if (reason, key) not in self._seen:
                    # other drivers' devices (NICs...) are normal on DRA nodes: info only
                    (log.info if reason == "unknown_driver" else log.warning)("%s", message)
                    self._problems[reason] = self._problems.get(reason, 0) + 1
            # a problem that went away may be logged and counted again if it comes back
            self._seen = current
        return result

    def status(self) -> DraStatus:
        up = getattr(self._slices_up, "up", True) if self._slices_up is not None else True
        with self._lock:
            problems = dict(self._problems)
        return DraStatus(
            slices_up=bool(up), devices=len(self.index.devices()), problems_total=problems
        )
