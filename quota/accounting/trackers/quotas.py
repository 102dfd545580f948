"""ResourceQuotas: a sample of each GPU line's hard and used whenever either changes, and the
live figures the controller's quota metrics show (read once, with the Accountant's config)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Set
from dataclasses import dataclass, field
from typing import Any

from gpuquota.quota.accounting.rows import Batch, QuotaSampleRow, StoredState
from gpuquota.quota.accounting.rules.parse import last_written
from gpuquota.quota.accounting.rules.quotas import QuotaFacts, quota_facts
from gpuquota.quota.accounting.trackers.base import TrackerContext


@dataclass
class _Quota:
    namespace: str
    name: str
    last_seen: int
    resources: set[str] = field(default_factory=set)
    facts: QuotaFacts | None = None  # the latest copy seen since start (None: from the store)


class QuotaTracker:
    kind = "ResourceQuota"

    def __init__(self, context: TrackerContext) -> None:
        self.config = context.config
        self.pending = context.pending
        self._quotas: dict[tuple[str, str], _Quota] = {}
        self._samples: dict[tuple[str, str, str], QuotaSampleRow] = {}
        self.generation = 0  # bumped whenever the live figures change

    def load(self, state: StoredState) -> None:
        for sample in state.quota_samples:
            self._samples[(sample.namespace, sample.quota_name, sample.resource_name)] = sample
            if sample.hard is not None or sample.used is not None:
                quota = self._quotas.setdefault(
                    (sample.namespace, sample.quota_name),
                    _Quota(sample.namespace, sample.quota_name, sample.observed_at),
                )
                quota.last_seen = max(quota.last_seen, sample.observed_at)
                quota.resources.add(sample.resource_name)

    def identity(self, obj: Mapping[str, Any]) -> Hashable:
        meta = obj.get("metadata") or {}
        return (meta.get("namespace") or "default", meta.get("name"))

    def apply(self, obj: Mapping[str, Any], deleted: bool, observed_at: int) -> None:
        # a quota's figures changed when it was last written (its managedFields time), not
        # when the controller happened to see it; a deletion is as seen
        changed = None if deleted else last_written(obj)
        at = observed_at if changed is None else min(observed_at, changed)
        facts = quota_facts(obj, self.config)
        key = (facts.namespace, facts.name)
        quota = self._quotas.get(key)
        if quota is not None and at < quota.last_seen:
            return  # stale copy
        if quota is None:
            quota = self._quotas[key] = _Quota(facts.namespace, facts.name, at)
        quota.last_seen = at
        if deleted:
            self._delete(quota, at)
            return
        quota.facts = facts
        self.generation += 1
        figures = {f.resource_name: f for f in facts.figures}
        for resource in sorted(quota.resources - set(figures)):
            self._sample(quota, resource, None, None, list(facts.scopes), at)
        quota.resources = set(figures)
        for resource, figure in sorted(figures.items()):
            self._sample(quota, resource, figure.hard, figure.used, list(facts.scopes), at)

    def vanish(self, listed: Set[Hashable], heartbeat: int) -> None:
        for key in set(self._quotas) - listed:
            quota = self._quotas[key]
            self._delete(quota, max(heartbeat, quota.last_seen))

    def collect(self, batch: Batch) -> None:
        batch.quota_samples.extend(self.pending.rows(QuotaSampleRow))

    def written(self, batch: Batch) -> None:
        pass

    def count(self) -> int:
        return len(self._quotas)

    def live(self) -> list[QuotaFacts]:
        """The latest figures of every quota seen since start and not deleted since."""
        return [q.facts for _, q in sorted(self._quotas.items()) if q.facts is not None]

    def _delete(self, quota: _Quota, at: int) -> None:
        for resource in sorted(quota.resources):
            last = self._samples.get((quota.namespace, quota.name, resource))
            self._sample(quota, resource, None, None, last.scopes if last else [], at)
        self._quotas.pop((quota.namespace, quota.name), None)
        self.generation += 1

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
        # several changes in one second (quota admission of pods admitted together) are
        # each kept, in order: the peak is exact and the last one holds
        seq = last.seq + 1 if last is not None and last.observed_at == at else 0
        sample = QuotaSampleRow(quota.namespace, quota.name, resource, hard, used, scopes, at, seq)
        self._samples[key] = sample
        self.pending.put((*key, at, seq), sample)
