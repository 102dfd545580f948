"""Nodes: their GPU facts (which pods' intervals record) and allocatable-capacity intervals.

Other trackers that hang off a node (pods; a later DRA claim tracker) subscribe as
:class:`NodeListener` to hear of a node's deletion, its vanishing, or facts becoming known,
and read the facts through :meth:`NodeTracker.gpus` and :meth:`NodeTracker.deleted_at`.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Set
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Protocol

from gpuquota.quota.accounting.rows import Batch, NodeCapacityRow, StoredState
from gpuquota.quota.accounting.rules.nodes import NodeGpus, node_gpus
from gpuquota.quota.accounting.rules.shares import physical_share
from gpuquota.quota.accounting.trackers.base import TrackerContext


class NodeListener(Protocol):
    """A tracker whose objects live on nodes."""

    def node_deleted(self, node: str, at: int) -> None:
        """``node`` was deleted at ``at``: what ran on it and started by then ends there."""

    def node_vanished(self, node: str, heartbeat: int) -> None:
        """``node`` was missing from a full list: what ran on it vanished too."""

    def node_known(self, node: str) -> None:
        """``node``'s facts are known or changed: record them where still unknown."""


@dataclass(frozen=True)
class CapacityValue:
    """What one capacity interval records; a change closes the interval and opens another."""

    node_pool: str | None
    gpu_model: str | None
    allocatable_units: int
    share: Fraction  # of one unit
    mig_profile: str | None
    labels: Mapping[str, Any]

    @staticmethod
    def of(row: NodeCapacityRow) -> CapacityValue:
        return CapacityValue(
            row.node_pool,
            row.gpu_model,
            row.allocatable_units,
            row.share,
            row.mig_profile,
            dict(row.labels),
        )


@dataclass
class _Interval:
    started_at: int
    value: CapacityValue


@dataclass
class _Node:
    gpus: NodeGpus
    observed_at: int


class NodeTracker:
    kind = "Node"

    def __init__(self, context: TrackerContext) -> None:
        self.config = context.config
        self.pending = context.pending
        self.listeners: list[NodeListener] = []
        self._nodes: dict[str, _Node] = {}
        self._deleted: dict[str, int] = {}
        self._capacity: dict[str, dict[str, _Interval]] = {}  # node -> resource -> open
        self._seen: dict[str, int] = {}

    # -- reads for the trackers that hang off nodes

    def gpus(self, node: str | None) -> NodeGpus | None:
        current = self._nodes.get(node or "")
        return current.gpus if current is not None else None

    def deleted_at(self, node: str | None) -> int | None:
        return self._deleted.get(node or "")

    # -- Tracker

    def load(self, state: StoredState) -> None:
        for cap in state.node_capacity:
            if not self.config.is_gpu(cap.resource_name):
                continue  # a DRA driver's devices (trackers/claims.py), not allocatable
            self._capacity.setdefault(cap.node, {})[cap.resource_name] = _Interval(
                cap.started_at, CapacityValue.of(cap)
            )

    def identity(self, obj: Mapping[str, Any]) -> Hashable:
        return (obj.get("metadata") or {}).get("name")

    def apply(self, obj: Mapping[str, Any], deleted: bool, observed_at: int) -> None:
        gpus = node_gpus(obj, self.config)
        name = gpus.name
        current = self._nodes.get(name)
        if current is not None and observed_at < current.observed_at:
            return  # stale copy
        self._seen[name] = max(self._seen.get(name, 0), observed_at)
        if deleted:
            at = (
                observed_at
                if gpus.deletion_at is None
                else min(observed_at, max(gpus.deletion_at, 0))
            )
            self._nodes.pop(name, None)
            self._deleted[name] = at
            self._close(name, at)
            for listener in self.listeners:
                listener.node_deleted(name, at)
            return
        deleted_at = self._deleted.get(name)
        if deleted_at is not None:
            if gpus.created_at is None or gpus.created_at < deleted_at:
                return  # a late copy of the deleted node
            del self._deleted[name]  # a new node with a reused name
        first_sight = current is None
        self._nodes[name] = _Node(gpus, observed_at)
        resources = {r for r, units in gpus.allocatable.items() if units > 0}
        resources |= set(self._capacity.get(name, {}))
        for resource in sorted(resources):
            units = gpus.allocatable.get(resource, 0)
            open_interval = self._capacity.get(name, {}).get(resource)
            if open_interval is not None and observed_at < open_interval.started_at:
                continue  # already stored by a run that saw a later copy
            share = physical_share(resource, gpus, self.config)
            value = CapacityValue(
                gpus.node_pool,
                gpus.gpu_model,
                units,
                share.per_unit,
                share.mig_profile,
                dict(gpus.labels),
            )
            if open_interval is not None and open_interval.value == value:
                continue
            if open_interval is not None:
                self._close(name, observed_at, only=resource)
            if units <= 0:
                continue
            start = observed_at
            if first_sight and open_interval is None and gpus.created_at is not None:
                start = min(gpus.created_at, observed_at)  # capacity exists since creation
            self._capacity.setdefault(name, {})[resource] = _Interval(start, value)
            self._queue(name, resource, start, value, None)
        # what started on the node before it was seen gets its facts now
        for listener in self.listeners:
            listener.node_known(name)

    def vanish(self, listed: Set[Hashable], heartbeat: int) -> None:
        for name in {*self._nodes, *self._capacity} - listed:
            at = max(heartbeat, self._seen.get(name, 0))
            self._nodes.pop(name, None)
            self._close(name, at)
            for listener in self.listeners:
                listener.node_vanished(name, heartbeat)

    def collect(self, batch: Batch) -> None:
        batch.node_capacity.extend(self.pending.rows(NodeCapacityRow))

    def written(self, batch: Batch) -> None:
        pass

    def count(self) -> int:
        return len(self._nodes)

    # -- capacity intervals

    def _close(self, node: str, at: int, only: str | None = None) -> None:
        intervals = self._capacity.get(node, {})
        for resource, interval in list(intervals.items()):
            if only is not None and resource != only:
                continue
            del intervals[resource]
            self._queue(
                node, resource, interval.started_at, interval.value, max(at, interval.started_at)
            )
        if not intervals:
            self._capacity.pop(node, None)

    def _queue(
        self, node: str, resource: str, start: int, value: CapacityValue, end: int | None
    ) -> None:
        self.pending.put(
            (node, resource, start),
            NodeCapacityRow(
                node=node,
                resource_name=resource,
                node_pool=value.node_pool,
                gpu_model=value.gpu_model,
                allocatable_units=value.allocatable_units,
                physical_gpus=float(value.allocatable_units * value.share),
                share_numerator=value.share.numerator,
                share_denominator=value.share.denominator,
                mig_profile=value.mig_profile,
                labels=dict(value.labels),
                started_at=start,
                ended_at=end,
            ),
        )
