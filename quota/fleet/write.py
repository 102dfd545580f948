"""The fleet history's side of the store: boards, observed stretches, events and progress.

``replace_window`` upserts the window's boards, deletes the window's stretches and the events
seen in it, inserts the new ones and moves ``gpu_history_progress``, in one transaction:
ingesting a window again leaves the same rows, and a failure leaves the store as it was.
``priors`` reads each board's state before a window (the latest event per key), which a
window's first reading of a board is compared with.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Table, and_, delete, func, insert, select, update
from sqlalchemy.exc import SQLAlchemyError

from gpuquota.quota.fleet.rules import Identity, Prior, WindowHistory
from gpuquota.quota.ledger.write import Progress
from gpuquota.quota.store.db import Store, StoreUnavailableError, safe_url
from gpuquota.quota.store.models import GpuBoard, GpuEvent, GpuHistoryProgress, GpuObservation

CHUNK = 500


def table(model: type[Any]) -> Table:
    t = model.__table__
    assert isinstance(t, Table)
    return t


def _chunks(items: Sequence[Any]) -> Iterable[Sequence[Any]]:
    for i in range(0, len(items), CHUNK):
        yield items[i : i + CHUNK]


class FleetStore:
    """The fleet history's reads and writes on one store, for one cluster."""

    def __init__(self, store: Store, cluster: str) -> None:
        self.store = store
        self.cluster = cluster

    def failed(self, what: str, exc: SQLAlchemyError) -> StoreUnavailableError:
        orig = getattr(exc, "orig", None) or exc
        detail = " ".join(str(orig).split()) or type(orig).__name__
        return StoreUnavailableError(
            f"fleet history {what} {safe_url(self.store.url)} failed: {detail}"
        )

    def progress(self) -> Progress | None:
        p = table(GpuHistoryProgress)
        try:
            with self.store.engine.connect() as conn:
                row = conn.execute(select(p).where(p.c.cluster == self.cluster)).first()
        except SQLAlchemyError as exc:
            raise self.failed("read from", exc) from None
        return (
            None
            if row is None
            else Progress(row.window_seconds, row.ingested_until, row.updated_at)
        )

    def priors(self, serials: Sequence[str], start: int) -> dict[str, Prior]:
        """Each known board's state from what was seen before ``start``."""
        b, e, o = table(GpuBoard), table(GpuEvent), table(GpuObservation)
        out: dict[str, Prior] = {}
        try:
            with self.store.engine.connect() as conn:
                for chunk in _chunks(list(serials)):
                    boards = dict(
                        conn.execute(
                            select(b.c.id, b.c.serial).where(
                                b.c.cluster == self.cluster, b.c.serial.in_(chunk)
                            )
                        ).all()
                    )
                    if not boards:
                        continue
                    # the latest event per key (by the reading that showed it) is the state
                    latest: dict[tuple[int, str], tuple[int, int, dict[str, Any]]] = {}
                    for board_id, key, seen, event_id, detail in conn.execute(
                        select(e.c.board_id, e.c.key, e.c.seen, e.c.id, e.c.detail).where(
                            e.c.board_id.in_(list(boards)),
                            e.c.seen < start,
                            e.c.kind.not_in(("xid", "gap")),
                        )
                    ):
                        known = latest.get((board_id, key))
                        if known is None or (seen, event_id) > known[:2]:
                            latest[(board_id, key)] = (seen, event_id, detail)
                    for (board_id, key), (_, _, detail) in latest.items():
                        _apply(out.setdefault(boards[board_id], Prior()), key, detail)
                    for board_id, last in conn.execute(
                        select(o.c.board_id, func.max(o.c.ended_at))
                        .where(o.c.board_id.in_(list(boards)), o.c.ended_at <= start)
                        .group_by(o.c.board_id)
                    ):
                        out.setdefault(boards[board_id], Prior()).last_observed = int(last)
        except SQLAlchemyError as exc:
            raise self.failed("read from", exc) from None
        return out

    def replace_window(self, start: int, window: int, history: WindowHistory) -> int:
        """Store the window's history in place of what was stored for it; returns the rows
        written."""
        e, o, p = (
            table(GpuEvent),
            table(GpuObservation),
            table(GpuHistoryProgress),
        )
        end = start + window
        serials = sorted(set(history.first_seen) | {s.serial for s in history.stretches})
        now = int(time.time())
        try:
            with self.store.engine.begin() as conn:
                ids = self._board_ids(conn, serials, history)
                conn.execute(
                    delete(o).where(o.c.cluster == self.cluster, o.c.window_start == start)
                )
                conn.execute(
                    delete(e).where(
                        and_(e.c.cluster == self.cluster, e.c.seen >= start, e.c.seen < end)
                    )
                )
                stretches = [
                    {
                        "board_id": ids[s.serial],
                        "window_start": start,
                        "started_at": s.start,
                        "ended_at": s.end,
                        "cluster": self.cluster,
                        "uuid": s.identity.uuid,
                        "node": s.identity.node,
                        "pci_bus_id": s.identity.pci_bus_id,
                        "model": s.identity.model,
                        "driver_version": s.identity.driver_version,
                        "vbios_version": s.identity.vbios_version,
                        "state": s.state,
                        "lost": s.lost,
                    }
                    for s in history.stretches
                ]
                events = [
                    {
                        "board_id": ids[v.serial],
                        "at": v.at,
                        "seen": v.seen,
                        "cluster": self.cluster,
                        "kind": v.kind,
                        "key": v.key,
                        "detail": dict(v.detail),
                    }
                    for v in sorted(history.events, key=lambda v: (v.seen, v.serial, v.key))
                ]
                if stretches:
                    conn.execute(insert(o), stretches)
                if events:
                    conn.execute(insert(e), events)
                values = {"window_seconds": window, "ingested_until": end, "updated_at": now}
                changed = conn.execute(
                    update(p)
                    .where(p.c.cluster == self.cluster, p.c.ingested_until < end)
                    .values(**values)
                ).rowcount
                if (
                    not changed
                    and conn.execute(select(p.c.cluster).where(p.c.cluster == self.cluster)).first()
                    is None
                ):
                    conn.execute(insert(p).values(cluster=self.cluster, **values))
        except SQLAlchemyError as exc:
            raise self.failed("write to", exc) from None
        return len(stretches) + len(events)

    def _board_ids(self, conn: Any, serials: list[str], history: WindowHistory) -> dict[str, int]:
        b = table(GpuBoard)
        ids: dict[str, int] = {}
        for chunk in _chunks(serials):
            ids.update(
                conn.execute(
                    select(b.c.serial, b.c.id).where(
                        b.c.cluster == self.cluster, b.c.serial.in_(chunk)
                    )
                ).all()
            )
        for serial in serials:
            first = history.first_seen.get(serial)
            last = history.last_seen.get(serial)
            spans = [s for s in history.stretches if s.serial == serial]
            lo = min(([first] if first is not None else []) + [s.start for s in spans])
            hi = max(([last] if last is not None else []) + [s.end for s in spans])
            if serial in ids:
                conn.execute(
                    update(b)
                    .where(b.c.id == ids[serial])
                    .values(
                        first_seen=func.min(b.c.first_seen, lo)
                        if self.store.dialect == "sqlite"
                        else func.least(b.c.first_seen, lo),
                        last_seen=func.max(b.c.last_seen, hi)
                        if self.store.dialect == "sqlite"
                        else func.greatest(b.c.last_seen, hi),
                    )
                )
            else:
                ids[serial] = conn.execute(
                    insert(b)
                    .values(cluster=self.cluster, serial=serial, first_seen=lo, last_seen=hi)
                    .returning(b.c.id)
                ).scalar_one()
        return ids


def _apply(prior: Prior, key: str, detail: dict[str, Any]) -> None:
    if key == "verdict":
        pairs = tuple((str(r), str(a)) for r, a in detail.get("pairs", []))
        prior.verdict = (detail["state"], pairs)
    elif key == "lost":
        prior.lost = bool(detail["lost"])
    elif key == "identity":
        prior.identity = Identity(**detail["identity"])
    elif key.startswith("counter:") and detail.get("to") is not None:
        prior.counters[detail["counter"]] = float(detail["to"])
