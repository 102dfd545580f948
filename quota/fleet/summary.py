"""Pure figures of ``gpuquota gpus``: each board's period (observed and fenced hours, fences,
XIDs by code, memory counter deltas, recoveries and how long each held, relapses) and failure
rates per group over observed GPU-days. No I/O: quota/fleet/query.py loads the rows.

Rules (docs/health.md):
- a *fence* is a verdict change into ``unhealthy`` (what the agent fences on), a *release* one
  out of it; a release is *held* until the board's next fence (a *relapse* when that comes
  within ``relapse_within``), else it is still holding at the end of what was observed; a
  relapse counts in the period its fence falls in, wherever the release fell;
- observed time is what the stretches cover; *unknown* time is the rest of the board's known
  life in the period ([first seen, last seen)), never counted as healthy;
- a group's rate is its events per 1,000 GPU-days of *observed* time in that group (fences
  and XIDs are attributed to the placement and versions the board had when they happened).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuquota.quota.store.vocabulary import FENCED

DAY = 86400
DEFAULT_RELAPSE_WITHIN = DAY
GROUP_KEYS = ("model", "pool", "driver", "node")
# no failure rate for a group observed less than this (--min-gpu-days): one fence in a GPU-day
# is a rate of 1,000; ten GPU-days (a node of 8 GPUs for a day and a bit) make one fence 100
RATE_FLOOR_GPU_DAYS = 10.0


@dataclass(frozen=True)
class StoredStretch:
    start: int
    end: int
    uuid: str
    node: str
    pci_bus_id: str | None
    model: str | None
    driver_version: str | None
    vbios_version: str | None
    state: str
    lost: bool
    pool: str | None = None


@dataclass(frozen=True)
class StoredEvent:
    at: int
    seen: int
    kind: str
    key: str
    detail: dict[str, Any]


@dataclass
class BoardHistory:
    cluster: str
    serial: str
    first_seen: int
    last_seen: int
    stretches: list[StoredStretch] = field(default_factory=list)  # by start
    events: list[StoredEvent] = field(default_factory=list)  # by (at, seen)


@dataclass(frozen=True)
class Recovery:
    released_at: int
    refenced_at: int | None  # None: still holding
    held_seconds: int  # to the next fence, or to the last time it was seen
    relapse: bool


@dataclass
class BoardSummary:
    cluster: str
    serial: str
    model: str | None
    nodes: list[str]
    uuids: list[str]
    observed_seconds: int
    fenced_seconds: int
    unknown_seconds: int
    fences: list[int]
    xids: dict[str, int]
    counters: dict[str, float]  # memory counters' increase in the period
    flags: dict[str, float]  # memory flags' last value (pending remap, remap failure, ...)
    recoveries: list[Recovery]  # the period's releases, and those its relapses followed
    relapsed: list[int]  # the period's fences that are relapses
    lost: int
    gaps: int
    state: str | None  # the last verdict observed in the period

    @property
    def relapses(self) -> int:
        return len(self.relapsed)

    def worst_key(self) -> tuple[float, ...]:
        return (
            len(self.fences),
            self.relapses,
            self.fenced_seconds,
            sum(self.xids.values()),
            sum(self.counters.values()),
            self.lost,
        )


def _overlap(a: int, b: int, lo: int, hi: int) -> int:
    return max(0, min(b, hi) - max(a, lo))


@dataclass(frozen=True)
class FenceChange:
    """A verdict change into ``unhealthy`` (a fence) or out of it (a release)."""

    at: int
    fenced: bool


def fence_changes(events: Iterable[StoredEvent]) -> list[FenceChange]:
    """The board's fences and releases in the order its readings showed them: by the reading's
    second, then the change's. A change is dated by the agent's own second, which can be the
    second of the change before it, or even earlier (an XID the agent read late dates the
    next fence before the release it follows): pairing by those seconds lost the relapse and
    read the release as still holding. The readings' order is the order they happened in."""
    out: list[FenceChange] = []
    for e in sorted(events, key=lambda e: (e.seen, e.at)):
        if e.kind != "verdict":
            continue
        state, previous = e.detail.get("state"), e.detail.get("previous")
        if state == FENCED and previous != FENCED:
            out.append(FenceChange(e.at, True))
        elif previous == FENCED and state != FENCED:
            out.append(FenceChange(e.at, False))
    return out


def next_change(changes: Sequence[FenceChange], i: int, fenced: bool) -> FenceChange | None:
    """The first change after ``changes[i]`` that is a fence (``fenced``) or a release."""
    return next((c for c in changes[i + 1 :] if c.fenced == fenced), None)


def summarize(board: BoardHistory, lo: int, hi: int, relapse_within: int) -> BoardSummary:
    inside = [s for s in board.stretches if _overlap(s.start, s.end, lo, hi)]
    observed = sum(_overlap(s.start, s.end, lo, hi) for s in inside)
    fenced = sum(_overlap(s.start, s.end, lo, hi) for s in inside if s.state == FENCED)
    known = _overlap(board.first_seen, board.last_seen, lo, hi)
    changes = fence_changes(board.events)
    fences = [c.at for c in changes if c.fenced and lo <= c.at < hi]
    recoveries = []
    relapsed: list[int] = []
    for i, release in enumerate(changes):
        if release.fenced:
            continue
        refence = next_change(changes, i, fenced=True)
        nxt = refence.at if refence is not None else None
        held = max(0, (nxt if nxt is not None else board.last_seen) - release.at)
        relapse = nxt is not None and held <= relapse_within
        # a relapse is the period's where its fence falls, wherever the release fell: a
        # release at the end of October and a fence on November 1st is November's relapse
        # (the release is listed in both periods, the relapse counted in November only)
        again = relapse and nxt is not None and lo <= nxt < hi
        if again and nxt is not None:
            relapsed.append(nxt)
        if lo <= release.at < hi or again:
            recoveries.append(Recovery(release.at, nxt, held, relapse))
    xids: dict[str, int] = {}
    counters: dict[str, float] = {}
    flags: dict[str, float] = {}
    lost = gaps = 0
    state = None
    for e in board.events:
        if not lo <= e.at < hi:
            if e.kind == "verdict" and e.at < lo:
                state = e.detail.get("state")
            continue
        if e.kind == "xid":
            code = str(e.detail["code"])
            xids[code] = xids.get(code, 0) + int(e.detail["count"])
        elif e.kind == "counter":
            name, before, after = e.detail["counter"], e.detail.get("from"), e.detail["to"]
            if name.split(":")[0].endswith("_total"):
                if before is not None and after >= before:
                    counters[name] = counters.get(name, 0.0) + after - before
            else:
                flags[name] = after
        elif e.kind == "lost" and e.detail.get("lost"):
            lost += 1
        elif e.kind == "gap":
            gaps += 1
        elif e.kind == "verdict":
            state = e.detail.get("state")
    nodes: list[str] = []
    uuids: list[str] = []
    for s in inside:
        if s.node not in nodes:
            nodes.append(s.node)
        if s.uuid not in uuids:
            uuids.append(s.uuid)
    return BoardSummary(
        cluster=board.cluster,
        serial=board.serial,
        model=next((s.model for s in reversed(inside) if s.model), None),
        nodes=nodes,
        uuids=uuids,
        observed_seconds=observed,
        fenced_seconds=fenced,
        unknown_seconds=max(0, known - observed),
        fences=fences,
        xids=dict(sorted(xids.items(), key=lambda kv: (len(kv[0]), kv[0]))),
        counters=counters,
        flags=flags,
        recoveries=recoveries,
        relapsed=relapsed,
        lost=lost,
        gaps=gaps,
        state=state,
    )


def worst_first(summaries: Iterable[BoardSummary]) -> list[BoardSummary]:
    ordered = sorted(summaries, key=lambda s: (s.cluster, s.serial))
    return sorted(ordered, key=BoardSummary.worst_key, reverse=True)


@dataclass
class GroupRate:
    group: str
    gpus: int
    observed_seconds: int  # GPU-seconds, added up as integers: the days are exact
    fenced_seconds: int
    fences: int
    xids: int
    relapses: int

    @property
    def observed_gpu_days(self) -> float:
        return self.observed_seconds / DAY

    @property
    def fenced_gpu_days(self) -> float:
        return self.fenced_seconds / DAY

    def per_1000(self, count: int) -> float | None:
        """Events per 1,000 observed GPU-days; None without observed time."""
        if self.observed_gpu_days <= 0:
            return None
        return count / self.observed_gpu_days * 1000.0

    @property
    def fence_rate(self) -> float | None:
        return self.per_1000(self.fences)

    @property
    def xid_rate(self) -> float | None:
        return self.per_1000(self.xids)


def group_of(stretch: StoredStretch, key: str) -> str:
    value = {
        "model": stretch.model,
        "pool": stretch.pool,
        "driver": stretch.driver_version,
        "node": stretch.node,
    }[key]
    return value or "(unknown)"


def stretch_at(stretches: Sequence[StoredStretch], t: int) -> StoredStretch | None:
    """The stretch holding ``t``, else the last one before it, else the first one."""
    before = None
    for s in stretches:
        if s.start <= t < s.end:
            return s
        if s.start <= t:
            before = s
    return before if before is not None else (stretches[0] if stretches else None)


def rates(
    boards: Iterable[BoardHistory], key: str, lo: int, hi: int, relapse_within: int
) -> list[GroupRate]:
    """Failure rates per group, worst fence rate first."""
    out: dict[str, GroupRate] = {}
    members: dict[str, set[str]] = {}

    def group(name: str) -> GroupRate:
        if name not in out:
            out[name] = GroupRate(name, 0, 0, 0, 0, 0, 0)
            members[name] = set()
        return out[name]

    for board in boards:
        for s in board.stretches:
            seconds = _overlap(s.start, s.end, lo, hi)
            if not seconds:
                continue
            g = group(group_of(s, key))
            members[g.group].add(f"{board.cluster}/{board.serial}")
            g.observed_seconds += seconds
            if s.state == FENCED:
                g.fenced_seconds += seconds
        summary = summarize(board, lo, hi, relapse_within)
        relapsed = set(summary.relapsed)
        for t in summary.fences:
            where = stretch_at(board.stretches, t)
            if where is not None:
                g = group(group_of(where, key))
                g.fences += 1
                g.relapses += t in relapsed
        for e in board.events:
            if e.kind == "xid" and lo <= e.at < hi:
                where = stretch_at(board.stretches, e.at)
                if where is not None:
                    group(group_of(where, key)).xids += int(e.detail["count"])
    for name, g in out.items():
        g.gpus = len(members[name])
    return sorted(
        out.values(),
        key=lambda g: (-(g.fence_rate or 0.0), -(g.xid_rate or 0.0), g.group),
    )
