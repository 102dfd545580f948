"""Report windows: parse --from/--to, --month and --last into a half-open [start, end) in unix
seconds. A date or month boundary is midnight in the chosen zone (DST-correct via zoneinfo)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from gpuquota.cli_common import durations


class PeriodError(ValueError):
    """A period that cannot be parsed, or is empty or inverted."""


@dataclass(frozen=True)
class Period:
    start: int  # unix seconds, inclusive
    end: int  # unix seconds, exclusive
    tz: tzinfo

    @property
    def seconds(self) -> int:
        return self.end - self.start

    def label(self) -> str:
        """Human-readable window in the report's zone."""
        a = datetime.fromtimestamp(self.start, self.tz).isoformat()
        b = datetime.fromtimestamp(self.end, self.tz).isoformat()
        return f"[{a}, {b})"


LAST_INSTANT = 253370764800  # 9999-01-01T00:00:00Z: every later date breaks calendar arithmetic
_MONTH = re.compile(r"^(\d{4})-(\d{2})$")


def parse_zone(name: str) -> tzinfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise PeriodError(f"--tz: unknown time zone {name!r}") from exc


def midnight(day: date, tz: tzinfo) -> int:
    """Unix seconds of the first instant of ``day`` in ``tz``.

    Where a DST change skips midnight, zoneinfo maps the missing wall time forward, which is
    the first instant of that day."""
    return int(datetime(day.year, day.month, day.day, tzinfo=tz).timestamp())


def _wall_time(moment: datetime, tz: tzinfo, text: str, option: str) -> datetime:
    """A local time in ``tz`` that names exactly one instant: one that a DST change skips
    (02:30 on the morning clocks go forward) or repeats (02:30 when they go back) is refused
    with the offsets to choose from, never moved silently."""
    early, late = moment.replace(tzinfo=tz, fold=0), moment.replace(tzinfo=tz, fold=1)
    if early.utcoffset() == late.utcoffset():
        return early
    naive = moment.replace(tzinfo=None)
    # a wall time that exists reads back as itself through UTC; a skipped one does not
    back = early.astimezone(UTC).astimezone(tz).replace(tzinfo=None)
    if back != naive:
        real = early.astimezone(UTC).astimezone(tz).isoformat()
        raise PeriodError(
            f"{option}: {text!r} does not exist in {tz} (the clocks skip it); give an offset, "
            f"e.g. {real}"
        )
    raise PeriodError(
        f"{option}: {text!r} happens twice in {tz} (the clocks go back); give its offset: "
        f"{early.isoformat()} or {late.isoformat()}"
    )


def parse_instant(text: str, tz: tzinfo, option: str) -> int:
    """A date (midnight in ``tz``) or an RFC 3339 / ISO 8601 timestamp (no offset: ``tz``)."""
    value = text.strip()
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
        try:
            return midnight(date.fromisoformat(value), tz)
        except ValueError as exc:
            raise PeriodError(f"{option}: invalid date {text!r}: {exc}") from exc
    try:
        moment = datetime.fromisoformat(value.replace("z", "Z"))
    except ValueError as exc:
        raise PeriodError(
            f"{option}: {text!r} is neither a date (2026-10-01) nor an RFC 3339 time "
            "(2026-10-01T00:00:00Z)"
        ) from exc
    if moment.tzinfo is None:
        moment = _wall_time(moment, tz, text, option)
    try:
        return int(moment.timestamp())
    except (OverflowError, ValueError, OSError) as exc:
        raise PeriodError(f"{option}: {text!r} is out of range") from exc


def parse_duration(text: str) -> int:
    """``--last``: the shared duration grammar (gpuquota/cli_common/durations.py), whole seconds."""
    try:
        seconds = durations.parse_duration(text, minimum=1)
    except ValueError as exc:
        raise PeriodError(f"--last: {exc}") from None
    return int(seconds)


def month_window(text: str, tz: tzinfo) -> tuple[int, int]:
    match = _MONTH.match(text.strip())
    if not match or not 1 <= int(match.group(2)) <= 12:
        raise PeriodError(f"--month: {text!r} is not a month like 2026-10")
    year, month = int(match.group(1)), int(match.group(2))
    if not 1970 <= year < 9999:
        raise PeriodError(f"--month: {text!r} is outside the years 1970 to 9998")
    following = date(year + 1, 1, 1) if month == 12 else date(year, month + 1, 1)
    return midnight(date(year, month, 1), tz), midnight(following, tz)


def resolve(
    *,
    now: int,
    tz_name: str = "UTC",
    start: str | None = None,
    end: str | None = None,
    month: str | None = None,
    last: str | float | None = None,
) -> Period:
    """Resolve the period options; with none given, the current month up to now."""
    tz = parse_zone(tz_name)
    chosen = [name for name, v in (("--month", month), ("--last", last)) if v is not None]
    if start is not None or end is not None:
        chosen.append("--from/--to")
    if len(chosen) > 1:
        raise PeriodError(f"choose one way to give the period, not {' and '.join(chosen)}")
    if month is not None:
        if month.strip() == "previous":  # the last whole month: what a monthly job bills
            first = datetime.fromtimestamp(now, tz).date().replace(day=1)
            month = (first - timedelta(days=1)).strftime("%Y-%m")
        lo, hi = month_window(month, tz)
    elif last is not None:
        seconds = parse_duration(last) if isinstance(last, str) else int(last)
        lo, hi = now - seconds, now
    elif start is not None or end is not None:
        hi = parse_instant(end, tz, "--to") if end is not None else now
        if start is None:
            raise PeriodError("--to needs --from")
        lo = parse_instant(start, tz, "--from")
    else:
        today = datetime.fromtimestamp(now, tz).date()
        lo, hi = midnight(today.replace(day=1), tz), now
    if lo < 0 or hi > LAST_INSTANT:
        raise PeriodError("the period must lie between 1970 and 9998")
    if hi < lo:
        raise PeriodError(
            f"the period is inverted: its end comes before its start {_span(lo, hi, tz)}"
        )
    if hi == lo:
        raise PeriodError(f"the period is empty {_span(lo, hi, tz)}")
    return Period(lo, hi, tz)


def _span(lo: int, hi: int, tz: tzinfo) -> str:
    return f"({datetime.fromtimestamp(lo, tz).isoformat()} .. {datetime.fromtimestamp(hi, tz).isoformat()})"


def days(period: Period) -> list[int]:
    """Boundaries of the calendar days (midnight in the report's zone) covering the period:
    first is period.start, last is period.end (the FOCUS export's charge periods)."""
    edges: list[int] = [period.start]
    day = datetime.fromtimestamp(period.start, period.tz).date() + timedelta(days=1)
    while (t := midnight(day, period.tz)) < period.end:
        edges.append(t)
        day += timedelta(days=1)
    return [*edges, period.end]


def buckets(period: Period, max_buckets: int = 62) -> list[int]:
    """Boundaries of calendar buckets (hour, day, week or month in the report's zone) covering
    the period, for the chart: first is period.start, last is period.end."""
    span = period.seconds
    tz = period.tz
    first = datetime.fromtimestamp(period.start, tz)
    edges: list[int] = [period.start]
    if span <= 2 * 86400:
        step = 3600
        cursor = period.start - period.start % step + step
        while cursor < period.end:
            edges.append(cursor)
            cursor += step
    elif span <= max_buckets * 86400:
        day = first.date() + timedelta(days=1)
        while (t := midnight(day, tz)) < period.end:
            edges.append(t)
            day += timedelta(days=1)
    elif span <= 26 * 7 * 86400:
        day = first.date() + timedelta(days=7 - first.weekday())
        while (t := midnight(day, tz)) < period.end:
            edges.append(t)
            day += timedelta(days=7)
    else:
        y, m = first.year, first.month
        while True:
            y, m = (y + 1, 1) if m == 12 else (y, m + 1)
            t = midnight(date(y, m, 1), tz)
            if t >= period.end:
                break
            edges.append(t)
    edges.append(period.end)
    return edges
