"""The cost of unavailability: the GPU-hours each fence took from the namespaces whose pods
held the GPU when it was fenced (``gpuquota gpus --cost``).

Who held a GPU at a second comes from the usage ledger (its pod series of the GPU's UUID with
a window row around that second) and the pods' allocations (running then). A fence takes from
each such pod the fenced time, from the fence to the release (or the last time the GPU was
seen), up to the pod's end, clipped to the period; pods sharing the GPU (time-slicing) share
it equally. GPU-hours are of the physical GPU: a fenced GPU is lost whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from sqlalchemy import Connection, and_, func, select

from gpuquota.quota.fleet.summary import BoardHistory, fence_changes, next_change, stretch_at
from gpuquota.quota.fleet.write import table
from gpuquota.quota.store.models import Allocation, UsageDevice, UsageSeries, UsageWindow


@dataclass(frozen=True)
class Holder:
    namespace: str
    pod: str
    pod_uid: str
    started_at: int
    ended_at: int | None


@dataclass
class NamespaceCost:
    namespace: str
    fences: int = 0
    gpu_seconds: float = 0.0
    pods: set[str] = field(default_factory=set)
    serials: set[str] = field(default_factory=set)

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds / 3600


def fence_spans(board: BoardHistory) -> list[tuple[int, int, str]]:
    """Each fence of the board: (fenced at, released at or last seen, the UUID it had)."""
    changes = fence_changes(board.events)
    out = []
    for i, fence in enumerate(changes):
        if not fence.fenced:
            continue
        at = fence.at
        release = next_change(changes, i, fenced=False)
        end = release.at if release is not None else board.last_seen
        where = stretch_at(board.stretches, at)
        if where is not None:
            out.append((at, max(at, end), where.uuid))
    return out


def costs(
    boards: Iterable[BoardHistory],
    holders_at: Mapping[tuple[str, int], Sequence[Holder]],
    lo: int,
    hi: int,
) -> list[NamespaceCost]:
    """GPU-hours lost per namespace, most first. ``holders_at[(uuid, t)]``: the pods holding
    GPU ``uuid`` at second ``t`` (holders_of)."""
    out: dict[str, NamespaceCost] = {}
    for board in boards:
        for at, end, uuid in fence_spans(board):
            holders = holders_at.get((uuid, at), ())
            for h in holders:
                stop = min(end, hi, h.ended_at if h.ended_at is not None else end)
                seconds = max(0, stop - max(at, lo)) / len(holders)
                if not lo <= at < hi and not seconds:
                    continue
                cost = out.setdefault(h.namespace, NamespaceCost(h.namespace))
                cost.fences += 1 if lo <= at < hi else 0
                cost.gpu_seconds += seconds
                cost.pods.add(h.pod)
                cost.serials.add(board.serial)
    return sorted(out.values(), key=lambda c: (-c.gpu_seconds, c.namespace))


def holders_of(
    conn: Connection, cluster: str, wanted: Iterable[tuple[str, int]]
) -> dict[tuple[str, int], list[Holder]]:
    """The pods holding each (GPU UUID, second): a ledger row of the pod on that GPU whose
    window holds the second, and the pod's allocation running then."""
    d, s, w, a = table(UsageDevice), table(UsageSeries), table(UsageWindow), table(Allocation)
    out: dict[tuple[str, int], list[Holder]] = {}
    for uuid, at in wanted:
        rows = conn.execute(
            select(
                s.c.namespace,
                s.c.holder_name,
                s.c.holder_uid,
                func.min(a.c.started_at),
                func.max(func.coalesce(a.c.ended_at, 2**62)),
            )
            .select_from(
                d.join(s, s.c.device_id == d.c.id)
                .join(w, w.c.series_id == s.c.id)
                .join(a, and_(a.c.cluster == s.c.cluster, a.c.pod_uid == s.c.holder_uid))
            )
            .where(
                d.c.cluster == cluster,
                d.c.device_uuid == uuid,
                s.c.holder_kind == "pod",
                w.c.window_start <= at,
                w.c.window_start + w.c.window_seconds > at,
            )
            .group_by(s.c.namespace, s.c.holder_name, s.c.holder_uid)
        ).all()
        out[(uuid, at)] = [
            Holder(ns, pod, uid, int(start), None if end >= 2**62 else int(end))
            for ns, pod, uid, start, end in rows
            if start <= at < end
        ]
    return out
