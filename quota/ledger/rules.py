"""The usage ledger's rules, without I/O: windows, counter increases, coverage, idle allocations.

Windows are aligned to multiples of ``window`` seconds since the epoch and half-open
[start, start + window). A window is ingested once it closed at least ``delay`` seconds ago;
when a new window closes, the windows that closed within ``lookback`` before it are ingested
again, in order (late samples), and after downtime at most ``backfill`` seconds of windows are
caught up. A series' used and energy in a window are the increase of its counters over the
window's samples from a baseline: the series' stored end value of its previous window (however
old), else, for a series whose earlier windows were never ingested (the ledger was off, or
beyond the back-fill), the sample just before the window, else 0 (the series is new). A value
below the previous one is a counter reset and counts from 0, as Prometheus' increase() does;
nothing is extrapolated. ``sampled_seconds`` is the time between consecutive samples no further
apart than ``max_gap``, clipped to the window.

Once no window of a day can be ingested again (it closed more than ``lookback`` ago) and
the day ended ``rollup_after`` ago, each series' rows of the day are rolled up: a run of
adjacent windows becomes one row with their sums and the last one's counter values, so a
month of the ledger keeps about one row per holder, device and day instead of one per hour.
Days are those of the billing time zone (``--ledger-rollup-tz``, UTC by default): a report
in that zone finds every day's rows whole, so no rolled row is prorated by time.
"""

from __future__ import annotations

import operator
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from functools import lru_cache, partial
from zoneinfo import ZoneInfo

# the labels that say which holder of which device a series is about
HOLDER_KINDS = ("pod", "claim", "unallocated")


def align(t: float, window: int) -> int:
    """The start of the window that holds ``t``."""
    return int(t // window) * window


def plan(
    ingested_until: int | None,
    now: float,
    *,
    window: int,
    delay: int,
    lookback: int,
    backfill: int,
    rolled_until: int | None = None,
) -> list[int]:
    """Starts of the windows to (re)ingest now, oldest first: none until a new window has
    closed ``delay`` ago; then the windows after ``ingested_until`` and those that closed in the
    ``lookback`` before, never older than ``backfill`` before the last closed window's end nor
    than ``rolled_until`` (rolled-up days are final: their windows are no longer rows of their
    own). ``ingested_until`` None (never ingested): the ``backfill`` last windows."""
    last_end = align(now - delay, window)
    if ingested_until is not None and ingested_until >= last_end:
        return []
    floor = last_end - max(backfill, window)
    first = floor if ingested_until is None else min(ingested_until, last_end) - lookback
    first = max(align(first, window), align(floor, window), rolled_until or first)
    return list(range(first, last_end, window))


@dataclass(frozen=True)
class Usage:
    """What one series used in one window (a row of usage_windows)."""

    used_gpu_seconds: float
    energy_joules: float
    sampled_seconds: float
    end_used: float | None
    end_energy: float | None


Samples = Sequence[tuple[float, float]]  # (unix seconds, counter value), in time order
_time, _value = operator.itemgetter(0), operator.itemgetter(1)


def _span(samples: Samples, start: int, end: int) -> tuple[int, int]:
    """Indexes [lo, hi) of the samples in [start, end) (samples in time order)."""
    return bisect_left(samples, start, key=_time), bisect_left(samples, end, key=_time)


def has_samples(samples: Samples, start: int, end: int) -> bool:
    """Whether any sample lies in [start, end)."""
    lo, hi = _span(samples, start, end)
    return hi > lo


def increase(samples: Samples, start: int, end: int, baseline: float | None) -> tuple[float, float]:
    """(increase, last value) of a counter over its samples in [start, end): from ``baseline``
    (else the last sample before ``start``, else 0); a drop is a reset and counts from 0.
    Callers check that the window has samples."""
    lo, hi = _span(samples, start, end)
    if hi <= lo:
        return 0.0, 0.0
    prev = baseline if baseline is not None or lo == 0 else samples[lo - 1][1]
    values = list(map(_value, samples[lo:hi]))
    first, last = values[0], values[-1]
    total = first - (0.0 if prev is None or first < prev else prev)
    # a window's samples are thousands: the sums run in C; resets (drops) are rare
    if any(map(operator.lt, values[1:], values)):
        total += sum(map(_step, values, values[1:]))
    else:
        total += last - first
    return total, last


def _step(prev: float, value: float) -> float:
    """A counter's increase from one sample to the next: a drop is a reset, counted from 0."""
    return value if value < prev else value - prev


def sampled_seconds(times: Sequence[float], start: int, end: int, max_gap: float) -> float:
    """Seconds of [start, end) between consecutive samples at most ``max_gap`` apart."""
    # the pairs that overlap the window: from the last time at or before start to the first
    # at or after end; the sums run in C (a window has thousands of samples)
    lo = max(0, bisect_right(times, start) - 1)
    hi = bisect_left(times, end) + 1
    part = times[lo:hi]
    gaps = list(map(operator.sub, part[1:], part))
    covered = float(sum(filter(partial(operator.ge, max_gap), gaps)))
    if gaps and part[0] < start and gaps[0] <= max_gap:
        covered -= start - part[0]  # the first pair reaches back before the window
    if gaps and part[-1] > end and gaps[-1] <= max_gap:
        covered -= part[-1] - end  # the last pair reaches past it
    return covered


def window_usage(
    used: Samples,
    energy: Samples,
    start: int,
    window: int,
    *,
    base_used: float | None,
    base_energy: float | None,
    max_gap: float,
    energy_only: bool = False,
    held_until: int | None = None,
) -> Usage | None:
    """One series' row for the window [start, start + window), None when neither counter has a
    sample in it. Samples may reach ``max_gap`` either side of the window (for coverage).
    Coverage comes from the used counter's samples; only a series that has nothing but energy
    (``energy_only``: unallocated energy) takes the energy counter's. A holder's used counter
    is absent while its agent cannot measure it: that time is not covered, whatever energy
    was counted meanwhile. ``held_until``: the end of the holder's allocation, where it has
    ended: coverage stops there (a finished holder's last values stay published for the
    agent's retention, 10 minutes, and would otherwise count as covered time it did not
    hold)."""
    end = start + window
    has_used, has_energy = has_samples(used, start, end), has_samples(energy, start, end)
    if not has_used and not has_energy:
        return None
    used_inc, end_used = increase(used, start, end, base_used) if has_used else (0.0, base_used)
    energy_inc, end_energy = (
        increase(energy, start, end, base_energy) if has_energy else (0.0, base_energy)
    )
    times = list(map(_time, energy if energy_only else used))
    covered_until = end if held_until is None else max(start, min(end, held_until))
    return Usage(
        used_inc,
        energy_inc,
        sampled_seconds(times, start, covered_until, max_gap) if covered_until > start else 0.0,
        end_used,
        end_energy,
    )


def stored(holder_kind: str, usage: Usage | None) -> bool:
    """Whether a window's figures become a row. Every holder's window with samples does (a
    sampled idle hour is data, not its absence), but the unallocated energy of a GPU that
    someone held for the whole window (no increase) does not: on a busy cluster that is most
    GPUs every hour, and the next row's baseline comes out the same without it."""
    if usage is None:
        return False
    return holder_kind != "unallocated" or usage.energy_joules != 0 or usage.used_gpu_seconds != 0


# ---------------------------------------------------------------------------------------------
# Roll-up

DAY = 86400
UTC = "UTC"


@lru_cache(maxsize=8)
def _zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


def _midnight(day: date, zone: str) -> int:
    """The first instant of ``day`` in ``zone`` (a midnight that a DST change skips maps
    forward: the first instant of that day)."""
    return int(datetime(day.year, day.month, day.day, tzinfo=_zone(zone)).timestamp())


def day_start(t: int, zone: str = UTC) -> int:
    """The start of the day of ``zone`` that holds ``t``."""
    if zone == UTC:
        return align(t, DAY)
    start = _midnight(datetime.fromtimestamp(t, _zone(zone)).date(), zone)
    return min(start, t)


def next_day(t: int, zone: str = UTC) -> int:
    """The start of the day of ``zone`` after the one that holds ``t``."""
    if zone == UTC:
        return align(t, DAY) + DAY
    return _midnight(datetime.fromtimestamp(t, _zone(zone)).date() + timedelta(days=1), zone)


def check_zone(zone: str, window: int, now: float) -> str | None:
    """What makes ``zone`` unusable for the roll-up with ``window``, None when nothing: an
    unknown name, or a midnight (over the two years from ``now``) that is not a window edge
    (a row cannot be cut, and a window across midnight would be prorated again)."""
    try:
        _zone(zone)
    except (ValueError, OSError, KeyError) as exc:
        return f"--ledger-rollup-tz: unknown time zone {zone!r} ({type(exc).__name__})"
    t = day_start(int(now), zone)
    for _ in range(2 * 366):
        if t % window:
            offset = datetime.fromtimestamp(t, _zone(zone)).strftime("%z")
            return (
                f"--ledger-rollup-tz: midnight in {zone} (UTC{offset}) is not a multiple of "
                f"--ledger-window ({window}s) after the epoch: use a window that divides the "
                "zone's offsets (e.g. 15m or 30m)"
            )
        t = next_day(t, zone)
    return None


@dataclass(frozen=True)
class WindowRow:
    """One stored row of a series: [window_start, window_start + window_seconds)."""

    window_start: int
    window_seconds: int
    usage: Usage

    @property
    def window_end(self) -> int:
        return self.window_start + self.window_seconds


def rollup_days(
    ingested_until: int,
    rolled_until: int | None,
    first_row: int | None,
    *,
    window: int,
    lookback: int,
    rollup_after: int | None,
    zone: str = UTC,
) -> list[int]:
    """Starts of the days of ``zone`` to roll up now, oldest first (each ends at its
    ``next_day``): from ``rolled_until`` (else the day of the oldest row, ``first_row``) to the
    last day that ended ``rollup_after`` ago and whose windows can no longer be ingested again
    (the look-back before ``ingested_until``). A ``rolled_until`` inside a day (the zone was
    changed) starts a part day that ends at the day's end. ``rollup_after`` None: never."""
    if rollup_after is None:
        return []
    final = align(ingested_until - lookback, window)
    last_end = day_start(min(final, ingested_until - rollup_after), zone)
    start = rolled_until if rolled_until is not None else first_row
    if start is None:
        return []
    days = []
    day = start if rolled_until is not None else day_start(start, zone)
    while day < last_end:
        days.append(day)
        day = next_day(day, zone)
    return days


def roll_up(
    rows: Sequence[WindowRow], *, across_gaps: bool = False, zone: str = UTC
) -> list[WindowRow]:
    """One series' rows, oldest first, rolled up: each run of adjacent rows (one ends where the
    next starts) inside one day of ``zone`` becomes one row spanning the run, with the sums of used,
    energy and sampled seconds and the run's last counter values (the next row's baseline, so
    ingestion after the day reads the same baseline as before). Rows apart stay apart: a gap
    keeps its meaning (no data) for coverage, idle allocations and the baselines. Except
    ``across_gaps``: a series whose missing windows mean no increase (a GPU's unallocated
    energy: ``stored``) has one row per day."""
    out: list[WindowRow] = []
    for row in rows:
        last = out[-1] if out else None
        if (
            last is None
            or (last.window_end != row.window_start and not across_gaps)
            or day_start(last.window_start, zone) != day_start(row.window_start, zone)
        ):
            out.append(row)
            continue
        a, b = last.usage, row.usage
        out[-1] = WindowRow(
            last.window_start,
            row.window_end - last.window_start,
            Usage(
                a.used_gpu_seconds + b.used_gpu_seconds,
                a.energy_joules + b.energy_joules,
                a.sampled_seconds + b.sampled_seconds,
                b.end_used,
                b.end_energy,
            ),
        )
    return out


# ---------------------------------------------------------------------------------------------
# Idle allocations


@dataclass(frozen=True)
class OpenHolder:
    """An open allocation (a pod's, or a DRA claim's): who holds how many physical GPUs."""

    holder_uid: str
    namespace: str
    name: str
    physical_gpus: float
    started_at: int
    kind: str = "pod"  # pod | claim


@dataclass(frozen=True)
class HolderWindow:
    """A holder's usage in one window, over all its devices: used physical GPU-seconds and the
    seconds of the window that had samples (the most of any of its devices)."""

    window_start: int
    window_seconds: int
    used_gpu_seconds: float
    sampled_seconds: float


@dataclass(frozen=True)
class Idle:
    """An open allocation idle since ``since``: its GPUs and idle GPU-seconds since then."""

    namespace: str
    name: str
    holder_uid: str
    physical_gpus: float
    since: int
    idle_gpu_seconds: float
    kind: str = "pod"


def activity(used_gpu_seconds: float, sampled_seconds: float, physical_gpus: float) -> float | None:
    """A holder's activity in a window: used physical GPU-seconds / (the seconds with samples x
    the physical GPUs it holds); None without samples (no data is not idle). The one rule of
    the idle allocations, for the controller's metrics and the report's view alike."""
    if sampled_seconds <= 0 or physical_gpus <= 0:
        return None
    return used_gpu_seconds / (sampled_seconds * physical_gpus)


def idle_allocations(
    holders: Iterable[OpenHolder],
    windows: Mapping[str, Sequence[HolderWindow]],
    *,
    ingested_until: int,
    threshold: float,
    idle_for: int,
) -> list[Idle]:
    """Open allocations whose activity, used / (sampled x physical GPUs), stayed under
    ``threshold`` in every ingested window of the last ``idle_for`` seconds or more, up to
    ``ingested_until``: consecutive windows, each with samples (no data is not idle). Idle
    GPU-seconds: allocated minus used over the idle run."""
    out: list[Idle] = []
    for holder in holders:
        if holder.physical_gpus <= 0:
            continue
        by_end = {w.window_start + w.window_seconds: w for w in windows.get(holder.holder_uid, ())}
        since: int | None = None
        idle_seconds = 0.0
        cursor = ingested_until
        while True:
            w = by_end.get(cursor)
            if w is None:
                break
            found = activity(w.used_gpu_seconds, w.sampled_seconds, holder.physical_gpus)
            if found is None or found >= threshold:
                break
            begin = max(w.window_start, holder.started_at)
            held = max(0, cursor - begin) * holder.physical_gpus
            idle_seconds += max(0.0, held - w.used_gpu_seconds)
            since = begin
            if w.window_start <= holder.started_at:
                break
            cursor = w.window_start
        if since is not None and ingested_until - since >= idle_for:
            out.append(
                Idle(
                    holder.namespace,
                    holder.name,
                    holder.holder_uid,
                    holder.physical_gpus,
                    since,
                    idle_seconds,
                    holder.kind,
                )
            )
    return sorted(out, key=lambda i: (i.namespace, i.name, i.holder_uid))
