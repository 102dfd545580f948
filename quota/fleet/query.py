"""Reads of ``gpuquota gpus``: the boards of the store with their stretches in a period and
their whole event timeline (a recovery's hold reaches past the period; events are few), and
each node's pool (``node_capacity.node_pool``, the latest row per node)."""

from __future__ import annotations

from sqlalchemy import Connection, func, select

from gpuquota.quota.fleet.summary import BoardHistory, StoredEvent, StoredStretch
from gpuquota.quota.fleet.write import table
from gpuquota.quota.store.models import (
    GpuBoard,
    GpuEvent,
    GpuHistoryProgress,
    GpuObservation,
    NodeCapacity,
)


def node_pools(conn: Connection, cluster: str | None) -> dict[tuple[str, str], str | None]:
    c = table(NodeCapacity)
    stmt = select(c.c.cluster, c.c.node, c.c.node_pool, c.c.started_at)
    if cluster is not None:
        stmt = stmt.where(c.c.cluster == cluster)
    latest: dict[tuple[str, str], tuple[int, str | None]] = {}
    for row in conn.execute(stmt):
        known = latest.get((row.cluster, row.node))
        if known is None or row.started_at >= known[0]:
            latest[(row.cluster, row.node)] = (row.started_at, row.node_pool)
    return {k: v[1] for k, v in latest.items()}


def ingested_until(conn: Connection, cluster: str | None) -> int | None:
    """How far the fleet history is ingested (the furthest of the clusters'), None when this
    store holds none."""
    p = table(GpuHistoryProgress)
    stmt = select(func.max(p.c.ingested_until))
    if cluster is not None:
        stmt = stmt.where(p.c.cluster == cluster)
    found = conn.execute(stmt).scalar()
    return None if found is None else int(found)


def load(
    conn: Connection,
    cluster: str | None,
    lo: int,
    hi: int,
    serial: str | None = None,
) -> list[BoardHistory]:
    """Boards seen in [lo, hi) (every stretch of theirs in it, every event), by serial."""
    b, o, e = table(GpuBoard), table(GpuObservation), table(GpuEvent)
    stmt = select(b).where(b.c.first_seen < hi, b.c.last_seen >= lo)
    if cluster is not None:
        stmt = stmt.where(b.c.cluster == cluster)
    if serial is not None:
        stmt = stmt.where(b.c.serial == serial)
    boards = {
        r.id: BoardHistory(r.cluster, r.serial, int(r.first_seen), int(r.last_seen))
        for r in conn.execute(stmt)
    }
    if not boards:
        return []
    pools = node_pools(conn, cluster)
    ids = list(boards)
    for i in range(0, len(ids), 500):
        chunk = ids[i : i + 500]
        for r in conn.execute(
            select(o)
            .where(o.c.board_id.in_(chunk), o.c.ended_at > lo, o.c.started_at < hi)
            .order_by(o.c.board_id, o.c.started_at)
        ):
            board = boards[r.board_id]
            board.stretches.append(
                StoredStretch(
                    int(r.started_at),
                    int(r.ended_at),
                    r.uuid,
                    r.node,
                    r.pci_bus_id,
                    r.model,
                    r.driver_version,
                    r.vbios_version,
                    r.state,
                    bool(r.lost),
                    pools.get((board.cluster, r.node)),
                )
            )
        for r in conn.execute(
            select(e)
            .where(e.c.board_id.in_(chunk))
            .order_by(e.c.board_id, e.c.at, e.c.seen, e.c.id)
        ):
            boards[r.board_id].events.append(
                StoredEvent(int(r.at), int(r.seen), r.kind, r.key, dict(r.detail))
            )
    return sorted(boards.values(), key=lambda x: (x.cluster, x.serial))
