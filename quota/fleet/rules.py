"""Pure rules of the fleet history: the node agents' readings of one window into observed
stretches and events per board serial. No I/O (quota/fleet/source.py reads Prometheus,
quota/fleet/write.py the store).

A *reading* is what one scrape of one agent said about one GPU: its identity (``gpu_info``),
its verdict and reasons, the second the verdict began, whether it was lost, its XID counters
and its memory counters. Readings of one serial from any node are one board's timeline, so a
board moved to another node keeps its history.

Rules (docs/accounting.md, "Fleet history"):

- Two readings of a board at most ``max_gap`` apart cover the time between them with the
  earlier one's attributes and verdict; a longer silence is a ``gap`` and unknown, never
  healthy. Stretches are clipped to the window.
- An event belongs to the window holding the reading that showed it, so windows never share
  one; a reading is compared with the board's reading before it (in the fetch, else the
  board's last stored state: ``Prior``).
- XIDs: the increase of each per-code counter between two samples of one agent's series,
  whatever the silence between them. The agent's start time (``Reading.started``: its
  ``gpuquota_exporter_start_time_seconds``) tells a restart, after which the counter began
  again from zero and its value counts whole, from a silence, across which it went on
  counting and only its increase counts; where the agent does not say it, a drop, or the
  series missing while the agent reported the GPU, is a restart. A series whose first sample
  comes after an earlier reading of the same agent and GPU was born then and counts whole.
  For a board silent since before the fetch, the counters' values at its last reading
  (``Prior.xids_then``, asked of the time-series store) are that earlier sample. XIDs that
  came during a silence are dated to the silence's start (their detail says the silence).
- A quiet run (``Reading.until``) is a reading whose word was said again at every scrape
  through ``until``, none more than ``max_gap`` apart (quota/fleet/source.py finds them with
  PromQL instead of fetching their samples): it covers [t, until] as those readings would.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# severity of the recommended actions (docs/health.md), for the action of a verdict
ACTIONS = ("none", "restart_app", "reset_gpu", "reboot_node")
UNKNOWN = "unknown"


@dataclass(frozen=True)
class Identity:
    """Where a board was and what it ran (gpu_info's labels)."""

    uuid: str
    node: str
    pci_bus_id: str | None = None
    model: str | None = None
    driver_version: str | None = None
    vbios_version: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "uuid": self.uuid,
            "node": self.node,
            "pci_bus_id": self.pci_bus_id,
            "model": self.model,
            "driver_version": self.driver_version,
            "vbios_version": self.vbios_version,
        }


@dataclass
class Reading:
    """One scrape's word on one GPU."""

    t: int
    serial: str
    identity: Identity
    state: str = UNKNOWN
    reasons: tuple[tuple[str, str], ...] = ()  # (reason, action), sorted
    since: int | None = None
    lost: bool = False
    counters: dict[str, float] = field(default_factory=dict)  # memory counters by key
    started: float | None = None  # the agent's start time, where it says it
    until: int | None = None  # a quiet run: the same word at every scrape through this second

    @property
    def agent(self) -> tuple[str, str]:
        return (self.identity.uuid, self.identity.node)


@dataclass(frozen=True)
class XidSeries:
    """One agent's counter of one XID code on one GPU: (t, value) in time order."""

    uuid: str
    node: str
    code: str
    samples: tuple[tuple[int, float], ...]


@dataclass
class Prior:
    """A board's state at the end of what is stored before the window (the latest event
    per key, and the end of its last observed stretch)."""

    verdict: tuple[str, tuple[tuple[str, str], ...]] | None = None
    lost: bool | None = None
    identity: Identity | None = None
    counters: dict[str, float] = field(default_factory=dict)
    last_observed: int | None = None
    # the XID counters (code -> value; a code without one had none) and the agent's start
    # time at ``last_observed``, of the agent of ``identity``: asked of the time-series store
    # for a board silent since before the fetch (source.recall), else None
    xids_then: dict[str, float] | None = None
    started_then: float | None = None


@dataclass(frozen=True)
class Stretch:
    serial: str
    start: int
    end: int
    identity: Identity
    state: str
    lost: bool


@dataclass(frozen=True)
class Event:
    serial: str
    at: int
    seen: int
    kind: str  # verdict | xid | counter | lost | identity | gap
    key: str
    detail: Mapping[str, Any]


@dataclass
class WindowHistory:
    stretches: list[Stretch] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    first_seen: dict[str, int] = field(default_factory=dict)
    last_seen: dict[str, int] = field(default_factory=dict)


def action_of(reasons: Iterable[tuple[str, str]]) -> str:
    """The most severe recommended action among the reasons ("none" without any)."""
    worst = 0
    for _, action in reasons:
        if action in ACTIONS:
            worst = max(worst, ACTIONS.index(action))
    return ACTIONS[worst]


def window_history(
    readings: Iterable[Reading],
    xids: Iterable[XidSeries],
    priors: Mapping[str, Prior],
    start: int,
    end: int,
    max_gap: int,
) -> WindowHistory:
    """The stretches and events of the window [start, end) from readings around it (those in
    [start - max_gap, end + max_gap])."""
    out = WindowHistory()
    by_serial: dict[str, list[Reading]] = {}
    for r in readings:
        by_serial.setdefault(r.serial, []).append(r)
    agent_times: dict[tuple[str, str], list[tuple[int, float | None]]] = {}
    serial_of_agent: dict[tuple[str, str], str] = {}
    for serial, timeline in by_serial.items():
        timeline.sort(key=lambda r: r.t)
        for r in timeline:
            agent_times.setdefault(r.agent, []).append((r.t, r.started))
            serial_of_agent[r.agent] = serial
        _board(serial, timeline, priors.get(serial, Prior()), start, end, max_gap, out)
    for series in xids:
        owner = serial_of_agent.get((series.uuid, series.node))
        if owner is not None:
            agent = _Agent(agent_times[(series.uuid, series.node)])
            then = _then(series, priors.get(owner, Prior()))
            _xids(owner, series, agent, then, start, end, max_gap, out)
    return out


def _inside(t: int, start: int, end: int) -> bool:
    return start <= t < end


def _board(
    serial: str,
    timeline: list[Reading],
    prior: Prior,
    start: int,
    end: int,
    max_gap: int,
    out: WindowHistory,
) -> None:
    verdict = prior.verdict
    lost = prior.lost
    identity = prior.identity
    counters = dict(prior.counters)
    last_t = prior.last_observed
    for i, r in enumerate(timeline):
        here = _inside(r.t, start, end)
        if here:
            out.first_seen[serial] = min(out.first_seen.get(serial, r.t), r.t)
            out.last_seen[serial] = max(out.last_seen.get(serial, r.t), r.t)
            if last_t is not None and r.t - last_t > max_gap:
                out.events.append(
                    Event(serial, last_t, r.t, "gap", "gap",
                          {"from": last_t, "to": r.t, "seconds": r.t - last_t})
                )  # fmt: skip
            _changes(serial, r, verdict, lost, identity, counters, out)
        verdict = (r.state, r.reasons)
        lost = r.lost
        identity = r.identity
        counters.update(r.counters)
        last_t = r.t if r.until is None else r.until
        if r.until is not None and max(r.t, start) < min(r.until, end):
            run = Stretch(serial, max(r.t, start), min(r.until, end), r.identity, r.state, r.lost)
            _stretch(out, run)
        if i + 1 < len(timeline):
            nxt = timeline[i + 1].t
            lo, hi = max(last_t, start), min(nxt, end)
            if nxt - last_t <= max_gap and lo < hi:
                _stretch(out, Stretch(serial, lo, hi, r.identity, r.state, r.lost))


def _stretch(out: WindowHistory, s: Stretch) -> None:
    last = out.stretches[-1] if out.stretches else None
    if (
        last is not None
        and last.serial == s.serial
        and last.end == s.start
        and (last.identity, last.state, last.lost) == (s.identity, s.state, s.lost)
    ):
        out.stretches[-1] = Stretch(s.serial, last.start, s.end, s.identity, s.state, s.lost)
    else:
        out.stretches.append(s)


def _changes(
    serial: str,
    r: Reading,
    verdict: tuple[str, tuple[tuple[str, str], ...]] | None,
    lost: bool | None,
    identity: Identity | None,
    counters: dict[str, float],
    out: WindowHistory,
) -> None:
    if verdict != (r.state, r.reasons):
        # the agent's own second of the change, where it says one no later than the reading
        at = r.since if r.since is not None and r.since <= r.t else r.t
        if verdict is not None and verdict[0] == r.state:
            at = r.t  # the same verdict with other reasons: since is the verdict's
        out.events.append(
            Event(
                serial, at, r.t, "verdict", "verdict",
                {
                    "state": r.state,
                    "previous": verdict[0] if verdict is not None else None,
                    "reasons": [reason for reason, _ in r.reasons],
                    "action": action_of(r.reasons),
                    "pairs": [list(pair) for pair in r.reasons],
                },
            )
        )  # fmt: skip
    if lost != r.lost and (lost is not None or r.lost):
        out.events.append(Event(serial, r.t, r.t, "lost", "lost", {"lost": r.lost}))
    if identity != r.identity:
        out.events.append(
            Event(
                serial, r.t, r.t, "identity", "identity",
                {"identity": r.identity.as_dict(),
                 "previous": identity.as_dict() if identity is not None else None},
            )
        )  # fmt: skip
    for key, value in sorted(r.counters.items()):
        before = counters.get(key)
        if before != value:
            out.events.append(
                Event(serial, r.t, r.t, "counter", f"counter:{key}",
                      {"counter": key, "from": before, "to": value})
            )  # fmt: skip


class _Agent:
    """One agent's readings of one GPU: their times and its start time said at each."""

    def __init__(self, readings: list[tuple[int, float | None]]) -> None:
        self.times = [t for t, _ in readings]
        self.started = [s for _, s in readings]

    def last_before(self, t: int) -> int | None:
        """The time of the agent's latest reading before ``t``."""
        i = bisect.bisect_left(self.times, t)
        return self.times[i - 1] if i else None

    def started_at(self, t: int) -> float | None:
        """The agent's start time said at its reading of ``t`` (None where not said)."""
        i = bisect.bisect_left(self.times, t)
        return self.started[i] if i < len(self.times) and self.times[i] == t else None

    def any_between(self, lo: int, hi: int) -> bool:
        """Whether the agent read the GPU strictly between lo and hi."""
        return bisect.bisect_right(self.times, lo) < bisect.bisect_left(self.times, hi)


@dataclass(frozen=True)
class _Then:
    """A series' value at its board's last reading before a silence reaching past the fetch
    (0: the series had none), and its agent's start time then."""

    t: int
    value: float
    started: float | None


def _then(series: XidSeries, prior: Prior) -> _Then | None:
    last, identity = prior.last_observed, prior.identity
    if prior.xids_then is None or last is None or identity is None:
        return None
    if (identity.uuid, identity.node) != (series.uuid, series.node):
        return None  # another agent's counters (the board moved): this one's are its own
    if not series.samples or series.samples[0][0] <= last:
        return None
    return _Then(last, prior.xids_then.get(series.code, 0.0), prior.started_then)


def _xids(
    serial: str,
    series: XidSeries,
    agent: _Agent,
    then: _Then | None,
    start: int,
    end: int,
    max_gap: int,
    out: WindowHistory,
) -> None:
    previous = (then.t, then.value, then.started) if then is not None else None
    for t, value in series.samples:
        started = agent.started_at(t)
        last_t = agent.last_before(t)
        if previous is None:
            # born while its agent was already reporting the GPU: every count is new
            count = value if last_t is not None else 0.0
        else:
            p_t, p_value, p_started = previous
            last_t = max(last_t, p_t) if last_t is not None else p_t
            if started is not None or p_started is not None:
                # the agent's own word: a new start time is a restart (counting from zero),
                # and so is one said only on one side (an agent upgraded to one that says it)
                restarted = started != p_started or value < p_value
            else:
                # a drop, or the series was absent while the agent reported the GPU
                restarted = value < p_value or agent.any_between(p_t, t)
            count = value if restarted else value - p_value
        previous = (t, value, started)
        if count > 0 and _inside(t, start, end):
            detail: dict[str, Any] = {"code": series.code, "count": round(count)}
            at = t
            if last_t is not None and t - last_t > max_gap:
                # they came while the agent was silent: dated to the silence
                at, detail["silence"] = last_t, [last_t, t]
            out.events.append(Event(serial, at, t, "xid", f"xid:{series.code}", detail))
