"""The usage ledger's side of the store: series, window rows and progress.

``replace_window`` upserts the window's series, deletes the window's rows of the cluster and
inserts the new ones, and moves ``ledger_progress`` forward, all in one transaction: ingesting
a window again replaces its rows, and a failure anywhere leaves the store as it was, so nothing
is counted twice or half. ``roll_up_day`` replaces a final day's rows of the cluster by their
roll-up (rules.roll_up) and moves ``rolled_until``, in one transaction too.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Connection,
    Float,
    Table,
    and_,
    cast,
    delete,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.exc import SQLAlchemyError

from gpuquota.quota.ledger.rules import (
    UTC,
    HolderWindow,
    OpenHolder,
    Usage,
    WindowRow,
    next_day,
    roll_up,
)
from gpuquota.quota.ledger.source import SeriesSamples
from gpuquota.quota.store.db import Store, StoreError, StoreUnavailableError, safe_url
from gpuquota.quota.store.models import (
    Allocation,
    ClaimAllocation,
    LedgerProgress,
    UsageDevice,
    UsageSeries,
    UsageWindow,
)

CHUNK = 500  # bound parameters per IN list (SQLite's limit is 32766; keep statements small)

Key = tuple[str, str, str]  # device_uuid, holder_kind, holder_uid
# window_start, window_seconds, end_used, end_energy of the series' latest earlier window
Baseline = tuple[int, int, float | None, float | None]
# one series' row from its samples and its stored baseline (None: no earlier window)
UsageFn = Callable[[SeriesSamples, Baseline | None], Usage | None]


@dataclass(frozen=True)
class Progress:
    window_seconds: int
    ingested_until: int
    updated_at: int
    rolled_until: int | None = None


def _table(model: type[Any]) -> Table:
    table = model.__table__
    assert isinstance(table, Table)
    return table


def _chunks(items: Sequence[str]) -> Iterable[Sequence[str]]:
    for i in range(0, len(items), CHUNK):
        yield items[i : i + CHUNK]


class LedgerStore:
    """The ledger's reads and writes on one store (the ingest thread's own connections)."""

    def __init__(self, store: Store, cluster: str) -> None:
        self.store = store
        self.cluster = cluster

    def _failed(self, what: str, exc: SQLAlchemyError) -> StoreUnavailableError:
        orig = getattr(exc, "orig", None) or exc
        detail = " ".join(str(orig).split()) or type(orig).__name__
        return StoreUnavailableError(f"ledger {what} {safe_url(self.store.url)} failed: {detail}")

    def progress(self) -> Progress | None:
        p = _table(LedgerProgress)
        try:
            with self.store.engine.connect() as conn:
                row = conn.execute(select(p).where(p.c.cluster == self.cluster)).first()
        except SQLAlchemyError as exc:
            raise self._failed("read from", exc) from None
        return (
            None
            if row is None
            else Progress(row.window_seconds, row.ingested_until, row.updated_at, row.rolled_until)
        )

    def first_window_start(self) -> int | None:
        """The start of the cluster's oldest window row (None: no rows)."""
        w, t = _table(UsageWindow), _table(UsageSeries)
        try:
            with self.store.engine.connect() as conn:
                first = conn.execute(
                    select(func.min(w.c.window_start))
                    .select_from(w.join(t, t.c.id == w.c.series_id))
                    .where(t.c.cluster == self.cluster)
                ).scalar()
        except SQLAlchemyError as exc:
            raise self._failed("read from", exc) from None
        return None if first is None else int(first)

    def roll_up_day(self, day: int, zone: str = UTC) -> tuple[int, int]:
        """Roll the cluster's rows of the day of ``zone`` starting at ``day`` up (rules.roll_up)
        and set ``rolled_until`` to the day's end, in one transaction. Returns (rows before,
        rows after). Only series whose rows merge are rewritten."""
        w, t, p = _table(UsageWindow), _table(UsageSeries), _table(LedgerProgress)
        end = next_day(day, zone)
        before = after = 0
        try:
            with self.store.engine.begin() as conn:
                found = conn.execute(
                    select(
                        w.c.series_id,
                        t.c.holder_kind,
                        w.c.window_start,
                        w.c.window_seconds,
                        w.c.used_gpu_seconds,
                        w.c.energy_joules,
                        w.c.sampled_seconds,
                        w.c.end_used,
                        w.c.end_energy,
                    )
                    .select_from(w.join(t, t.c.id == w.c.series_id))
                    .where(
                        t.c.cluster == self.cluster,
                        w.c.window_start >= day,
                        w.c.window_start < end,
                    )
                    .order_by(w.c.series_id, w.c.window_start)
                ).all()
                rewrite: dict[int, list[WindowRow]] = {}
                for (sid, kind), rows in itertools.groupby(found, key=lambda r: (int(r[0]), r[1])):
                    own = [
                        WindowRow(int(r[2]), int(r[3]), Usage(r[4], r[5], r[6], r[7], r[8]))
                        for r in rows
                    ]
                    merged = roll_up(own, across_gaps=kind == "unallocated", zone=zone)
                    before += len(own)
                    after += len(merged)
                    if len(merged) < len(own):
                        rewrite[sid] = merged
                for chunk in _chunks([str(sid) for sid in rewrite]):
                    conn.execute(
                        delete(w).where(
                            w.c.series_id.in_([int(x) for x in chunk]),
                            w.c.window_start >= day,
                            w.c.window_start < end,
                        )
                    )
                rows_out = [
                    {
                        "series_id": sid,
                        "window_start": r.window_start,
                        "window_seconds": r.window_seconds,
                        "used_gpu_seconds": r.usage.used_gpu_seconds,
                        "energy_joules": r.usage.energy_joules,
                        "sampled_seconds": r.usage.sampled_seconds,
                        "end_used": r.usage.end_used,
                        "end_energy": r.usage.end_energy,
                    }
                    for sid, merged in rewrite.items()
                    for r in merged
                ]
                if rows_out:
                    conn.execute(insert(w), rows_out)
                conn.execute(update(p).where(p.c.cluster == self.cluster).values(rolled_until=end))
        except SQLAlchemyError as exc:
            raise self._failed("write to", exc) from None
        return before, after

    def series_ids(self, conn: Connection, series: Sequence[SeriesSamples]) -> dict[Key, int]:
        """Upsert the series' devices (labels: the last seen; a known GPU model is kept), then
        the series (labels: the last seen) and return their ids."""
        t = _table(UsageSeries)
        if not series:
            return {}
        devices = self._device_ids(conn, series)
        rows = [
            {
                "cluster": self.cluster,
                "device_id": devices[s.device_uuid],
                "holder_kind": s.holder_kind,
                "holder_uid": s.holder_uid,
                "namespace": s.namespace,
                "holder_name": s.holder_name,
                "activity": s.activity,
            }
            for s in series
        ]
        stmt = self.store._insert(t)
        ex = stmt.excluded
        merged = {
            "namespace": ex.namespace,
            "holder_name": ex.holder_name,
            "activity": func.coalesce(ex.activity, t.c.activity),
        }
        stmt = stmt.on_conflict_do_update(
            index_elements=["cluster", "holder_uid", "holder_kind", "device_id"],
            set_=merged,
            # only a change writes: a series is seen every window and its labels rarely change
            # (rewriting each one every hour bloated PostgreSQL's series table threefold)
            where=or_(*(value.is_distinct_from(t.c[k]) for k, value in merged.items())),
        )
        conn.execute(stmt, rows)
        uuid_of = {i: u for u, i in devices.items()}
        wanted = {s.key for s in series}
        ids: dict[Key, int] = {}
        uids = sorted({s.holder_uid for s in series})
        for chunk in _chunks(uids):
            for row in conn.execute(
                select(t.c.id, t.c.device_id, t.c.holder_kind, t.c.holder_uid).where(
                    t.c.cluster == self.cluster, t.c.holder_uid.in_(chunk)
                )
            ):
                key = (uuid_of.get(row.device_id, ""), row.holder_kind, row.holder_uid)
                if key in wanted:
                    ids[key] = row.id
        return ids

    def _device_ids(self, conn: Connection, series: Sequence[SeriesSamples]) -> dict[str, int]:
        """Upsert the series' devices and return their ids by UUID. A device's node, GPU model
        and MIG profile: the last non-null value of its series here, else the stored one; where
        no sample names a model, the stored one, else the allocation's of a pod holding it."""
        d = _table(UsageDevice)
        models = self._allocation_models(
            conn, [s.holder_uid for s in series if s.gpu_model is None and s.holder_kind == "pod"]
        )
        labels: dict[str, dict[str, str | None]] = {}
        fallback: dict[str, str] = {}  # device -> an allocation's model, where samples name none
        for s in series:
            seen = labels.setdefault(
                s.device_uuid, {"node": None, "gpu_model": None, "mig_profile": None}
            )
            for name, value in (
                ("node", s.node),
                ("gpu_model", s.gpu_model),
                ("mig_profile", s.mig_profile),
            ):
                if value is not None:
                    seen[name] = value
            if s.gpu_model is None and s.holder_uid in models:
                fallback[s.device_uuid] = models[s.holder_uid]
        named, filled = [], []  # GPU model from the samples; from an allocation (or none)
        for uuid, seen in sorted(labels.items()):
            values = {"cluster": self.cluster, "device_uuid": uuid, **seen}
            if seen["gpu_model"] is None:
                values["gpu_model"] = fallback.get(uuid)
                filled.append(values)
            else:
                named.append(values)
        ex = self.store._insert(d).excluded
        for rows, model in (
            (named, func.coalesce(ex.gpu_model, d.c.gpu_model)),
            # an allocation's model (node labels' name) only where the device has none
            (filled, func.coalesce(d.c.gpu_model, ex.gpu_model)),
        ):
            if not rows:
                continue
            merged = {
                "node": func.coalesce(ex.node, d.c.node),
                "gpu_model": model,
                "mig_profile": func.coalesce(ex.mig_profile, d.c.mig_profile),
            }
            stmt = self.store._insert(d).on_conflict_do_update(
                index_elements=["cluster", "device_uuid"],
                set_=merged,
                # only a change writes: a device is seen every window, it rarely changes
                where=or_(*(value.is_distinct_from(d.c[k]) for k, value in merged.items())),
            )
            conn.execute(stmt, rows)
        ids: dict[str, int] = {}
        for chunk in _chunks(sorted(labels)):
            for row in conn.execute(
                select(d.c.id, d.c.device_uuid).where(
                    d.c.cluster == self.cluster, d.c.device_uuid.in_(chunk)
                )
            ):
                ids[row.device_uuid] = row.id
        return ids

    def _allocation_models(self, conn: Connection, uids: Sequence[str]) -> dict[str, str]:
        """Pod UID -> its allocation's GPU model: for pod series whose samples name none."""
        a = _table(Allocation)
        models: dict[str, str] = {}
        for chunk in _chunks(sorted(set(uids))):
            for row in conn.execute(
                select(a.c.pod_uid, a.c.gpu_model).where(
                    a.c.cluster == self.cluster,
                    a.c.pod_uid.in_(chunk),
                    a.c.gpu_model.is_not(None),
                )
            ):
                models[row.pod_uid] = row.gpu_model
        return models

    def baselines(self, conn: Connection, ids: Sequence[int], start: int) -> dict[int, Baseline]:
        """Series id -> its latest window before ``start`` (see Baseline)."""
        w = _table(UsageWindow)
        out: dict[int, Baseline] = {}
        for chunk in _chunks([str(i) for i in ids]):
            numbers = [int(i) for i in chunk]
            latest = (
                select(w.c.series_id, func.max(w.c.window_start).label("window_start"))
                .where(w.c.series_id.in_(numbers), w.c.window_start < start)
                .group_by(w.c.series_id)
                .subquery()
            )
            for row in conn.execute(
                select(
                    w.c.series_id,
                    w.c.window_start,
                    w.c.window_seconds,
                    w.c.end_used,
                    w.c.end_energy,
                ).join(
                    latest,
                    and_(
                        w.c.series_id == latest.c.series_id,
                        w.c.window_start == latest.c.window_start,
                    ),
                )
            ):
                out[row.series_id] = (
                    row.window_start,
                    row.window_seconds,
                    row.end_used,
                    row.end_energy,
                )
        return out

    def replace_window(
        self,
        start: int,
        window: int,
        series: Sequence[SeriesSamples],
        usage_of: UsageFn,
        *,
        now: int | None = None,
    ) -> int:
        """Ingest one window in one transaction: upsert its series, compute each row with
        ``usage_of(series, baseline)`` from the stored baselines, replace the window's rows,
        move progress to at least the window's end. Returns the rows written."""
        w = _table(UsageWindow)
        t = _table(UsageSeries)
        p = _table(LedgerProgress)
        end = start + window
        stamp = int(time.time()) if now is None else now
        try:
            with self.store.engine.begin() as conn:
                # rolled-up days are final (rules.plan never asks for them): a window there
                # would land beside its day's rolled row and count twice
                rolled = conn.execute(
                    select(p.c.rolled_until).where(p.c.cluster == self.cluster)
                ).scalar()
                if rolled is not None and start < rolled:
                    raise StoreError(
                        f"ledger window {start} of cluster {self.cluster!r} is in a rolled-up "
                        f"day (before {rolled}): its rows are final"
                    )
                ids = self.series_ids(conn, series)
                bases = self.baselines(conn, list(ids.values()), start)
                rows = []
                for s in series:
                    sid = ids[s.key]
                    usage = usage_of(s, bases.get(sid))
                    if usage is None:
                        continue
                    rows.append(
                        {
                            "series_id": sid,
                            "window_start": start,
                            "window_seconds": window,
                            "used_gpu_seconds": usage.used_gpu_seconds,
                            "energy_joules": usage.energy_joules,
                            "sampled_seconds": usage.sampled_seconds,
                            "end_used": usage.end_used,
                            "end_energy": usage.end_energy,
                        }
                    )
                ours = select(t.c.id).where(t.c.cluster == self.cluster).scalar_subquery()
                conn.execute(delete(w).where(w.c.window_start == start, w.c.series_id.in_(ours)))
                if rows:
                    conn.execute(insert(w), rows)
                stmt = self.store._insert(p).values(
                    cluster=self.cluster,
                    window_seconds=window,
                    ingested_until=end,
                    updated_at=stamp,
                )
                ex = stmt.excluded
                conn.execute(
                    stmt.on_conflict_do_update(
                        index_elements=["cluster"],
                        set_={
                            "window_seconds": ex.window_seconds,
                            "ingested_until": func.max(p.c.ingested_until, ex.ingested_until)
                            if self.store.dialect == "sqlite"
                            else func.greatest(p.c.ingested_until, ex.ingested_until),
                            "updated_at": ex.updated_at,
                        },
                    )
                )
                return len(rows)
        except SQLAlchemyError as exc:
            raise self._failed("write to", exc) from None

    def open_holders(self) -> list[OpenHolder]:
        """Open allocations per holder: a pod's GPUs over its resources (allocations), a DRA
        claim's (its open rows; a claim shared by several pods once)."""
        a = _table(Allocation)
        c = _table(ClaimAllocation)
        try:
            with self.store.engine.connect() as conn:
                pods = conn.execute(
                    select(
                        a.c.pod_uid,
                        func.min(a.c.namespace),
                        func.min(a.c.pod_name),
                        func.sum(a.c.physical_gpus),
                        func.min(a.c.started_at),
                    )
                    .where(a.c.cluster == self.cluster, a.c.ended_at.is_(None))
                    .group_by(a.c.pod_uid)
                ).all()
                claims = conn.execute(
                    select(
                        c.c.claim_uid,
                        func.min(c.c.namespace),
                        func.min(c.c.claim_name),
                        func.max(c.c.physical_gpus),
                        func.min(c.c.started_at),
                    )
                    .where(c.c.cluster == self.cluster, c.c.ended_at.is_(None))
                    .group_by(c.c.claim_uid)
                ).all()
        except SQLAlchemyError as exc:
            raise self._failed("read from", exc) from None
        return [
            OpenHolder(str(r[0]), str(r[1]), str(r[2]), float(r[3]), int(r[4]), kind)
            for kind, found in (("pod", pods), ("claim", claims))
            for r in found
        ]

    def holder_ends(self, holders: Sequence[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """(holder kind, UID) -> the end of its allocation, for the pods and claims among
        ``holders`` whose every allocation row has ended (the latest end); open or unknown
        holders are left out."""
        out: dict[tuple[str, str], int] = {}
        try:
            with self.store.engine.connect() as conn:
                for kind, table, uid_column in (
                    ("pod", _table(Allocation), "pod_uid"),
                    ("claim", _table(ClaimAllocation), "claim_uid"),
                ):
                    uid = table.c[uid_column]
                    wanted = sorted({u for k, u in holders if k == kind})
                    for chunk in _chunks(wanted):
                        for row in conn.execute(
                            select(uid, func.max(table.c.ended_at))
                            .where(table.c.cluster == self.cluster, uid.in_(chunk))
                            .group_by(uid)
                            # every row ended: no open one (count of ends = count of rows)
                            .having(func.count(table.c.ended_at) == func.count())
                        ):
                            out[(kind, str(row[0]))] = int(row[1])
        except SQLAlchemyError as exc:
            raise self._failed("read from", exc) from None
        return out

    def holder_windows(self, uids: Sequence[str], since: int) -> dict[str, list[HolderWindow]]:
        """Per holder UID, its windows starting at or after ``since``: used summed over its
        devices, sampled the most of any device."""
        w = _table(UsageWindow)
        t = _table(UsageSeries)
        out: dict[str, list[HolderWindow]] = {}
        try:
            with self.store.engine.connect() as conn:
                for chunk in _chunks(sorted(uids)):
                    for row in conn.execute(
                        select(
                            t.c.holder_uid,
                            w.c.window_start,
                            func.max(w.c.window_seconds),
                            # single precision stored: summed in double (query.double)
                            func.sum(cast(w.c.used_gpu_seconds, Float)),
                            func.max(w.c.sampled_seconds),
                        )
                        .join(t, t.c.id == w.c.series_id)
                        .where(
                            t.c.cluster == self.cluster,
                            t.c.holder_uid.in_(chunk),
                            t.c.holder_kind != "unallocated",
                            w.c.window_start >= since,
                        )
                        .group_by(t.c.holder_uid, w.c.window_start)
                    ):
                        out.setdefault(row[0], []).append(
                            HolderWindow(int(row[1]), int(row[2]), float(row[3]), float(row[4]))
                        )
        except SQLAlchemyError as exc:
            raise self._failed("read from", exc) from None
        return out
