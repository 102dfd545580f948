"""Day-two operations on the store: an online backup of a SQLite store, and pruning history
older than a date (what it removes shown first). `gpuquota db backup` and `gpuquota db prune`
(quota/dbcli.py) call these; docs/operations.md walks through them.

Pruning keeps every bill after the cut-off exact: it removes only what lies wholly before it
(closed intervals, closed label and capacity spans, quota samples superseded before it, the
last sample before it stays, since it holds into the period after; usage-ledger windows that
ended before it, the ledger series left with none, and the ledger devices left with no series),
and moves each cluster's "data begins" to the cut-off, so a report of an older period says it
is not covered instead of printing what is left as the whole truth (docs/report.md, "Missing
is not zero").

The fleet history is kept by board, not by time (docs/health.md, "Retention"): a board's
history is its RMA case, which needs all of it, so a board goes whole (its row, stretches and
events) once it was last seen before the cut-off, and a board last seen fenced (pulled for a
vendor's RMA, whose case may still be open) only once it was last seen ``RMA_HOLD`` before it.
A board still in the fleet keeps everything.

The central remediation's record (``remediation_actions``) goes by time, as the bills do, with
three exceptions that `gpuquota remediate` still reads (docs/health.md, "Retention of the
record"): the evictions that spend the fleet-wide budget (a real instance's, and a dry-run
instance's budget of its own) and are newer than the longest
``--evict-window`` (``MAX_EVICT_WINDOW_S`` before now, whatever the cut-off: pruning them
would hand the budget back, and a wrong verdict could evict again at once), the latest
condition row of a pod whose condition it set and has still to clear (``marked``), and each
cluster's latest breaker row (whether the breaker is open).
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import and_, delete, func, or_, select, text, update
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import SQLAlchemyError

from gpuquota.quota.store.db import StoreError, _describe, open_store, safe_url
from gpuquota.quota.store.models import (
    Allocation,
    ClaimAllocation,
    Cluster,
    GpuBoard,
    GpuEvent,
    GpuObservation,
    NamespaceLabels,
    NodeCapacity,
    QuotaSample,
    RemediationAction,
    UsageDevice,
    UsageSeries,
    UsageWindow,
)
from gpuquota.quota.store.vocabulary import (
    CONDITION_STATES,
    DRY_RUN_SPENT,
    EVICTIONS_SPENT,
    FENCED,
    MAX_EVICT_WINDOW_S,
)


def sqlite_path(url: str) -> Path:
    """The file of a SQLite URL; StoreError for any other store."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        raise StoreError(
            f"{safe_url(url)}: `gpuquota db backup` copies SQLite stores; back up PostgreSQL "
            "with pg_dump (docs/operations.md, Backup and restore)"
        )
    return Path(str(parsed.database))


def backup(url: str, target: Path) -> int:
    """Copy the SQLite store at ``url`` into the new file ``target`` with SQLite's online
    backup API: consistent while the controller writes, write-ahead log included, one
    file. Returns its size in bytes."""
    sqlite_path(url)  # a SQLite store, else a clear refusal
    if target.exists():
        raise StoreError(f"--to: {target} exists; give a new file (nothing is overwritten)")
    # a gpuquota store at the latest revision, read the way every read-only command reads it
    # (in a read-only folder too, and leaving no -wal/-shm behind)
    store = open_store(url, read_only=True)
    partial = target.with_name(f".{target.name}.partial")
    try:
        with store.engine.connect() as conn:
            src = conn.connection.dbapi_connection
            assert isinstance(src, sqlite3.Connection)
            with sqlite3.connect(partial) as dst:
                src.backup(dst)
                dst.execute("PRAGMA journal_mode=DELETE")  # one self-contained file
            dst.close()
        partial.replace(target)
    except (sqlite3.Error, OSError) as exc:
        partial.unlink(missing_ok=True)
        raise StoreError(f"backup of {safe_url(url)} to {target} failed: {exc}") from None
    finally:
        store.close()
    return target.stat().st_size


@dataclass(frozen=True)
class Prunable:
    table: str
    rows: int


def _closed_before(before: int) -> dict[str, tuple[Any, Any]]:
    """table -> (model, condition) of the spans that ended at or before the cut-off."""
    return {
        "allocations": (
            Allocation,
            and_(Allocation.ended_at.is_not(None), Allocation.ended_at <= before),
        ),
        "claim_allocations": (
            ClaimAllocation,
            and_(ClaimAllocation.ended_at.is_not(None), ClaimAllocation.ended_at <= before),
        ),
        "node_capacity": (
            NodeCapacity,
            and_(NodeCapacity.ended_at.is_not(None), NodeCapacity.ended_at <= before),
        ),
        "namespace_labels": (
            NamespaceLabels,
            and_(NamespaceLabels.valid_to.is_not(None), NamespaceLabels.valid_to <= before),
        ),
        "usage_windows": (
            UsageWindow,
            UsageWindow.window_start + UsageWindow.window_seconds <= before,
        ),
    }


def _series_left_without_windows(before: int) -> Any:
    """Ledger series none of whose windows ends after the cut-off: once those windows go,
    nothing refers to them (a series still counting has windows after it: its baseline)."""
    later = select(UsageWindow.series_id).where(
        UsageWindow.series_id == UsageSeries.id,
        UsageWindow.window_start + UsageWindow.window_seconds > before,
    )
    return ~later.exists()


def _devices_left_without_series(before: int) -> Any:
    """Ledger devices none of whose series stays (each is left without windows after the
    cut-off): once those series go, nothing refers to them."""
    kept = select(UsageSeries.id).where(
        UsageSeries.device_id == UsageDevice.id, ~_series_left_without_windows(before)
    )
    return ~kept.exists()


def _superseded_samples(before: int) -> Any:
    """Quota samples before the cut-off that a later sample, also before it, replaced: the
    last one before the cut-off stays, it is the value in force at the cut-off."""
    later = QuotaSample.__table__.alias("later")
    q = QuotaSample.__table__
    newer_before = (
        select(func.count())
        .select_from(later)
        .where(
            later.c.cluster == q.c.cluster,
            later.c.namespace == q.c.namespace,
            later.c.quota_name == q.c.quota_name,
            later.c.resource_name == q.c.resource_name,
            later.c.observed_at > q.c.observed_at,
            later.c.observed_at < before,
        )
        .scalar_subquery()
    )
    return and_(q.c.observed_at < before, newer_before > 0)


def _remediation_gone(before: int, now: int) -> Any:
    """The remediation rows before the cut-off that `gpuquota remediate` no longer reads: not
    an eviction the budget may still count, not a pod's condition still to clear, not a
    cluster's breaker state."""
    t = RemediationAction.__table__
    later = t.alias("later")
    budget = and_(  # a real instance's budget and a dry run's: each reads its own
        t.c.action == "evict",
        t.c.result.in_(EVICTIONS_SPENT + DRY_RUN_SPENT),
        t.c.at >= now - MAX_EVICT_WINDOW_S,
    )
    to_clear = and_(
        t.c.action == "condition",
        t.c.result == "marked",
        ~select(later.c.id)
        .where(
            later.c.cluster == t.c.cluster,
            later.c.action == "condition",
            later.c.namespace == t.c.namespace,
            later.c.pod == t.c.pod,
            later.c.result.in_(CONDITION_STATES),
            later.c.id > t.c.id,
        )
        .exists(),
    )
    breaker = and_(
        t.c.action == "breaker",
        ~select(later.c.id)
        .where(later.c.cluster == t.c.cluster, later.c.action == "breaker", later.c.id > t.c.id)
        .exists(),
    )
    return and_(t.c.at < before, ~budget, ~to_clear, ~breaker)


RMA_HOLD = 365 * 86400  # a board last seen fenced: a year for its RMA case after it left


def _boards_gone(conn: Connection, before: int) -> list[int]:
    """The boards whose whole fleet history goes: last seen before the cut-off, and not
    fenced when last seen unless that was ``RMA_HOLD`` before it."""
    b, e = GpuBoard.__table__, GpuEvent.__table__
    candidates = {
        int(row.id): int(row.last_seen)
        for row in conn.execute(select(b.c.id, b.c.last_seen).where(b.c.last_seen < before))
    }
    ids = sorted(candidates)
    fenced: set[int] = set()
    for i in range(0, len(ids), 500):
        latest: dict[int, tuple[int, int, Any]] = {}
        for board_id, seen, event_id, detail in conn.execute(
            select(e.c.board_id, e.c.seen, e.c.id, e.c.detail).where(
                e.c.board_id.in_(ids[i : i + 500]), e.c.kind == "verdict"
            )
        ):
            known = latest.get(board_id)
            if known is None or (seen, event_id) > known[:2]:
                latest[board_id] = (seen, event_id, detail)
        fenced |= {k for k, (_, _, d) in latest.items() if d.get("state") == FENCED}
    return [i for i in ids if i not in fenced or candidates[i] < before - RMA_HOLD]


def _in_boards(column: Any, ids: list[int]) -> Any:
    return or_(*(column.in_(ids[i : i + 500]) for i in range(0, len(ids), 500)))


def prune(url: str, before: int, *, apply: bool, now: float | None = None) -> list[Prunable]:
    """What pruning history older than ``before`` removes, per table; with ``apply`` it is
    removed, in one transaction, and each cluster's data begins at ``before`` from then on.
    ``now`` (default: the clock) dates the remediation budget's window."""
    at = int(time.time() if now is None else now)
    store = open_store(url, read_only=not apply)
    try:
        with store.engine.begin() as conn:
            if apply and store.dialect == "postgresql":
                # A ledger write in flight (the ingester, a roll-up) may be giving a device or
                # series that looks unused here its first window after the cut-off: wait for it
                # and keep new ones out until this commits, so that every statement below sees
                # it. (SQLite has one writer at a time already.)
                # (and a fleet history window in flight that sees a board again)
                conn.execute(
                    text(
                        "LOCK TABLE usage_windows, usage_series, usage_devices, gpu_boards "
                        "IN SHARE ROW EXCLUSIVE MODE"
                    )
                )
            gone = _boards_gone(conn, before)
            found = _count(conn, before, gone, at)
            if apply and any(p.rows for p in found):
                for model, cond in _closed_before(before).values():
                    conn.execute(delete(model).where(cond))
                conn.execute(delete(QuotaSample).where(_superseded_samples(before)))
                conn.execute(delete(RemediationAction).where(_remediation_gone(before, at)))
                conn.execute(delete(UsageSeries).where(_series_left_without_windows(before)))
                conn.execute(delete(UsageDevice).where(_devices_left_without_series(before)))
                if gone:
                    for model in (GpuObservation, GpuEvent):
                        conn.execute(delete(model).where(_in_boards(model.board_id, gone)))
                    conn.execute(delete(GpuBoard).where(_in_boards(GpuBoard.id, gone)))
                conn.execute(
                    update(Cluster).where(Cluster.created_at < before).values(created_at=before)
                )
            return found
    except SQLAlchemyError as exc:
        raise StoreError(f"prune of {safe_url(url)} failed: {_describe(exc)}") from None
    finally:
        store.close()


def _count(conn: Connection, before: int, gone: list[int], now: int) -> list[Prunable]:
    found = []
    for table, (model, cond) in _closed_before(before).items():
        n = conn.execute(select(func.count()).select_from(model).where(cond)).scalar_one()
        found.append(Prunable(table, int(n)))
    superseded = select(func.count()).select_from(QuotaSample.__table__)
    n = conn.execute(superseded.where(_superseded_samples(before))).scalar_one()
    found.append(Prunable("quota_samples", int(n)))
    orphans = select(func.count()).select_from(UsageSeries)
    n = conn.execute(orphans.where(_series_left_without_windows(before))).scalar_one()
    found.append(Prunable("usage_series", int(n)))
    devices = select(func.count()).select_from(UsageDevice)
    n = conn.execute(devices.where(_devices_left_without_series(before))).scalar_one()
    found.append(Prunable("usage_devices", int(n)))
    found.append(Prunable("gpu_boards", len(gone)))
    for table, model in (("gpu_observations", GpuObservation), ("gpu_events", GpuEvent)):
        n = 0
        if gone:
            stmt = select(func.count()).select_from(model).where(_in_boards(model.board_id, gone))
            n = conn.execute(stmt).scalar_one()
        found.append(Prunable(table, int(n)))
    acts = select(func.count()).select_from(RemediationAction.__table__)
    n = conn.execute(acts.where(_remediation_gone(before, now))).scalar_one()
    found.append(Prunable("remediation_actions", int(n)))
    return found


@dataclass(frozen=True)
class Dangling:
    """Rows that refer to a row that is not there (the store has no foreign keys: the ledger
    writes and prunes in bulk), and what a report loses with them."""

    table: str
    rows: int
    refers_to: str
    used_gpu_seconds: float = 0.0  # usage_windows only: what reports silently leave out
    energy_joules: float = 0.0


def check(url: str) -> list[Dangling]:
    """Every kind of dangling row of the store, counted (read-only): ledger windows whose
    series is gone, series whose device is gone or belongs to another cluster. A report
    joins through these references, so such rows drop out of every bill unseen."""
    store = open_store(url, read_only=True)
    w, s, d = UsageWindow.__table__, UsageSeries.__table__, UsageDevice.__table__
    no_series = ~select(s.c.id).where(s.c.id == w.c.series_id).exists()
    no_device = ~select(d.c.id).where(d.c.id == s.c.device_id).exists()
    other_cluster = select(d.c.id).where(d.c.id == s.c.device_id, d.c.cluster != s.c.cluster)
    try:
        with store.engine.connect() as conn:
            windows = conn.execute(
                select(
                    func.count(),
                    func.coalesce(func.sum(w.c.used_gpu_seconds), 0.0),
                    func.coalesce(func.sum(w.c.energy_joules), 0.0),
                ).where(no_series)
            ).one()
            found = [
                Dangling(
                    "usage_windows",
                    int(windows[0]),
                    "a missing usage_series row (series_id)",
                    float(windows[1]),
                    float(windows[2]),
                )
            ]
            for cond, what in (
                (no_device, "a missing usage_devices row (device_id)"),
                (other_cluster.exists(), "a usage_devices row of another cluster (device_id)"),
            ):
                n = conn.execute(select(func.count()).select_from(s).where(cond)).scalar_one()
                found.append(Dangling("usage_series", int(n), what))
            return found
    except SQLAlchemyError as exc:
        raise StoreError(f"check of {safe_url(url)} failed: {_describe(exc)}") from None
    finally:
        store.close()
