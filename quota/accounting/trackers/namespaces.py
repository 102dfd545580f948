"""Namespaces: their label sets over time, one interval per distinct set, for the report's
grouping by label (team, cost centre)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Set
from dataclasses import dataclass
from typing import Any

from gpuquota.quota.accounting.rows import Batch, NamespaceLabelsRow, StoredState
from gpuquota.quota.accounting.rules.quotas import namespace_labels
from gpuquota.quota.accounting.trackers.base import TrackerContext


@dataclass
class _Interval:
    started_at: int
    labels: dict[str, Any]


class NamespaceTracker:
    kind = "Namespace"

    def __init__(self, context: TrackerContext) -> None:
        self.pending = context.pending
        self._open: dict[str, _Interval] = {}
        self._seen: dict[str, int] = {}

    def load(self, state: StoredState) -> None:
        for ns in state.namespace_labels:
            self._open[ns.namespace] = _Interval(ns.valid_from, dict(ns.labels))

    def identity(self, obj: Mapping[str, Any]) -> Hashable:
        return (obj.get("metadata") or {}).get("name")

    def apply(self, obj: Mapping[str, Any], deleted: bool, observed_at: int) -> None:
        name, labels, created_at, _ = namespace_labels(obj)
        current = self._open.get(name)
        if current is not None and observed_at < current.started_at:
            return  # already stored by a run that saw a later copy
        if current is not None and created_at is not None and created_at > current.started_at:
            # a new namespace with a reused name: the old one ended before it was created
            self._close(name, created_at)
            current = None
        self._seen[name] = max(self._seen.get(name, 0), observed_at)
        if deleted:
            if current is not None:
                self._close(name, observed_at)
            return
        if current is not None and current.labels == labels:
            return
        if current is not None:
            self._close(name, observed_at)
            start = observed_at
        else:
            start = min(created_at, observed_at) if created_at is not None else observed_at
        self._open[name] = _Interval(start, labels)
        self.pending.put((name, start), NamespaceLabelsRow(name, labels, start, None))

    def vanish(self, listed: Set[Hashable], heartbeat: int) -> None:
        for name in set(self._open) - listed:
            self._close(name, max(heartbeat, self._seen.get(name, 0)))

    def collect(self, batch: Batch) -> None:
        batch.namespace_labels.extend(self.pending.rows(NamespaceLabelsRow))

    def written(self, batch: Batch) -> None:
        pass

    def count(self) -> int:
        return len(self._open)

    def _close(self, name: str, at: int) -> None:
        interval = self._open.pop(name, None)
        if interval is None:
            return
        end = max(at, interval.started_at)
        self.pending.put(
            (name, interval.started_at),
            NamespaceLabelsRow(name, interval.labels, interval.started_at, end),
        )
