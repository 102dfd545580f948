"""DRA claims: ResourceClaims, ResourceSlices, DeviceClasses and the pods using the claims.

One state (:class:`ClaimTracker`) behind three trackers, one per kind (ResourceClaim,
ResourceSlice, DeviceClass: :func:`trackers`). The pod tracker tells it the claims each pod
names and each claim-using pod's billing interval as the pod rules compute it;
the tracker keeps which pods use which claim and what each claim holds (rules/claims.py, recorded
at allocation: model, MIG size, node), and turns that into ``claim_allocations`` rows: per
claim, device class and pod, the disjoint piece of the claim's charged time (the union of its
pods' intervals) that pod carries.

Restart safety: rows are keyed by (claim UID, pod UID, device class) and recomputed whole from
the pods' intervals; on start the tracker loads every row of each claim that still has a pod
inside its interval, so a restart knows the intervals of the pods that already ended. A pod
that vanished while the controller was down is closed at the last time it was known to exist,
marked estimated, as pods are.

Bad objects never stop the accounting: a result of a driver that is not a GPU driver, a result
naming a device no slice lists, a slice that disappears under allocated claims each give one
log line (once per claim) and a count in :attr:`ClaimTracker.problems`; the claim is charged
with what is known (an unknown device as one whole GPU, its model from the node).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterable, Mapping, Set
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from gpuquota.quota.accounting.pending import PendingWrites
from gpuquota.quota.accounting.rows import Batch, ClaimAllocationRow, NodeCapacityRow, StoredState
from gpuquota.quota.accounting.rules import claims as dra
from gpuquota.quota.accounting.rules.config import DEFAULT_CONFIG, AccountingConfig
from gpuquota.quota.accounting.rules.ends import END_VANISHED, BillingEnd
from gpuquota.quota.accounting.rules.nodes import NodeGpus
from gpuquota.quota.accounting.rules.parse import mapping, parse_time, string

log = logging.getLogger(__name__)

KINDS = frozenset({"ResourceClaim", "ResourceSlice", "DeviceClass"})
# the DRA kinds' rules check, for replay (re-exported)
check = dra.check_dra
PROBLEMS = ("driver", "device", "slice_gone")


@dataclass
class _Span:
    """One pod using a claim, over its own billing interval."""

    pod_uid: str
    pod_name: str
    owner_kind: str | None
    owner_name: str | None
    start: int
    end: int | None
    reason: str | None
    estimated: bool
    last_seen: int


@dataclass
class _Claim:
    uid: str
    namespace: str
    name: str
    created_at: int | None = None
    charges: list[dra.Charge] | None = None  # None until allocated (recorded then)
    facts: dra.ClaimFacts | None = None  # as recorded
    problems: list[dra.Problem] = field(default_factory=list)
    unresolved: bool = False  # a device no slice listed when recorded
    extended: bool = False
    gone: bool = False
    last_seen: int = 0
    pool: dict[str, str | None] = field(default_factory=dict)  # device class -> node pool
    spans: dict[str, _Span] = field(default_factory=dict)  # pod UID -> its interval
    reserved: set[str] = field(default_factory=set)  # pod UIDs ever in reservedFor
    written: dict[tuple[str, str], ClaimAllocationRow] = field(default_factory=dict)
    warned: set[str] = field(default_factory=set)


@dataclass
class _PodInfo:
    namespace: str
    names: tuple[str, ...]
    extended: str | None
    span: _Span | None = None


class ClaimTracker:
    """Claims, slices and claim-using pods of one cluster; see the module docstring."""

    def __init__(
        self,
        config: AccountingConfig = DEFAULT_CONFIG,
        drivers: tuple[str, ...] = dra.DEFAULT_GPU_DRIVERS,
        node_facts: Callable[[str], NodeGpus | None] = lambda _name: None,
        pending: PendingWrites | None = None,
        retention_seconds: int = 3600,
    ) -> None:
        self.config = config
        self.drivers = drivers
        self.node_facts = node_facts
        self.pending = pending if pending is not None else PendingWrites()
        self.retention_seconds = retention_seconds
        self.now = 0  # the latest observation time seen
        self._claims: dict[str, _Claim] = {}
        self._by_name: dict[tuple[str, str], str] = {}  # (namespace, name) -> current UID
        self._pods: dict[str, _PodInfo] = {}
        self._pods_by_name: dict[tuple[str, str], set[str]] = {}  # claim name -> pod UIDs
        self._devices: dict[tuple[str, str, str], dra.SliceDevice] = {}
        self._slices: dict[str, list[tuple[str, str, str]]] = {}
        self._classes: dict[str, str | None] = {}  # DeviceClass -> extendedResourceName
        self._extended: set[tuple[str, str]] = set()  # claims pods name as extended-resource
        # indexes, so that a pod's update touches only its own claims
        self._linked: dict[str, set[str]] = {}  # pod UID -> claims it is charged through
        self._reserved_by_pod: dict[str, set[str]] = {}  # pod UID -> claims reserving it
        self._unresolved: set[str] = set()  # claims with a device no slice listed
        self._dirty: set[str] = set()
        # DRA devices as node capacity (idle GPU-hours): (node, resource) -> open interval
        self._capacity: dict[tuple[str, str], tuple[int, tuple[Any, ...]]] = {}
        self._slice_seen: dict[str, int] = {}
        self.problems: dict[str, int] = dict.fromkeys(PROBLEMS, 0)

    # ------------------------------------------------------------------------------ restart

    def load(self, rows: Iterable[ClaimAllocationRow]) -> None:
        for row in rows:
            claim = self._claims.get(row.claim_uid)
            if claim is None:
                claim = self._claims[row.claim_uid] = _Claim(
                    row.claim_uid, row.namespace, row.claim_name
                )
                claim.charges = []
                self._by_name.setdefault((row.namespace, row.claim_name), row.claim_uid)
            if not any(c.device_class == row.resource_name for c in claim.charges or []):
                assert claim.charges is not None
                claim.charges.append(
                    dra.Charge(
                        device_class=row.resource_name,
                        units=row.raw_units,
                        physical=row.raw_units * row.share,
                        gpu_model=row.gpu_model,
                        node=row.node,
                        mig_profile=row.mig_profile,
                        sharing=row.sharing_strategy,
                        estimated=row.share_estimated,
                    )
                )
                claim.pool[row.resource_name] = row.node_pool
            self._linked.setdefault(row.pod_uid, set()).add(row.claim_uid)
            claim.spans[row.pod_uid] = _Span(
                row.pod_uid,
                row.pod_name,
                row.owner_kind,
                row.owner_name,
                row.pod_started_at,
                row.pod_ended_at,
                row.end_reason,
                row.estimated,
                row.updated_at,
            )
            claim.last_seen = max(claim.last_seen, row.updated_at)
            claim.written[(row.pod_uid, row.resource_name)] = row

    # ------------------------------------------------------------------------------- events

    def apply(self, kind: str, obj: Mapping[str, Any], deleted: bool, observed_at: int) -> None:
        """One ResourceClaim, ResourceSlice or DeviceClass event; AccountingError for an
        object the rules cannot read (the state is then unchanged)."""
        self.now = max(self.now, observed_at)
        if kind == "ResourceClaim":
            self._apply_claim(dra.claim_facts(obj), deleted, observed_at)
        elif kind == "ResourceSlice":
            name, devices = dra.slice_devices(obj)
            meta = mapping(obj.get("metadata"), "metadata")
            created = parse_time(meta.get("creationTimestamp"), "metadata.creationTimestamp")
            self._slice_seen[name] = max(self._slice_seen.get(name, 0), observed_at)
            if deleted:
                self._drop_slice(name, observed_at)
                self._slice_seen.pop(name, None)
            else:
                self._add_slice(name, devices, observed_at, created)
        elif kind == "DeviceClass":
            meta = mapping(obj.get("metadata"), "metadata")
            spec = mapping(obj.get("spec"), "spec")
            class_name = str(string(meta.get("name"), "metadata.name", required=True))
            if deleted:
                self._classes.pop(class_name, None)
            else:
                extended = spec.get("extendedResourceName")
                self._classes[class_name] = str(extended) if isinstance(extended, str) else None

    def resync(self, kind: str, listed: Set[Hashable], heartbeat: int) -> None:
        """After a full list of ``kind`` (already applied): what is known but was not listed
        (claims by UID, slices and classes by name) is gone; a slice's devices leave the
        capacity at the last time the slice was known to exist."""
        if kind == "ResourceClaim":
            for uid, claim in self._claims.items():
                if uid not in listed and not claim.gone:
                    claim.gone = True
                    self._dirty.add(uid)
        elif kind == "ResourceSlice":
            for name in set(self._slices) - set(listed):
                self._drop_slice(name, max(heartbeat, self._slice_seen.pop(name, 0)))
        else:
            for name in set(self._classes) - set(listed):
                del self._classes[name]

    def _apply_claim(self, facts: dra.ClaimFacts, deleted: bool, observed_at: int) -> None:
        claim = self._claims.get(facts.uid)
        if claim is None:
            claim = self._claims[facts.uid] = _Claim(facts.uid, facts.namespace, facts.name)
        claim.created_at = facts.created_at
        claim.last_seen = max(claim.last_seen, observed_at)
        self._by_name[(facts.namespace, facts.name)] = facts.uid
        claim.extended |= facts.extended or claim_key(facts) in self._extended
        claim.reserved |= set(facts.reserved_for)
        for pod_uid in facts.reserved_for:
            self._reserved_by_pod.setdefault(pod_uid, set()).add(claim.uid)
        if deleted:
            claim.gone = True
            if self._by_name.get((facts.namespace, facts.name)) == facts.uid:
                del self._by_name[(facts.namespace, facts.name)]
        if facts.allocated and (claim.charges is None or claim.unresolved):
            self._record(claim, facts)
        for pod_uid in [*facts.reserved_for, *self._pods_by_name.get(claim_key(facts), ())]:
            self._link(claim, pod_uid)
        self._dirty.add(claim.uid)

    def _record(self, claim: _Claim, facts: dra.ClaimFacts) -> None:
        """What the claim holds, at allocation time (again while a device is unknown)."""
        claim.facts = facts
        charges, problems = dra.charges(facts, self._devices, self.drivers, self.config)
        claim.unresolved = any(p.reason == "device" for p in problems)
        (self._unresolved.add if claim.unresolved else self._unresolved.discard)(claim.uid)
        claim.charges = charges
        claim.problems = problems

    def _warn(self, claim: _Claim) -> None:
        """Log and count what the claim's results lack, once per claim and reason. Called when
        rows are written: a device whose slice is merely late (another watch) is no problem."""
        for problem in claim.problems if claim.charges is not None else []:
            if problem.reason in claim.warned or (
                problem.reason == "device" and not claim.unresolved
            ):
                continue
            claim.warned.add(problem.reason)
            self.problems[problem.reason] += 1
            if problem.reason == "driver":
                log.info(
                    "ResourceClaim %s/%s: %s is not a GPU driver (GPU drivers: %s): not charged",
                    claim.namespace,
                    claim.name,
                    problem.detail,
                    ", ".join(self.drivers),
                )
            else:
                log.warning(
                    "ResourceClaim %s/%s: %s: charged as one whole GPU of the node's model",
                    claim.namespace,
                    claim.name,
                    problem.detail,
                )

    def _add_slice(
        self, name: str, devices: list[dra.SliceDevice], at: int, created: int | None
    ) -> None:
        nodes = {self._devices[k].node for k in self._slices.get(name, []) if k in self._devices}
        for key in self._slices.pop(name, []):
            self._devices.pop(key, None)
        self._slices[name] = [d.key for d in devices]
        for device in devices:
            self._devices[device.key] = device
        for node in sorted(n for n in {*nodes, *(d.node for d in devices)} if n):
            self._node_capacity(node, at, created)
        # claims recorded before their devices were listed get their facts now
        for uid in sorted(self._unresolved & self._claims.keys()):
            claim = self._claims[uid]
            if claim.facts is not None:
                self._record(claim, claim.facts)
                self._dirty.add(uid)

    def _drop_slice(self, name: str, at: int) -> None:
        keys = set(self._slices.pop(name, []))
        nodes = {self._devices[k].node for k in keys if k in self._devices}
        for key in keys:
            self._devices.pop(key, None)
        for node in sorted(n for n in nodes if n):
            self._node_capacity(node, at, None)
        if keys and any(
            not c.gone and c.charges and any(s.end is None for s in c.spans.values())
            for c in self._claims.values()
        ):
            self.problems["slice_gone"] += 1
            log.warning(
                "ResourceSlice %s disappeared under allocated claims: their devices keep the "
                "facts recorded at allocation",
                name,
            )

    # ------------------------------------------------------------------------ node capacity

    def _node_capacity(self, node: str, at: int, created: int | None) -> None:
        """The node's GPU devices per driver and model as capacity intervals, like a node's
        allocatable GPUs: a new interval whenever they change, closed when they go."""
        groups: dict[tuple[str, str | None], list[dra.SliceDevice]] = {}
        for device in self._devices.values():
            if device.node == node and device.driver in self.drivers:
                groups.setdefault((device.driver, dra.gpu_model(device.product_name)), []).append(
                    device
                )
        facts = self.node_facts(node)
        pool = facts.node_pool if facts is not None else None
        wanted: dict[str, tuple[Any, ...]] = {}
        for (driver, model), devices in groups.items():
            several = sum(1 for d, _ in groups if d == driver) > 1
            resource = f"{driver}/{model}" if several else driver
            physical = sum((dra.device_share(d, self.config) for d in devices), Fraction(0))
            wanted[resource] = (pool, model, len(devices), physical)
        for (known_node, resource), (start, value) in list(self._capacity.items()):
            if known_node != node or wanted.get(resource) == value:
                continue
            del self._capacity[(node, resource)]
            self._queue_capacity(node, resource, start, value, max(at, start))
        for resource, value in wanted.items():
            if (node, resource) in self._capacity:
                continue
            first = not any(n == node for n, _ in self._capacity) and created is not None
            start = min(at, created) if first and created is not None else at
            self._capacity[(node, resource)] = (start, value)
            self._queue_capacity(node, resource, start, value, None)

    # NodeListener: pods' ends come from the pod tracker; only the facts matter here
    def node_deleted(self, node: str, at: int) -> None:
        pass

    def node_vanished(self, node: str, heartbeat: int) -> None:
        pass

    def node_known(self, node: str) -> None:
        self.node_seen(node)

    def node_seen(self, node: str) -> None:
        """The node's facts arrived (or changed): DRA capacity recorded before its pool was
        known gets it, over the same interval (the pool is a fact of the node, not a change)."""
        facts = self.node_facts(node)
        if facts is None or facts.node_pool is None:
            return
        for (known_node, resource), (start, value) in list(self._capacity.items()):
            if known_node == node and value[0] is None:
                value = (facts.node_pool, *value[1:])
                self._capacity[(node, resource)] = (start, value)
                self._queue_capacity(node, resource, start, value, None)

    def _queue_capacity(
        self, node: str, resource: str, start: int, value: tuple[Any, ...], end: int | None
    ) -> None:
        pool, model, units, physical = value
        share = physical / units if units else Fraction(1)
        # the node tracker's collect() writes every pending capacity row
        self.pending.put(
            (node, resource, start),
            NodeCapacityRow(
                node=node,
                resource_name=resource,
                node_pool=pool,
                gpu_model=model,
                allocatable_units=units,
                physical_gpus=float(physical),
                mig_profile=None,
                labels={},
                started_at=start,
                ended_at=end,
                share_numerator=share.numerator,
                share_denominator=share.denominator,
            ),
        )

    def is_capacity(self, resource: str) -> bool:
        """Whether a stored node_capacity row is DRA devices (the tracker's, not a node's)."""
        return any(resource == d or resource.startswith(d + "/") for d in self.drivers)

    def load_capacity(self, row: NodeCapacityRow) -> None:
        self._capacity[(row.node, row.resource_name)] = (
            row.started_at,
            (
                row.node_pool,
                row.gpu_model,
                row.allocatable_units,
                row.allocatable_units * row.share,
            ),
        )

    # --------------------------------------------------------------------------------- pods

    def pod_claims(self, obj: Mapping[str, Any]) -> bool:
        """Note the claims a pod object names; whether it names any (so it must be tracked)."""
        refs = dra.pod_claims(obj)
        if refs.extended is not None:
            # made for the pod's extended-resource request: charged as that request already
            self._extended.add((refs.namespace, refs.extended))
            uid = self._by_name.get((refs.namespace, refs.extended))
            if uid is not None and not self._claims[uid].extended:
                self._claims[uid].extended = True
                self._dirty.add(uid)
        info = self._pods.get(refs.uid)
        if info is None:
            if not refs.names:
                return False  # (a pod in a claim's reservedFor got its entry from the claim)
            info = self._pods[refs.uid] = _PodInfo(refs.namespace, refs.names, refs.extended)
        else:
            info.names = tuple(dict.fromkeys([*info.names, *refs.names]))
            info.extended = info.extended or refs.extended
        for name in info.names:
            self._pods_by_name.setdefault((refs.namespace, name), set()).add(refs.uid)
            uid = self._by_name.get((refs.namespace, name))
            if uid is not None:
                self._link(self._claims[uid], refs.uid)
        return True

    def uses_claims(self, pod_uid: str) -> bool:
        return pod_uid in self._pods

    def _link(self, claim: _Claim, pod_uid: str) -> None:
        info = self._pods.get(pod_uid)
        if info is None:
            info = self._pods[pod_uid] = _PodInfo(claim.namespace, (), None)
        span = info.span
        if span is None or pod_uid in claim.spans:
            return
        if (
            claim.created_at is not None
            and span.end is not None
            and span.end <= claim.created_at
            and pod_uid not in claim.reserved
        ):
            return  # an earlier claim of the same name: this one did not exist yet
        claim.spans[pod_uid] = span
        self._linked.setdefault(pod_uid, set()).add(claim.uid)
        self._dirty.add(claim.uid)

    def pod_interval(
        self,
        pod_uid: str,
        pod_name: str,
        owner: tuple[str | None, str | None],
        started_at: int | None,
        end: BillingEnd | None,
        last_seen: int,
    ) -> None:
        """The pod's billing interval as the pod rules compute it (called when it changes)."""
        info = self._pods.get(pod_uid)
        if info is None or started_at is None:
            return
        span = _Span(
            pod_uid,
            pod_name,
            owner[0],
            owner[1],
            started_at,
            end.at if end else None,
            end.reason if end else None,
            end.estimated if end else False,
            last_seen,
        )
        for uid in self._linked.get(pod_uid, set()) & self._claims.keys():
            known = self._claims[uid].spans.get(pod_uid)
            if known is not None:
                span = _merge(known, span)
        if info.span is not None:
            span = _merge(info.span, span)
        if info.span == span:
            return
        info.span = span
        for uid in self._linked.get(pod_uid, set()) & self._claims.keys():
            self._claims[uid].spans[pod_uid] = span
            self._dirty.add(uid)
        for name in info.names:
            named = self._by_name.get((info.namespace, name))
            if named is not None:
                self._link(self._claims[named], pod_uid)
        for uid in self._reserved_by_pod.get(pod_uid, set()) & self._claims.keys():
            self._link(self._claims[uid], pod_uid)

    def resync_pods(self, listed: set[str], engine_knows: set[str], at: int) -> None:
        """After a full pod list: a pod known only from the store (loaded spans) and not
        listed vanished while unwatched; close it at the last time it was known to exist."""
        # pods that named claims but never started, and are gone: nothing to remember
        for uid in [u for u, i in self._pods.items() if i.span is None and u not in listed]:
            del self._pods[uid]
        for claim in self._claims.values():
            for uid, span in list(claim.spans.items()):
                if span.end is None and uid not in listed and uid not in engine_knows:
                    claim.spans[uid] = _Span(
                        uid,
                        span.pod_name,
                        span.owner_kind,
                        span.owner_name,
                        span.start,
                        max(span.start, at, span.last_seen),
                        END_VANISHED,
                        True,
                        span.last_seen,
                    )
                    self._dirty.add(claim.uid)

    # --------------------------------------------------------------------------------- rows

    def _claim_rows(self, claim: _Claim) -> list[ClaimAllocationRow]:
        if not claim.charges or not claim.spans:
            return []
        spans = list(claim.spans.values())
        pieces = dra.charged_pieces([dra.PodSpan(s.pod_uid, s.start, s.end) for s in spans])
        rows = []
        for charge in claim.charges:
            share = charge.physical / charge.units if charge.units else Fraction(1)
            node = self.node_facts(charge.node) if charge.node else None
            if charge.device_class not in claim.pool or claim.pool[charge.device_class] is None:
                claim.pool[charge.device_class] = node.node_pool if node else None
            model = charge.gpu_model or (node.gpu_model if node else None)
            for span in spans:
                start, end = pieces[span.pod_uid]
                if claim.extended:
                    start = end = span.start  # charged through the pod's extended resource
                rows.append(
                    ClaimAllocationRow(
                        claim_uid=claim.uid,
                        pod_uid=span.pod_uid,
                        resource_name=charge.device_class,
                        namespace=claim.namespace,
                        claim_name=claim.name,
                        pod_name=span.pod_name,
                        owner_kind=span.owner_kind,
                        owner_name=span.owner_name,
                        node=charge.node,
                        node_pool=claim.pool[charge.device_class],
                        gpu_model=model,
                        raw_units=charge.units,
                        physical_gpus=float(charge.physical),
                        share_numerator=share.numerator,
                        share_denominator=share.denominator,
                        sharing_strategy=charge.sharing,
                        mig_profile=charge.mig_profile,
                        share_estimated=charge.estimated,
                        pod_started_at=span.start,
                        pod_ended_at=span.end,
                        started_at=start,
                        ended_at=end,
                        end_reason=span.reason,
                        estimated=span.estimated,
                        updated_at=span.last_seen,
                    )
                )
        return rows

    def pending_rows(self) -> list[ClaimAllocationRow]:
        """Rows that changed since they were last written."""
        out = []
        for uid in sorted(self._dirty):
            claim = self._claims.get(uid)
            if claim is None:
                continue
            self._warn(claim)
            for row in self._claim_rows(claim):
                if claim.written.get((row.pod_uid, row.resource_name)) != row:
                    out.append(row)
        return out

    def written(self, rows: Iterable[ClaimAllocationRow]) -> None:
        for row in rows:
            self._claims[row.claim_uid].written[(row.pod_uid, row.resource_name)] = row
        self._dirty.clear()

    def open_rows(self) -> list[ClaimAllocationRow]:
        return [
            row
            for claim in self._claims.values()
            for row in self._claim_rows(claim)
            if row.ended_at is None
        ]

    def tracked(self) -> dict[str, int]:
        return {
            "resourceclaims": len(self._claims),
            "resourceslices": len(self._slices),
            "deviceclasses": len(self._classes),
        }

    def prune(self, horizon: int) -> None:
        """Forget claims that are gone, whose pods all ended, written, before ``horizon``."""
        for uid, claim in list(self._claims.items()):
            if (
                claim.gone
                and uid not in self._dirty
                and claim.last_seen < horizon
                and all(s.end is not None and s.last_seen < horizon for s in claim.spans.values())
            ):
                del self._claims[uid]
                for pod_uid in claim.spans:
                    info = self._pods.get(pod_uid)
                    if info is not None and info.span is not None and info.span.end is not None:
                        self._pods.pop(pod_uid, None)
        self._extended &= {(c.namespace, c.name) for c in self._claims.values()}
        for index in (self._linked, self._reserved_by_pod):
            for pod_uid, uids in list(index.items()):
                uids &= self._claims.keys()
                if not uids:
                    del index[pod_uid]
        self._unresolved &= self._claims.keys()
        for key, uids in list(self._pods_by_name.items()):
            uids &= set(self._pods)
            if not uids:
                del self._pods_by_name[key]


def _merge(old: _Span, new: _Span) -> _Span:
    """What two observations of a pod's interval say together: the earliest start, and the
    end the way the pod rules merge evidence (an end only moves earlier, never reopens; a
    measured end replaces an estimate), so a stale copy (a replayed prefix, an old resume)
    never undoes what is known."""
    end, reason, estimated = old.end, old.reason, old.estimated
    if new.end is not None and (
        end is None
        or (estimated and not new.estimated)
        or (estimated == new.estimated and new.end < end)
    ):
        end, reason, estimated = new.end, new.reason, new.estimated
    return _Span(
        new.pod_uid,
        new.pod_name,
        new.owner_kind,
        new.owner_name,
        min(old.start, new.start),
        end,
        reason,
        estimated,
        max(old.last_seen, new.last_seen),
    )


def claim_key(facts: dra.ClaimFacts) -> tuple[str, str]:
    return (facts.namespace, facts.name)


# ---------------------------------------------------------------------------------------------
# The trackers the Accountant registers: one per kind, over one ClaimTracker


class _DraTracker:
    """A DRA kind's Tracker (quota/accounting/trackers/base.py) over the shared state."""

    kind = ""
    plural = ""

    def __init__(self, state: ClaimTracker) -> None:
        self.state = state

    def load(self, state: StoredState) -> None:
        pass

    def apply(self, obj: Mapping[str, Any], deleted: bool, observed_at: int) -> None:
        self.state.apply(self.kind, obj, deleted, observed_at)

    def identity(self, obj: Mapping[str, Any]) -> Hashable:
        return (obj.get("metadata") or {}).get("name")

    def vanish(self, listed: Set[Hashable], heartbeat: int) -> None:
        self.state.resync(self.kind, listed, heartbeat)

    def collect(self, batch: Batch) -> None:
        pass

    def written(self, batch: Batch) -> None:
        pass

    def count(self) -> int:
        return self.state.tracked()[self.plural]


class ResourceClaimTracker(_DraTracker):
    """Owns the claim rows: loads them on restart, collects and prunes them."""

    kind = "ResourceClaim"
    plural = "resourceclaims"

    def load(self, state: StoredState) -> None:
        self.state.load(state.claim_allocations)
        for row in state.node_capacity:
            if self.state.is_capacity(row.resource_name):
                self.state.load_capacity(row)

    def identity(self, obj: Mapping[str, Any]) -> Hashable:
        return (obj.get("metadata") or {}).get("uid")

    def collect(self, batch: Batch) -> None:
        batch.claim_allocations.extend(self.state.pending_rows())

    def written(self, batch: Batch) -> None:
        self.state.written(batch.claim_allocations)
        self.state.prune(self.state.now - self.state.retention_seconds)


class ResourceSliceTracker(_DraTracker):
    kind = "ResourceSlice"
    plural = "resourceslices"


class DeviceClassTracker(_DraTracker):
    kind = "DeviceClass"
    plural = "deviceclasses"


TRACKER_TYPES: tuple[type[_DraTracker], ...] = (
    DeviceClassTracker,
    ResourceSliceTracker,
    ResourceClaimTracker,
)


def trackers(state: ClaimTracker) -> list[_DraTracker]:
    """The three DRA trackers over ``state``, slices before claims."""
    return [cls(state) for cls in TRACKER_TYPES]
