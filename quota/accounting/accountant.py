"""The Accountant: applies Kubernetes watch events through the trackers and flushes their rows.

The live controller and ``gpuquota replay`` both feed it events. It dispatches each object to
the tracker of its kind, keeps the resourceVersions and the heartbeat, and writes what the
trackers produced in batches with :meth:`Accountant.flush`. It is not thread-safe: one thread
drives it.

Restart safety: every row has a natural key (pod UID + resource for allocations, the start
time for the other intervals), ends only ever move earlier, and on start the Accountant loads
the open intervals from the store. Replaying events it already stored therefore rewrites the
same rows, and events older than what the store holds are recognised as already counted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpuquota.quota.accounting.pending import PendingWrites
from gpuquota.quota.accounting.rows import AllocationRow, Batch, GapRow, HeartbeatRow, RowStore
from gpuquota.quota.accounting.rules.claims import DEFAULT_GPU_DRIVERS
from gpuquota.quota.accounting.rules.config import DEFAULT_CONFIG, AccountingConfig
from gpuquota.quota.accounting.rules.parse import (
    AccountingError,
    unseen_time,
    without_unseen_times,
)
from gpuquota.quota.accounting.rules.quotas import QuotaFacts
from gpuquota.quota.accounting.trackers import claims as dra_trackers
from gpuquota.quota.accounting.trackers.base import Tracker, TrackerContext
from gpuquota.quota.accounting.trackers.namespaces import NamespaceTracker
from gpuquota.quota.accounting.trackers.nodes import NodeTracker
from gpuquota.quota.accounting.trackers.pods import PodTracker
from gpuquota.quota.accounting.trackers.quotas import QuotaTracker

log = logging.getLogger(__name__)

EVENT_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK"})
DEFAULT_RETENTION_SECONDS = 3600
# the kinds accounted: one tracker each
KINDS = frozenset(
    [
        *(t.kind for t in (NodeTracker, PodTracker, NamespaceTracker, QuotaTracker)),
        *(t.kind for t in dra_trackers.TRACKER_TYPES),
    ]
)


class Accountant:
    """Turns watch events into allocation, capacity, label and quota rows of one cluster."""

    def __init__(
        self,
        store: RowStore,
        cluster: str,
        config: AccountingConfig = DEFAULT_CONFIG,
        *,
        holder: str = "gpuquota",
        retention_seconds: int = DEFAULT_RETENTION_SECONDS,
        dra_drivers: tuple[str, ...] = DEFAULT_GPU_DRIVERS,
    ) -> None:
        self.store = store
        self.cluster = cluster
        self.config = config
        self.holder = holder
        self.retention_seconds = retention_seconds
        # (kind, reason) of each new gap, for the controller's metric; None: nobody listens
        self.on_gap: Callable[[str, str], None] | None = None
        self.pending_writes = PendingWrites()
        context = TrackerContext(config, self.pending_writes)
        self.nodes = NodeTracker(context)
        self.pods = PodTracker(context, self.nodes, retention_seconds)
        self.namespaces = NamespaceTracker(context)
        self.quotas = QuotaTracker(context)
        # DRA: one state behind the ResourceClaim, ResourceSlice and DeviceClass trackers; the
        # pod tracker tells it the claim-using pods' intervals, the node tracker node facts
        self.claims = dra_trackers.ClaimTracker(
            config, dra_drivers, self.nodes.gpus, self.pending_writes, retention_seconds
        )
        self.pods.claims = self.claims
        self.nodes.listeners.append(self.claims)
        # one tracker per kind (the claims' after the pods': they need the pods' intervals)
        ordered: list[Tracker] = [self.nodes, self.pods, self.namespaces, self.quotas]
        ordered += dra_trackers.trackers(self.claims)
        self.trackers: dict[str, Tracker] = {t.kind: t for t in ordered}
        self._resource_versions: dict[str, str] = {}
        self._heartbeat_at: int | None = None
        self._gaps: dict[tuple[str, int], GapRow] = {}  # unwritten, by (kind, start)
        self._started_from: int | None = None  # the stored heartbeat this run started from
        self._now = 0  # latest observation time seen
        self._first_seen: int | None = None  # earliest observation time seen
        self.stats: dict[str, int] = {"events": 0, "flushes": 0, "rows_written": 0, "estimated": 0}
        self._load()

    @property
    def kinds(self) -> frozenset[str]:
        """The kinds a full list can be resynced for."""
        return frozenset(self.trackers)

    def _load(self) -> None:
        state = self.store.load(self.cluster)
        if state.heartbeat is not None:
            self._heartbeat_at = self._started_from = state.heartbeat.at
            self._resource_versions = {
                str(k): str(v) for k, v in state.heartbeat.resource_versions.items()
            }
            self._now = state.heartbeat.at
        for tracker in self.trackers.values():
            tracker.load(state)

    # -- events

    def apply(
        self,
        event_type: str,
        obj: Mapping[str, Any],
        observed_at: int,
        *,
        from_watch: bool = True,
    ) -> None:
        """Apply one watch event seen at ``observed_at`` (unix seconds).

        ``from_watch=False`` for an object of a list: its own resourceVersion is not where the
        kind's watch stands (the list's is), so it is not recorded.
        Raises AccountingError for an object the rules cannot read; the state is then
        unchanged.
        """
        if event_type not in EVENT_TYPES:
            raise AccountingError(f"unknown event type {event_type!r}")
        if not isinstance(obj, Mapping):
            raise AccountingError("event object: expected an object")
        kind = obj.get("kind")
        if not isinstance(kind, str) or not kind:
            raise AccountingError("event object has no kind")
        self.stats["events"] += 1
        self._now = max(self._now, observed_at)
        self._first_seen = min(self._first_seen or observed_at, observed_at)
        meta = obj.get("metadata")
        version = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
        if from_watch and isinstance(version, str) and version:
            self.seen_version(kind, version)
        if event_type == "BOOKMARK":
            return
        tracker = self.trackers.get(kind)
        if tracker is None:
            return  # other kinds are not accounted
        # the rule replay refuses a recording by: a time later than the event was seen
        unseen = unseen_time(obj, observed_at, "when it was seen")
        if unseen is not None:
            if event_type != "DELETED":
                raise AccountingError(unseen)
            # the deletion itself is certain when seen: applied without the impossible times
            log.warning("%s deleted with %s; that time is ignored", kind, unseen)
            obj = without_unseen_times(obj, obj, observed_at)
        tracker.apply(obj, event_type == "DELETED", observed_at)

    def seen_version(self, kind: str, version: str) -> None:
        """Record the latest resourceVersion of ``kind`` (stored with the next heartbeat)."""
        self._resource_versions[kind] = version

    def resync(
        self,
        kind: str,
        objects: Iterable[Mapping[str, Any]],
        observed_at: int,
        version: str = "",
        gap_from: int | None = None,
    ) -> None:
        """Apply a full list of ``kind`` taken at ``observed_at``; whatever is known but missing
        from it vanished while unwatched, and is closed at the last time it was known to exist
        (``gap_from``, else the heartbeat, or its last event if later), marked estimated, so an
        estimate never exceeds the truth. ``version`` is the list's resourceVersion, which a
        restart resumes the watch from. ``gap_from``: the kind was not followed from then until
        the list, a gap stored as a fact (what came and went inside it is not known)."""
        tracker = self.trackers.get(kind)
        if tracker is None:
            raise AccountingError(f"cannot resync kind {kind!r}")
        self._now = max(self._now, observed_at)
        known = (self._heartbeat_at or 0) if gap_from is None else gap_from
        if gap_from is not None and observed_at > gap_from:
            # from the stored heartbeat: downtime the resumed watch could not replay
            reason = "restart" if gap_from == self._started_from else "gone"
            self.gap(kind, gap_from, observed_at, reason)
        self._first_seen = min(self._first_seen or observed_at, observed_at)
        objects = list(objects)
        skipped: list[str] = []
        for obj in objects:
            if obj.get("kind") is None:
                obj = {**obj, "kind": kind}
            try:
                self.apply("MODIFIED", obj, observed_at, from_watch=False)
            except AccountingError as exc:  # one bad object must not stop the relist
                skipped.append(str(exc))
        tracker.vanish({tracker.identity(obj) for obj in objects}, known)
        if version:
            self.seen_version(kind, version)
        if skipped:
            raise AccountingError(
                f"{len(skipped)} listed object(s) skipped, the rest applied; first: {skipped[0]}"
            )

    def gap(self, kind: str, start: int, end: int, reason: str) -> None:
        """Record that ``kind`` was not followed over [start, end); written at the next flush.
        ``on_gap`` (the controller's metric), if set, hears of each new one."""
        key = (kind, start)
        old = self._gaps.get(key)
        if old is None and self.on_gap is not None:
            self.on_gap(kind, reason)
        if old is not None:
            end = max(end, old.ended_at)
        self._gaps[key] = GapRow(kind, start, end, reason)

    def heartbeat(self, now: int) -> None:
        """Record that the cluster's state was known at ``now``; written at the next flush.
        Call it only while every kind is proven current and watched: it is where a report's
        data ends, and it bounds what a restart estimates."""
        self._heartbeat_at = max(self._heartbeat_at or 0, now)
        self._now = max(self._now, now)
        self.pending_writes.heartbeat = HeartbeatRow(
            holder=self.holder,
            at=self._heartbeat_at,
            resource_versions=dict(self._resource_versions),
        )

    # -- reads

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
        return self.pods.quota_usage(self._now if now is None else now)

    def best_effort_gpu_pods(self) -> list[tuple[str, str]]:
        """(namespace, name) of GPU pods that quota would count (not gone, not terminal) but
        that are BestEffort, so NotBestEffort-scoped quotas miss them."""
        return self.pods.best_effort_gpu_pods()

    def open_allocations(self) -> list[AllocationRow]:
        """Rows of pods still holding GPUs, as the next flush would write them."""
        return self.pods.open_allocations()

    def quota_figures(self) -> list[QuotaFacts]:
        """The live ResourceQuotas' GPU lines, as read with this Accountant's config."""
        return self.quotas.live()

    @property
    def quota_generation(self) -> int:
        """Changes whenever quota_figures() does."""
        return self.quotas.generation

    def pending(self) -> int:
        """How many rows the next flush would write."""
        return len(self.batch())

    # -- writes

    def batch(self) -> Batch:
        """What the next flush writes."""
        batch = Batch(
            heartbeat=self.pending_writes.heartbeat,
            observed_at=self._now,
            first_observed_at=self._first_seen,
        )
        batch.gaps.extend(self._gaps.values())
        for tracker in self.trackers.values():
            tracker.collect(batch)
        return batch

    def flush(self) -> int:
        """Write everything pending in one transaction; returns the number of rows written.

        On a database failure raises the store's error and keeps everything pending, so
        calling flush again later writes it (the writes are idempotent).
        """
        batch = self.batch()
        if len(batch):
            self.store.write(self.cluster, batch)
        for tracker in self.trackers.values():
            tracker.written(batch)
        self.pending_writes.clear()
        self._gaps.clear()
        self.stats["estimated"] = self.pods.estimated_written
        self.stats["flushes"] += 1
        self.stats["rows_written"] += len(batch)
        self.pods.prune(self._now)
        return len(batch)
