"""The Accountant: applies Kubernetes watch events through the accounting rules to the store.

The live controller and ``gpuquota replay`` both feed it events; it keeps the state of pods,
nodes, namespaces and ResourceQuotas in memory, decides which rows change, and writes them in
batches with :meth:`Accountant.flush`. It is not thread-safe: one thread drives it.

Restart safety: every row has a natural key (pod UID + resource for allocations, the start
time for the other intervals), ends only ever move earlier, and on start the Accountant loads
the open intervals from the store. Replaying events it already stored therefore rewrites the
same rows, and events older than what the store holds are recognised as already counted.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from quota import accounting as acc
from quota import claimtracker, dra
from quota.store.db import (
    AllocationRow,
    Batch,
    HeartbeatRow,
    NamespaceLabelsRow,
    NodeCapacityRow,
    QuotaSampleRow,
    Store,
)

log = logging.getLogger(__name__)

EVENT_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK"})
KINDS = frozenset({"Pod", "Node", "Namespace", "ResourceQuota"}) | claimtracker.KINDS
DEFAULT_RETENTION_SECONDS = 3600


@dataclass(frozen=True)
class _Recorded:
    """Node facts recorded for one resource of a pod when its interval started."""

    node: str | None
    node_pool: str | None
    gpu_model: str | None
    per_unit: float
    replicas: int | None
    sharing_strategy: str | None
    mig_profile: str | None


@dataclass
class _Pod:
    uid: str
    namespace: str
    name: str
    node: str | None
    owner_kind: str | None = None
    owner_name: str | None = None
    qos_class: str | None = None
    facts: acc.PodFacts | None = None  # None: known only from the store (after a restart)
    facts_at: int = -1  # observation time of ``facts``
    units: dict[str, int] = field(default_factory=dict)
    started_at: int | None = None
    recorded: dict[str, _Recorded] = field(default_factory=dict)
    evidence: acc.EndEvidence = field(default_factory=acc.EndEvidence)
    gone: bool = False  # DELETED or vanished
    last_seen: int = 0
    written: dict[str, AllocationRow] = field(default_factory=dict)


@dataclass
class _Interval:
    """An open interval of node capacity or namespace labels, and what it records."""

    started_at: int
    value: Any


@dataclass
class _Node:
    gpus: acc.NodeGpus
    observed_at: int


@dataclass
class _Quota:
    namespace: str
    name: str
    last_seen: int
    resources: set[str] = field(default_factory=set)


class Accountant:
    """Turns watch events into allocation, capacity, label and quota rows of one cluster."""

    def __init__(
        self,
        store: Store,
        cluster: str,
        config: acc.AccountingConfig = acc.DEFAULT_CONFIG,
        *,
        holder: str = "gpuquota",
        retention_seconds: int = DEFAULT_RETENTION_SECONDS,
        dra_drivers: tuple[str, ...] = dra.DEFAULT_GPU_DRIVERS,
    ) -> None:
        self.store = store
        self.cluster = cluster
        self.config = config
        self.holder = holder
        self.retention_seconds = retention_seconds
        self._pods: dict[str, _Pod] = {}
        self._pods_by_node: dict[str, set[str]] = {}
        self._gone: set[str] = set()  # pods DELETED or vanished, pruned after retention
        self._forgotten: dict[str, int] = {}  # pruned pod UIDs -> when, to ignore late events
        self._nodes: dict[str, _Node] = {}
        self._deleted_nodes: dict[str, int] = {}
        self._capacity: dict[str, dict[str, _Interval]] = {}  # node -> resource -> open
        self._node_seen: dict[str, int] = {}
        self._namespaces: dict[str, _Interval] = {}
        self._namespace_seen: dict[str, int] = {}
        self._quotas: dict[tuple[str, str], _Quota] = {}
        self._samples: dict[tuple[str, str, str], QuotaSampleRow] = {}
        self._resource_versions: dict[str, str] = {}
        self._heartbeat_at: int | None = None
        self._now = 0  # latest observation time seen
        # pending writes, keyed by natural key so a later change replaces an unsent one
        self._dirty_pods: set[str] = set()
        self._pending_capacity: dict[tuple[str, str, int], NodeCapacityRow] = {}
        self._pending_labels: dict[tuple[str, int], NamespaceLabelsRow] = {}
        self._pending_samples: dict[tuple[str, str, str, int], QuotaSampleRow] = {}
        self._pending_heartbeat: HeartbeatRow | None = None
        self.stats: dict[str, int] = {"events": 0, "flushes": 0, "rows_written": 0, "estimated": 0}
        self.claims = claimtracker.ClaimTracker(config, dra_drivers, self._node_facts)
        self._load()

    # ------------------------------------------------------------------------------- restart

    def _load(self) -> None:
        state = self.store.load(self.cluster)
        if state.heartbeat is not None:
            self._heartbeat_at = state.heartbeat.at
            self._resource_versions = {
                str(k): str(v) for k, v in state.heartbeat.resource_versions.items()
            }
            self._now = state.heartbeat.at
        for row in state.allocations:
            pod = self._pods.get(row.pod_uid)
            if pod is None:
                pod = _Pod(
                    uid=row.pod_uid, namespace=row.namespace, name=row.pod_name, node=row.node
                )
                pod.owner_kind, pod.owner_name, pod.qos_class = (
                    row.owner_kind,
                    row.owner_name,
                    row.qos_class,
                )
                pod.started_at = row.started_at
                pod.last_seen = row.updated_at
                self._pods[row.pod_uid] = pod
                if row.node:
                    self._pods_by_node.setdefault(row.node, set()).add(row.pod_uid)
            pod.units[row.resource_name] = row.raw_units
            pod.recorded[row.resource_name] = _Recorded(
                node=row.node,
                node_pool=row.node_pool,
                gpu_model=row.gpu_model,
                per_unit=row.physical_gpus / row.raw_units if row.raw_units else 0.0,
                replicas=row.replicas,
                sharing_strategy=row.sharing_strategy,
                mig_profile=row.mig_profile,
            )
            pod.written[row.resource_name] = row
        self.claims.load(state.claim_allocations)
        for cap in state.node_capacity:
            if self.claims.is_capacity(cap.resource_name):
                self.claims.load_capacity(cap)  # a DRA driver's devices, not allocatable
                continue
            self._capacity.setdefault(cap.node, {})[cap.resource_name] = _Interval(
                cap.started_at, _capacity_value(cap)
            )
        for ns in state.namespace_labels:
            self._namespaces[ns.namespace] = _Interval(ns.valid_from, dict(ns.labels))
        for sample in state.quota_samples:
            self._samples[(sample.namespace, sample.quota_name, sample.resource_name)] = sample
            if sample.hard is not None or sample.used is not None:
                quota = self._quotas.setdefault(
                    (sample.namespace, sample.quota_name),
                    _Quota(sample.namespace, sample.quota_name, sample.observed_at),
                )
                quota.last_seen = max(quota.last_seen, sample.observed_at)
                quota.resources.add(sample.resource_name)

    # -------------------------------------------------------------------------------- events

    def apply(self, event_type: str, obj: Mapping[str, Any], observed_at: int) -> None:
        """Apply one watch event seen at ``observed_at`` (unix seconds).

        Raises acc.AccountingError for an object the rules cannot read; the state is then
        unchanged.
        """
        if event_type not in EVENT_TYPES:
            raise acc.AccountingError(f"unknown event type {event_type!r}")
        if not isinstance(obj, Mapping):
            raise acc.AccountingError("event object: expected an object")
        kind = obj.get("kind")
        if not isinstance(kind, str) or not kind:
            raise acc.AccountingError("event object has no kind")
        self.stats["events"] += 1
        self._now = max(self._now, observed_at)
        meta = obj.get("metadata")
        version = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
        if isinstance(version, str) and version:
            self._resource_versions[kind] = version
        if event_type == "BOOKMARK":
            return
        deleted = event_type == "DELETED"
        if kind == "Pod":
            facts = acc.pod_facts(obj, self.config)
            uses_claims = self.claims.pod_claims(obj)
            self._apply_pod(facts, deleted, observed_at, uses_claims)
        elif kind in claimtracker.KINDS:
            self.claims.apply(kind, obj, deleted, observed_at)
        elif kind == "Node":
            self._apply_node(acc.node_gpus(obj, self.config), deleted, observed_at)
        elif kind == "Namespace":
            self._apply_namespace(acc.namespace_labels(obj), deleted, observed_at)
        elif kind == "ResourceQuota":
            # a quota's figures changed when it was last written (its managedFields time), not
            # when the controller happened to see it; a deletion is as seen
            changed = None if deleted else acc.last_written(obj)
            at = observed_at if changed is None else min(observed_at, changed)
            self._apply_quota(acc.quota_facts(obj, self.config), deleted, at)
        # other kinds are not accounted

    def resync(self, kind: str, objects: Iterable[Mapping[str, Any]], observed_at: int) -> None:
        """Apply a full list of ``kind`` taken at ``observed_at``; whatever is known but missing
        from it vanished while unwatched, and is closed at the last time it was known to exist
        (the heartbeat, or its last event if later), marked estimated."""
        if kind not in KINDS:
            raise acc.AccountingError(f"cannot resync kind {kind!r}")
        objects = list(objects)
        for obj in objects:
            if obj.get("kind") is None:
                obj = {**obj, "kind": kind}
            self.apply("MODIFIED", obj, observed_at)
        names = {_identity(kind, obj) for obj in objects}
        hb = self._heartbeat_at or 0
        if kind in claimtracker.KINDS:
            self.claims.resync(kind, names, observed_at)  # the objects were applied above
            return
        if kind == "Pod":
            self.claims.resync_pods(names, set(self._pods), hb)
            for uid, pod in self._pods.items():
                if not pod.gone and uid not in names:
                    pod.gone = True
                    self._gone.add(pod.uid)
                    pod.evidence = pod.evidence.merge(
                        acc.EndEvidence(vanished_at=max(hb, pod.last_seen))
                    )
                    self._dirty_pods.add(uid)
        elif kind == "Node":
            known = {*self._nodes, *self._capacity}
            for name in known - names:
                at = max(hb, self._node_seen.get(name, 0))
                self._nodes.pop(name, None)
                self._close_capacity(name, at)
                for uid in self._pods_by_node.get(name, set()):
                    pod = self._pods[uid]
                    self._merge(pod, acc.EndEvidence(vanished_at=max(hb, pod.last_seen)))
        elif kind == "Namespace":
            for name in set(self._namespaces) - names:
                self._close_namespace(name, max(hb, self._namespace_seen.get(name, 0)))
        else:
            for key in set(self._quotas) - names:
                quota = self._quotas[key]
                self._delete_quota(quota, max(hb, quota.last_seen))

    def heartbeat(self, now: int) -> None:
        """Record that the cluster's state was known at ``now``; written at the next flush.
        Call it only while every watch is healthy: it bounds what a restart estimates."""
        self._heartbeat_at = max(self._heartbeat_at or 0, now)
        self._now = max(self._now, now)
        self._pending_heartbeat = HeartbeatRow(
            holder=self.holder,
            at=self._heartbeat_at,
            resource_versions=dict(self._resource_versions),
        )

    # ------------------------------------------------------------------------------------ pods

    def _apply_pod(
        self, facts: acc.PodFacts, deleted: bool, observed_at: int, uses_claims: bool = False
    ) -> None:
        if not facts.request.units and not uses_claims:
            return  # not a GPU pod (requests are immutable) and no DRA claims
        if facts.uid in self._forgotten:
            return  # a late event of a pod already closed, written and dropped from memory
        pod = self._pods.get(facts.uid)
        if pod is None:
            pod = _Pod(uid=facts.uid, namespace=facts.namespace, name=facts.name, node=None)
            self._pods[facts.uid] = pod
            if facts.request.best_effort_gpu:
                log.debug(
                    "pod %s/%s requests GPUs but is BestEffort: NotBestEffort-scoped quotas do not count it",
                    facts.namespace,
                    facts.name,
                )
        if observed_at >= pod.facts_at:
            pod.facts, pod.facts_at = facts, observed_at
            pod.namespace, pod.name = facts.namespace, facts.name
            pod.owner_kind, pod.owner_name = facts.owner_kind, facts.owner_name
            pod.qos_class = facts.request.qos_class
            pod.units = dict(facts.request.units)
        if facts.node and pod.node != facts.node:
            if pod.node:
                self._pods_by_node.get(pod.node, set()).discard(pod.uid)
            pod.node = facts.node
            self._pods_by_node.setdefault(facts.node, set()).add(pod.uid)
        pod.last_seen = max(pod.last_seen, observed_at)
        if facts.started_at is not None:
            pod.started_at = (
                facts.started_at
                if pod.started_at is None
                else min(pod.started_at, facts.started_at)
            )
        evidence = acc.observed_evidence(facts, observed_at)
        if deleted:
            pod.gone = True
            self._gone.add(pod.uid)
            evidence = evidence.merge(acc.EndEvidence(deleted_at=observed_at))
        node_deleted = self._deleted_nodes.get(pod.node or "")
        if (
            node_deleted is not None
            and pod.started_at is not None
            and pod.started_at <= node_deleted
        ):
            evidence = evidence.merge(acc.EndEvidence(node_deleted_at=node_deleted))
        self._merge(pod, evidence)
        self._record_node(pod)
        self._dirty_pods.add(pod.uid)

    def _merge(self, pod: _Pod, evidence: acc.EndEvidence) -> None:
        pod.evidence = pod.evidence.merge(evidence)
        self._dirty_pods.add(pod.uid)

    def _record_node(self, pod: _Pod) -> None:
        """Record the node's facts for each resource when the interval starts (or when they
        become known, if the node was not seen before the pod started)."""
        if pod.started_at is None:
            return
        node = self._nodes.get(pod.node or "")
        for resource in pod.units:
            known = pod.recorded.get(resource)
            if known is not None and (known.gpu_model is not None or node is None):
                continue
            gpus = node.gpus if node is not None else None
            share = acc.physical_share(resource, gpus, self.config)
            pod.recorded[resource] = _Recorded(
                node=pod.node,
                node_pool=gpus.node_pool if gpus else None,
                gpu_model=gpus.gpu_model if gpus else None,
                per_unit=share.per_unit,
                replicas=share.replicas,
                sharing_strategy=share.sharing_strategy,
                mig_profile=share.mig_profile,
            )

    def _pod_rows(self, pod: _Pod) -> list[AllocationRow]:
        if pod.started_at is None:
            return []  # never scheduled and started: never charged
        end = acc.billing_end(pod.started_at, pod.evidence)
        rows = []
        for resource, units in sorted(pod.units.items()):
            recorded = pod.recorded[resource]
            rows.append(
                AllocationRow(
                    pod_uid=pod.uid,
                    resource_name=resource,
                    namespace=pod.namespace,
                    pod_name=pod.name,
                    owner_kind=pod.owner_kind,
                    owner_name=pod.owner_name,
                    node=recorded.node,
                    node_pool=recorded.node_pool,
                    gpu_model=recorded.gpu_model,
                    raw_units=units,
                    physical_gpus=units * recorded.per_unit,
                    replicas=recorded.replicas,
                    sharing_strategy=recorded.sharing_strategy,
                    mig_profile=recorded.mig_profile,
                    started_at=pod.started_at,
                    ended_at=end.at if end else None,
                    end_reason=end.reason if end else None,
                    estimated=end.estimated if end else False,
                    qos_class=pod.qos_class,
                    updated_at=pod.last_seen,
                )
            )
        return rows

    # ----------------------------------------------------------------------------------- nodes

    def _apply_node(self, gpus: acc.NodeGpus, deleted: bool, observed_at: int) -> None:
        name = gpus.name
        current = self._nodes.get(name)
        if current is not None and observed_at < current.observed_at:
            return  # stale copy
        self._node_seen[name] = max(self._node_seen.get(name, 0), observed_at)
        if deleted:
            at = (
                observed_at
                if gpus.deletion_at is None
                else min(observed_at, max(gpus.deletion_at, 0))
            )
            self._nodes.pop(name, None)
            self._deleted_nodes[name] = at
            self._close_capacity(name, at)
            for uid in self._pods_by_node.get(name, set()):
                pod = self._pods[uid]
                if pod.started_at is not None and pod.started_at <= at:
                    self._merge(pod, acc.EndEvidence(node_deleted_at=at))
            return
        deleted_at = self._deleted_nodes.get(name)
        if deleted_at is not None:
            if gpus.created_at is None or gpus.created_at < deleted_at:
                return  # a late copy of the deleted node
            del self._deleted_nodes[name]  # a new node with a reused name
        first_sight = current is None
        self._nodes[name] = _Node(gpus, observed_at)
        resources = {r for r, units in gpus.allocatable.items() if units > 0}
        resources |= set(self._capacity.get(name, {}))
        for resource in sorted(resources):
            units = gpus.allocatable.get(resource, 0)
            open_interval = self._capacity.get(name, {}).get(resource)
            if open_interval is not None and observed_at < open_interval.started_at:
                continue  # already stored by a run that saw a later copy
            share = acc.physical_share(resource, gpus, self.config)
            value = (
                gpus.node_pool,
                gpus.gpu_model,
                units,
                units * share.per_unit,
                share.mig_profile,
                dict(gpus.labels),
            )
            if open_interval is not None and open_interval.value == value:
                continue
            if open_interval is not None:
                self._close_capacity(name, observed_at, only=resource)
            if units <= 0:
                continue
            start = observed_at
            if first_sight and open_interval is None and gpus.created_at is not None:
                start = min(gpus.created_at, observed_at)  # capacity exists since creation
            self._capacity.setdefault(name, {})[resource] = _Interval(start, value)
            self._queue_capacity(name, resource, start, value, None)
        self.claims.node_seen(name)  # DRA capacity recorded before the node's pool was known
        # pods that started before their node was seen get its facts now
        for uid in self._pods_by_node.get(name, set()):
            pod = self._pods[uid]
            before = dict(pod.recorded)
            self._record_node(pod)
            if pod.recorded != before:
                self._dirty_pods.add(uid)

    def _close_capacity(self, node: str, at: int, only: str | None = None) -> None:
        intervals = self._capacity.get(node, {})
        for resource, interval in list(intervals.items()):
            if only is not None and resource != only:
                continue
            del intervals[resource]
            self._queue_capacity(
                node, resource, interval.started_at, interval.value, max(at, interval.started_at)
            )
        if not intervals:
            self._capacity.pop(node, None)

    def _queue_capacity(
        self, node: str, resource: str, start: int, value: Any, end: int | None
    ) -> None:
        pool, model, units, physical, mig_profile, labels = value
        self._pending_capacity[(node, resource, start)] = NodeCapacityRow(
            node=node,
            resource_name=resource,
            node_pool=pool,
            gpu_model=model,
            allocatable_units=units,
            physical_gpus=physical,
            mig_profile=mig_profile,
            labels=labels,
            started_at=start,
            ended_at=end,
        )

    # ------------------------------------------------------------------------------ namespaces

    def _apply_namespace(
        self,
        facts: tuple[str, dict[str, str], int | None, int | None],
        deleted: bool,
        observed_at: int,
    ) -> None:
        name, labels, created_at, _ = facts
        current = self._namespaces.get(name)
        if current is not None and observed_at < current.started_at:
            return  # already stored by a run that saw a later copy
        if current is not None and created_at is not None and created_at > current.started_at:
            # a new namespace with a reused name: the old one ended before it was created
            self._close_namespace(name, created_at)
            current = None
        self._namespace_seen[name] = max(self._namespace_seen.get(name, 0), observed_at)
        if deleted:
            if current is not None:
                self._close_namespace(name, observed_at)
            return
        if current is not None and current.value == labels:
            return
        if current is not None:
            self._close_namespace(name, observed_at)
            start = observed_at
        else:
            start = min(created_at, observed_at) if created_at is not None else observed_at
        self._namespaces[name] = _Interval(start, labels)
        self._pending_labels[(name, start)] = NamespaceLabelsRow(name, labels, start, None)

    def _close_namespace(self, name: str, at: int) -> None:
        interval = self._namespaces.pop(name, None)
        if interval is None:
            return
        end = max(at, interval.started_at)
        self._pending_labels[(name, interval.started_at)] = NamespaceLabelsRow(
            name, interval.value, interval.started_at, end
        )

    # ---------------------------------------------------------------------------------- quotas

    def _apply_quota(self, facts: acc.QuotaFacts, deleted: bool, observed_at: int) -> None:
        key = (facts.namespace, facts.name)
        quota = self._quotas.get(key)
        if quota is not None and observed_at < quota.last_seen:
            return  # stale copy
        if quota is None:
            quota = self._quotas[key] = _Quota(facts.namespace, facts.name, observed_at)
        quota.last_seen = observed_at
        if deleted:
            self._delete_quota(quota, observed_at)
            return
        figures = {f.resource_name: f for f in facts.figures}
        for resource in sorted(quota.resources - set(figures)):
            self._sample(quota, resource, None, None, list(facts.scopes), observed_at)
        quota.resources = set(figures)
        for resource, figure in sorted(figures.items()):
            self._sample(quota, resource, figure.hard, figure.used, list(facts.scopes), observed_at)

    def _delete_quota(self, quota: _Quota, at: int) -> None:
        for resource in sorted(quota.resources):
            last = self._samples.get((quota.namespace, quota.name, resource))
            self._sample(quota, resource, None, None, last.scopes if last else [], at)
        self._quotas.pop((quota.namespace, quota.name), None)

    def _sample(
        self,
        quota: _Quota,
        resource: str,
        hard: float | None,
        used: float | None,
        scopes: list[str],
        at: int,
    ) -> None:
        key = (quota.namespace, quota.name, resource)
        last = self._samples.get(key)
        if last is not None:
            if at < last.observed_at:
                return  # already stored by a run that saw a later copy
            if (last.hard, last.used, last.scopes) == (hard, used, scopes):
                return  # stored only when something changes
        sample = QuotaSampleRow(quota.namespace, quota.name, resource, hard, used, scopes, at)
        self._samples[key] = sample
        self._pending_samples[(*key, at)] = sample

    # ----------------------------------------------------------------------------------- reads

    @property
    def resource_versions(self) -> dict[str, str]:
        """The latest resourceVersion seen per kind (stored with the heartbeat)."""
        return dict(self._resource_versions)

    @property
    def heartbeat_at(self) -> int | None:
        return self._heartbeat_at

    def quota_usage(self, now: int | None = None) -> dict[tuple[str, str], int]:
        """GPU units each namespace's pods count against ResourceQuota now (quota view):
        {(namespace, resource): units}, Pending and unscheduled pods included."""
        at = self._now if now is None else now
        usage: dict[tuple[str, str], int] = {}
        for pod in self._pods.values():
            if pod.gone or pod.facts is None or not acc.in_quota_view(pod.facts, at):
                continue
            for resource, units in pod.units.items():
                usage[(pod.namespace, resource)] = usage.get((pod.namespace, resource), 0) + units
        return usage

    def best_effort_gpu_pods(self) -> list[tuple[str, str]]:
        """(namespace, name) of GPU pods that quota would count (not gone, not terminal) but
        that are BestEffort, so NotBestEffort-scoped quotas miss them."""
        return sorted(
            (p.namespace, p.name)
            for p in self._pods.values()
            if not p.gone
            and p.facts is not None
            and not p.facts.terminal
            and p.facts.request.best_effort_gpu
        )

    def open_allocations(self) -> list[AllocationRow]:
        """Rows of pods still holding GPUs, as the next flush would write them."""
        return [
            row
            for pod in self._pods.values()
            for row in self._pod_rows(pod)
            if row.ended_at is None
        ]

    def tracked(self) -> dict[str, int]:
        """How many objects the Accountant holds in memory, per kind (for metrics)."""
        return {
            "pods": len(self._pods),
            "nodes": len(self._nodes),
            "namespaces": len(self._namespaces),
            "resourcequotas": len(self._quotas),
            **self.claims.tracked(),
        }

    def pending(self) -> int:
        """How many rows the next flush would write."""
        return len(self._batch())

    # ---------------------------------------------------------------------------------- writes

    def _node_facts(self, name: str) -> acc.NodeGpus | None:
        node = self._nodes.get(name)
        return node.gpus if node is not None else None

    def _claim_pod_interval(self, pod: _Pod) -> None:
        """Tell the claim tracker a claim-using pod's billing interval (the pod rules')."""
        if not self.claims.uses_claims(pod.uid):
            return
        end = acc.billing_end(pod.started_at, pod.evidence) if pod.started_at is not None else None
        self.claims.pod_interval(
            pod.uid, pod.name, (pod.owner_kind, pod.owner_name), pod.started_at, end, pod.last_seen
        )

    def _batch(self) -> Batch:
        allocations = []
        for uid in sorted(self._dirty_pods):
            pod = self._pods.get(uid)
            if pod is None:
                continue
            self._claim_pod_interval(pod)
            for row in self._pod_rows(pod):
                if pod.written.get(row.resource_name) != row:
                    allocations.append(row)
        return Batch(
            allocations=allocations,
            node_capacity=[*self._pending_capacity.values(), *self.claims.pending_capacity()],
            namespace_labels=list(self._pending_labels.values()),
            quota_samples=list(self._pending_samples.values()),
            heartbeat=self._pending_heartbeat,
            observed_at=self._now,
            claim_allocations=self.claims.pending_rows(),
        )

    def flush(self) -> int:
        """Write everything pending in one transaction; returns the number of rows written.

        On a database failure raises StoreError and keeps everything pending, so calling
        flush again later writes it (the writes are idempotent).
        """
        batch = self._batch()
        if len(batch):
            self.store.write(self.cluster, batch)
        for row in batch.allocations:
            self._pods[row.pod_uid].written[row.resource_name] = row
            if row.estimated:
                self.stats["estimated"] += 1
        self.claims.written(batch.claim_allocations)
        self._dirty_pods.clear()
        self._pending_capacity.clear()
        self._pending_labels.clear()
        self._pending_samples.clear()
        self._pending_heartbeat = None
        self.stats["flushes"] += 1
        self.stats["rows_written"] += len(batch)
        self._prune()
        return len(batch)

    def _prune(self) -> None:
        """Forget pods that are gone and written, once late events for them are unlikely."""
        horizon = self._now - self.retention_seconds
        for uid in list(self._gone):
            pod = self._pods[uid]
            if pod.last_seen < horizon:
                self._gone.discard(uid)
                del self._pods[uid]
                if pod.node:
                    self._pods_by_node.get(pod.node, set()).discard(uid)
                self._forgotten[uid] = pod.last_seen
        for uid, at in list(self._forgotten.items()):
            if at < horizon - self.retention_seconds:
                del self._forgotten[uid]
        self.claims.prune(horizon)


def check_dra(kind: str, obj: Mapping[str, Any]) -> None:
    """Validate a DRA object with the rules the claim tracker applies (for replay's check)."""
    if kind == "ResourceClaim":
        dra.claim_facts(obj)
    elif kind == "ResourceSlice":
        dra.slice_devices(obj)


def _capacity_value(row: NodeCapacityRow) -> tuple[Any, ...]:
    return (
        row.node_pool,
        row.gpu_model,
        row.allocatable_units,
        row.physical_gpus,
        row.mig_profile,
        dict(row.labels),
    )


def _identity(kind: str, obj: Mapping[str, Any]) -> Any:
    meta = obj.get("metadata") or {}
    if kind in ("Pod", "ResourceClaim"):
        return meta.get("uid")
    if kind == "ResourceQuota":
        return (meta.get("namespace") or "default", meta.get("name"))
    return meta.get("name")
