"""Rows waiting for the next flush, keyed by natural key so a later change replaces an unsent
one; kept whole until a write succeeds (a failed write loses nothing)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, TypeVar

from gpuquota.quota.accounting.rows import HeartbeatRow

R = TypeVar("R")


class PendingWrites:
    """The buffer trackers put finished rows in; the Accountant drains it into a Batch."""

    def __init__(self) -> None:
        self._rows: dict[type[Any], dict[Hashable, Any]] = {}
        self.heartbeat: HeartbeatRow | None = None

    def put(self, key: Hashable, row: Any) -> None:
        """Queue ``row``; one already queued under the same type and ``key`` is replaced."""
        self._rows.setdefault(type(row), {})[key] = row

    def rows(self, cls: type[R]) -> list[R]:
        """The queued rows of type ``cls``, in the order their keys were first queued."""
        return list(self._rows.get(cls, {}).values())

    def clear(self) -> None:
        """Forget everything queued: call only once it has been written."""
        self._rows.clear()
        self.heartbeat = None

    def __len__(self) -> int:
        return sum(len(rows) for rows in self._rows.values()) + (self.heartbeat is not None)
