"""What every tracker is: the seam through which the Accountant handles one Kubernetes kind.

A tracker owns the in-memory state of one kind, reads its objects through the pure rules,
and turns changes into rows: finished rows go to the shared :class:`PendingWrites` at once,
rows derived from state that may still change (a pod's allocations) are added at flush time
by :meth:`Tracker.collect`. The Accountant owns the order of trackers, the resourceVersions,
the heartbeat and the flush; a tracker never writes to the store itself.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Set
from dataclasses import dataclass
from typing import Any, Protocol

from gpuquota.quota.accounting.pending import PendingWrites
from gpuquota.quota.accounting.rows import Batch, StoredState
from gpuquota.quota.accounting.rules.config import AccountingConfig


@dataclass(frozen=True)
class TrackerContext:
    """What the Accountant shares with each tracker."""

    config: AccountingConfig
    pending: PendingWrites


class Tracker(Protocol):
    """One Kubernetes kind's accounting."""

    kind: str  # the object kind it accounts, e.g. "Pod"

    def load(self, state: StoredState) -> None:
        """Take the open intervals this kind owns from what the store holds (restart)."""

    def apply(self, obj: Mapping[str, Any], deleted: bool, observed_at: int) -> None:
        """Apply one object seen at ``observed_at``; raise AccountingError (changing nothing)
        for one the rules cannot read."""

    def identity(self, obj: Mapping[str, Any]) -> Hashable:
        """The key a full list names an object by (pod UID, quota namespace and name, ...)."""

    def vanish(self, listed: Set[Hashable], heartbeat: int) -> None:
        """A full list named only ``listed``: close whatever else is known, at the last time
        it was known to exist (``heartbeat`` or its last sighting, if later), estimated."""

    def collect(self, batch: Batch) -> None:
        """Add the rows this tracker computes at flush time (not already in PendingWrites)."""

    def written(self, batch: Batch) -> None:
        """``batch`` is stored: remember what was written, forget what is pending."""

    def count(self) -> int:
        """How many objects it holds in memory."""
