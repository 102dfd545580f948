"""The remediation's side of the store: every act as a row, and the fleet-wide eviction budget
counted from those rows, so it holds across restarts and across replicas.

An eviction first *reserves* its place in the budget: in one transaction the evictions of the
window are counted and, when there is room, a row ``evicting`` is inserted; the row is then
finished with what the API said (``evicted``, ``blocked_by_pdb``, ``gone``, ``failed``...).
PostgreSQL serialises the count-and-insert of two replicas with a transaction-level advisory
lock per cluster; SQLite with its single writer (``BEGIN IMMEDIATE``). A process that dies
between the two leaves ``evicting``, which still counts: a crash never frees budget it may
have spent.

The budget is per mode: a real instance counts the real evictions only, a dry-run instance
(``--dry-run``, sharing the store) its own ``dry_run`` rows only, so a preview shows what the
budget would allow and never starves the real remediation, nor the other way round.

What was already done for a pod is read from the rows too (:class:`Done`), never kept in
memory, so a restarted process or a replica taking over records nothing twice.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Table, delete, func, insert, select, text, update

from gpuquota.quota.store.db import Store
from gpuquota.quota.store.models import RemediationAction
from gpuquota.quota.store.vocabulary import CONDITION_STATES, DRY_RUN_SPENT, EVICTIONS_SPENT


def _table() -> Table:
    t = RemediationAction.__table__
    assert isinstance(t, Table)
    return t


@dataclass(frozen=True, slots=True)
class Act:
    """One row to write."""

    action: str  # evict | condition | breaker
    result: str
    node: str = ""
    namespace: str = ""
    pod: str = ""
    pod_uid: str = ""
    devices: tuple[str, ...] = ()
    message: str = ""


@dataclass(frozen=True, slots=True)
class StoredAct:
    at: int
    action: str
    result: str
    node: str
    namespace: str
    pod: str
    pod_uid: str
    devices: tuple[str, ...]
    message: str


class Ledger:
    """The remediation rows of one cluster."""

    def __init__(self, store: Store, cluster: str) -> None:
        self.store = store
        self.cluster = cluster
        self.table = _table()
        self._lock_key = int.from_bytes(
            hashlib.sha256(f"gpuquota-remediation/{cluster}".encode()).digest()[:8],
            "big",
            signed=True,
        )

    def _values(self, act: Act, at: float) -> dict[str, object]:
        return {
            "cluster": self.cluster,
            "at": int(at),
            "action": act.action,
            "result": act.result,
            "node": act.node[:253],
            "namespace": act.namespace[:253],
            "pod": act.pod[:253],
            "pod_uid": act.pod_uid[:64],
            "devices": list(act.devices),
            "message": act.message,
        }

    def record(self, act: Act, at: float | None = None) -> int:
        """Writes one row; its id."""
        with self.store.engine.begin() as conn:
            result = conn.execute(insert(self.table).values(**self._values(act, _now(at))))
            return int(result.inserted_primary_key[0])  # type: ignore[index]

    def spent(self, conn: Connection, now: float, window_s: float, dry_run: bool = False) -> int:
        """The evictions of the window that spend this mode's budget."""
        t = self.table
        return int(
            conn.execute(
                select(func.count())
                .select_from(t)
                .where(
                    t.c.cluster == self.cluster,
                    t.c.action == "evict",
                    t.c.result.in_(DRY_RUN_SPENT if dry_run else EVICTIONS_SPENT),
                    t.c.at > int(now - window_s),
                )
            ).scalar_one()
        )

    def left(self, now: float, max_evictions: int, window_s: float, dry_run: bool = False) -> int:
        with self.store.engine.connect() as conn:
            return max_evictions - self.spent(conn, now, window_s, dry_run)

    def reserve(
        self, act: Act, now: float, max_evictions: int, window_s: float, dry_run: bool = False
    ) -> int | None:
        """Reserves one eviction of this mode's budget (a row ``act.result``: ``evicting``, a
        dry run ``dry_run``): its id, or None when the window's budget is spent."""
        with self.store.engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": self._lock_key})
            elif conn.dialect.name == "sqlite":
                # a write first, so this transaction holds SQLite's one write lock before it
                # counts: two processes cannot both count the same room
                conn.execute(
                    update(self.table).where(self.table.c.id == -1).values(result="evicting")
                )
            if self.spent(conn, now, window_s, dry_run) >= max_evictions:
                return None
            result = conn.execute(insert(self.table).values(**self._values(act, now)))
            return int(result.inserted_primary_key[0])  # type: ignore[index]

    def finish(self, row: int, result: str, message: str | None = None) -> None:
        values: dict[str, object] = {"result": result}
        if message is not None:
            values["message"] = message
        with self.store.engine.begin() as conn:
            conn.execute(update(self.table).where(self.table.c.id == row).values(**values))

    def discard(self, row: int) -> None:
        """Gives a reserved place back (a PodDisruptionBudget said "not now" again)."""
        with self.store.engine.begin() as conn:
            conn.execute(delete(self.table).where(self.table.c.id == row))

    def marked(self) -> dict[tuple[str, str], StoredAct]:
        """(namespace, pod) -> its latest condition row (of a real run), for pods whose latest
        one is ``marked``: the pods whose condition says True, to clear once the fence lifts."""
        t = self.table
        latest: dict[tuple[str, str], StoredAct] = {}
        with self.store.engine.connect() as conn:
            for act in _acts(
                conn.execute(
                    select(t)
                    .where(
                        t.c.cluster == self.cluster,
                        t.c.action == "condition",
                        t.c.result.in_(CONDITION_STATES),
                    )
                    .order_by(t.c.id)
                )
            ):
                latest[(act.namespace, act.pod)] = act
        return {k: a for k, a in latest.items() if a.result == "marked"}

    def acts_of(self, uids: Collection[str]) -> list[StoredAct]:
        """Every pod act (not the breaker's) on the pod objects ``uids``, oldest first."""
        if not uids:
            return []
        t = self.table
        with self.store.engine.connect() as conn:
            return _acts(
                conn.execute(
                    select(t)
                    .where(
                        t.c.cluster == self.cluster,
                        t.c.action != "breaker",
                        t.c.pod_uid.in_(sorted(uids)),
                    )
                    .order_by(t.c.id)
                )
            )

    def breaker_open(self) -> bool:
        """Whether the latest breaker row says open (kept so a restart says it once)."""
        t = self.table
        with self.store.engine.connect() as conn:
            row = conn.execute(
                select(t.c.result)
                .where(t.c.cluster == self.cluster, t.c.action == "breaker")
                .order_by(t.c.id.desc())
                .limit(1)
            ).first()
        return row is not None and row.result == "open"


def eviction_results(dry_run: bool) -> tuple[str, str, str]:
    """What an eviction's row ends as in a mode: done, a PodDisruptionBudget's "not now", a
    failed call (a dry run's evicted nothing, so it spends no budget)."""
    if dry_run:
        return ("dry_run", "dry_run_blocked", "dry_run_failed")
    return ("evicted", "blocked_by_pdb", "failed")


Fence = tuple[str, frozenset[str]]  # a pod object (UID) and the fenced devices it holds


def fence_of(uid: str, devices: Iterable[str]) -> Fence:
    return (uid, frozenset(devices))


@dataclass(slots=True)
class Done:
    """What the rows say was already done for some pods, as one mode reads them: what must
    not be done, or recorded, again.

    A refusal (a static, terminating or opted-out pod) is a fact about the pod, whichever mode
    wrote it, and so is a pod found gone; an eviction done, or a PodDisruptionBudget's refusal
    said, are the mode's own (a dry run's ``dry_run`` row evicted nothing)."""

    finished: set[str] = field(default_factory=set)  # pod UIDs evicted or gone: never again
    refused: set[Fence] = field(default_factory=set)  # said once per pod and fence
    blocked: set[Fence] = field(default_factory=set)  # a PDB's "not now", said once
    said: set[tuple[str, str]] = field(default_factory=set)  # a dry run's condition rows

    @classmethod
    def of(cls, acts: Iterable[StoredAct], dry_run: bool) -> Done:
        evicted, blocked, _failed = eviction_results(dry_run)
        done = cls()
        for a in acts:
            fence = fence_of(a.pod_uid, a.devices)
            if a.result == "gone" or (a.action == "evict" and a.result == evicted):
                done.finished.add(a.pod_uid)
            elif a.result == "refused":
                done.refused.add(fence)
            elif a.action == "evict" and a.result == blocked:
                done.blocked.add(fence)
            elif dry_run and a.action == "condition" and a.result == "dry_run":
                done.said.add((a.pod_uid, a.message))
        return done


def _now(at: float | None) -> float:
    return time.time() if at is None else at


def _acts(rows: Iterable[Any]) -> list[StoredAct]:
    return [
        StoredAct(
            int(r.at),
            r.action,
            r.result,
            r.node,
            r.namespace,
            r.pod,
            r.pod_uid,
            tuple(r.devices or ()),
            r.message,
        )
        for r in rows
    ]


def acts_on_devices(
    conn: Connection, cluster: str, uuids: set[str], lo: int = 0, hi: int = 2**62
) -> list[StoredAct]:
    """The pod acts (evictions, conditions) on any of ``uuids`` in [lo, hi), oldest first:
    what `gpuquota gpus --serial S` shows a board's fences cost."""
    t = _table()
    rows = conn.execute(
        select(t)
        .where(t.c.cluster == cluster, t.c.action != "breaker", t.c.at >= lo, t.c.at < hi)
        .order_by(t.c.at, t.c.id)
    )
    return [a for a in _acts(rows) if uuids & set(a.devices)]
