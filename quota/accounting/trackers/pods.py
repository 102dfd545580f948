"""Pods: one allocation interval per GPU resource of a pod, [started, billing end).

Node facts (model, pool, physical share) are recorded when an interval starts, or when the
node becomes known if the pod was seen first. A pod's rows are computed at flush time from its
evidence, and written only when they differ from what was written last. Pods that are gone
and written are forgotten after the retention, remembering their UIDs a while longer so a
late event cannot reopen them.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Mapping, Set
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Protocol

from gpuquota.quota.accounting.rows import AllocationRow, Batch, StoredState
from gpuquota.quota.accounting.rules.ends import (
    BillingEnd,
    EndEvidence,
    billing_end,
    observed_evidence,
)
from gpuquota.quota.accounting.rules.pods import PodFacts, in_quota_view, pod_facts
from gpuquota.quota.accounting.rules.shares import physical_share
from gpuquota.quota.accounting.trackers.base import TrackerContext
from gpuquota.quota.accounting.trackers.nodes import NodeTracker

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Recorded:
    """Node facts recorded for one resource of a pod when its interval started."""

    node: str | None
    node_pool: str | None
    gpu_model: str | None
    per_unit: Fraction
    replicas: int | None
    sharing_strategy: str | None
    mig_profile: str | None


@dataclass
class TrackedPod:
    uid: str
    namespace: str
    name: str
    node: str | None
    owner_kind: str | None = None
    owner_name: str | None = None
    qos_class: str | None = None
    facts: PodFacts | None = None  # None: known only from the store (after a restart)
    facts_at: int = -1  # observation time of ``facts``
    units: dict[str, int] = field(default_factory=dict)
    started_at: int | None = None
    recorded: dict[str, Recorded] = field(default_factory=dict)
    evidence: EndEvidence = field(default_factory=EndEvidence)
    gone: bool = False  # DELETED or vanished
    last_seen: int = 0
    written: dict[str, AllocationRow] = field(default_factory=dict)


class ClaimUsers(Protocol):
    """What the DRA claim tracker needs from the pods (quota/accounting/trackers/claims.py)."""

    def pod_claims(self, obj: Mapping[str, Any]) -> bool:
        """Note the claims a pod object names; whether the pod must be tracked for them."""

    def pod_interval(
        self,
        pod_uid: str,
        pod_name: str,
        owner: tuple[str | None, str | None],
        started_at: int | None,
        end: BillingEnd | None,
        last_seen: int,
    ) -> None:
        """A claim-using pod's billing interval, as the pod rules compute it."""

    def resync_pods(self, listed: set[str], tracked: set[str], heartbeat: int) -> None:
        """A full pod list: close pods known only from stored claim rows and not listed."""

    def uses_claims(self, pod_uid: str) -> bool:
        """Whether the pod names (or is reserved by) a ResourceClaim."""


class PodTracker:
    kind = "Pod"

    def __init__(self, context: TrackerContext, nodes: NodeTracker, retention_seconds: int):
        self.config = context.config
        self.nodes = nodes
        self.retention_seconds = retention_seconds
        self._pods: dict[str, TrackedPod] = {}
        self._by_node: dict[str, set[str]] = {}
        self._gone: set[str] = set()  # pods DELETED or vanished, pruned after retention
        self._forgotten: dict[str, int] = {}  # pruned pod UIDs -> when, to ignore late events
        self._dirty: set[str] = set()
        self.estimated_written = 0
        nodes.listeners.append(self)
        # DRA: pods that use ResourceClaims are tracked for their billing intervals, even
        # without GPU requests (set by the Accountant)
        self.claims: ClaimUsers | None = None

    # -- Tracker

    def load(self, state: StoredState) -> None:
        for row in state.allocations:
            pod = self._pods.get(row.pod_uid)
            if pod is None:
                pod = TrackedPod(
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
                    self._by_node.setdefault(row.node, set()).add(row.pod_uid)
            pod.units[row.resource_name] = row.raw_units
            pod.recorded[row.resource_name] = Recorded(
                node=row.node,
                node_pool=row.node_pool,
                gpu_model=row.gpu_model,
                per_unit=row.share,
                replicas=row.replicas,
                sharing_strategy=row.sharing_strategy,
                mig_profile=row.mig_profile,
            )
            pod.written[row.resource_name] = row

    def identity(self, obj: Mapping[str, Any]) -> Hashable:
        return (obj.get("metadata") or {}).get("uid")

    def apply(self, obj: Mapping[str, Any], deleted: bool, observed_at: int) -> None:
        facts = pod_facts(obj, self.config)
        uses_claims = self.claims is not None and self.claims.pod_claims(obj)
        if not facts.request.units and not uses_claims:
            return  # not a GPU pod (requests are immutable) and no DRA claims
        if facts.uid in self._forgotten:
            return  # a late event of a pod already closed, written and dropped from memory
        pod = self._pods.get(facts.uid)
        if pod is None:
            pod = TrackedPod(uid=facts.uid, namespace=facts.namespace, name=facts.name, node=None)
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
                self._by_node.get(pod.node, set()).discard(pod.uid)
            pod.node = facts.node
            self._by_node.setdefault(facts.node, set()).add(pod.uid)
        pod.last_seen = max(pod.last_seen, observed_at)
        if facts.started_at is not None:
            pod.started_at = (
                facts.started_at
                if pod.started_at is None
                else min(pod.started_at, facts.started_at)
            )
        evidence = observed_evidence(facts, observed_at)
        if deleted:
            pod.gone = True
            self._gone.add(pod.uid)
            evidence = evidence.merge(EndEvidence(deleted_at=observed_at))
        node_deleted = self.nodes.deleted_at(pod.node)
        if (
            node_deleted is not None
            and pod.started_at is not None
            and pod.started_at <= node_deleted
        ):
            evidence = evidence.merge(EndEvidence(node_deleted_at=node_deleted))
        self._merge(pod, evidence)
        self._record_node(pod)
        self._dirty.add(pod.uid)

    def vanish(self, listed: Set[Hashable], heartbeat: int) -> None:
        if self.claims is not None:
            self.claims.resync_pods({str(u) for u in listed}, set(self._pods), heartbeat)
        for uid, pod in self._pods.items():
            if not pod.gone and uid not in listed:
                pod.gone = True
                self._gone.add(pod.uid)
                pod.evidence = pod.evidence.merge(
                    EndEvidence(vanished_at=max(heartbeat, pod.last_seen))
                )
                self._dirty.add(uid)

    def collect(self, batch: Batch) -> None:
        for uid in sorted(self._dirty):
            pod = self._pods.get(uid)
            if pod is None:
                continue
            self._claim_interval(pod)
            for row in self.rows(pod):
                if pod.written.get(row.resource_name) != row:
                    batch.allocations.append(row)

    def written(self, batch: Batch) -> None:
        for row in batch.allocations:
            self._pods[row.pod_uid].written[row.resource_name] = row
            if row.estimated:
                self.estimated_written += 1
        self._dirty.clear()

    def count(self) -> int:
        return len(self._pods)

    # -- NodeListener

    def node_deleted(self, node: str, at: int) -> None:
        for uid in self._by_node.get(node, set()):
            pod = self._pods[uid]
            if pod.started_at is not None and pod.started_at <= at:
                self._merge(pod, EndEvidence(node_deleted_at=at))

    def node_vanished(self, node: str, heartbeat: int) -> None:
        for uid in self._by_node.get(node, set()):
            pod = self._pods[uid]
            self._merge(pod, EndEvidence(vanished_at=max(heartbeat, pod.last_seen)))

    def node_known(self, node: str) -> None:
        for uid in self._by_node.get(node, set()):
            pod = self._pods[uid]
            before = dict(pod.recorded)
            self._record_node(pod)
            if pod.recorded != before:
                self._dirty.add(uid)

    # -- reads

    def pods(self) -> list[TrackedPod]:
        return list(self._pods.values())

    def quota_usage(self, at: int) -> dict[tuple[str, str], int]:
        usage: dict[tuple[str, str], int] = {}
        for pod in self._pods.values():
            if pod.gone or pod.facts is None or not in_quota_view(pod.facts, at):
                continue
            for resource, units in pod.units.items():
                usage[(pod.namespace, resource)] = usage.get((pod.namespace, resource), 0) + units
        return usage

    def best_effort_gpu_pods(self) -> list[tuple[str, str]]:
        return sorted(
            (p.namespace, p.name)
            for p in self._pods.values()
            if not p.gone
            and p.facts is not None
            and not p.facts.terminal
            and p.facts.request.best_effort_gpu
        )

    def open_allocations(self) -> list[AllocationRow]:
        return [
            row for pod in self._pods.values() for row in self.rows(pod) if row.ended_at is None
        ]

    def rows(self, pod: TrackedPod) -> list[AllocationRow]:
        """The pod's allocation rows as they stand (none before it started)."""
        if pod.started_at is None:
            return []  # never scheduled and started: never charged
        end = billing_end(pod.started_at, pod.evidence)
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
                    # int / int is correctly rounded: float(units * share) without a Fraction
                    physical_gpus=units
                    * recorded.per_unit.numerator
                    / recorded.per_unit.denominator,
                    replicas=recorded.replicas,
                    sharing_strategy=recorded.sharing_strategy,
                    mig_profile=recorded.mig_profile,
                    started_at=pod.started_at,
                    ended_at=end.at if end else None,
                    end_reason=end.reason if end else None,
                    estimated=end.estimated if end else False,
                    qos_class=pod.qos_class,
                    updated_at=pod.last_seen,
                    share_numerator=recorded.per_unit.numerator,
                    share_denominator=recorded.per_unit.denominator,
                )
            )
        return rows

    def prune(self, now: int) -> None:
        """Forget pods that are gone and written, once late events for them are unlikely."""
        horizon = now - self.retention_seconds
        for uid in list(self._gone):
            pod = self._pods[uid]
            if pod.last_seen < horizon:
                self._gone.discard(uid)
                del self._pods[uid]
                if pod.node:
                    self._by_node.get(pod.node, set()).discard(uid)
                self._forgotten[uid] = pod.last_seen
        for uid, at in list(self._forgotten.items()):
            if at < horizon - self.retention_seconds:
                del self._forgotten[uid]

    # -- internals

    def _claim_interval(self, pod: TrackedPod) -> None:
        """Tell the claim tracker a claim-using pod's billing interval (before it collects)."""
        if self.claims is None or not self.claims.uses_claims(pod.uid):
            return
        end = billing_end(pod.started_at, pod.evidence) if pod.started_at is not None else None
        self.claims.pod_interval(
            pod.uid, pod.name, (pod.owner_kind, pod.owner_name), pod.started_at, end, pod.last_seen
        )

    def _merge(self, pod: TrackedPod, evidence: EndEvidence) -> None:
        pod.evidence = pod.evidence.merge(evidence)
        self._dirty.add(pod.uid)

    def _record_node(self, pod: TrackedPod) -> None:
        """Record the node's facts for each resource when the interval starts (or when they
        become known, if the node was not seen before the pod started)."""
        if pod.started_at is None:
            return
        gpus = self.nodes.gpus(pod.node)
        for resource in pod.units:
            known = pod.recorded.get(resource)
            if known is not None and (known.gpu_model is not None or gpus is None):
                continue
            share = physical_share(resource, gpus, self.config)
            pod.recorded[resource] = Recorded(
                node=pod.node,
                node_pool=gpus.node_pool if gpus else None,
                gpu_model=gpus.gpu_model if gpus else None,
                per_unit=share.per_unit,
                replicas=share.replicas,
                sharing_strategy=share.sharing_strategy,
                mig_profile=share.mig_profile,
            )
