"""Period parsing: dates, RFC 3339, months, --last, time zones and DST, bad periods."""

from __future__ import annotations

import itertools
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from gpuquota.quota.report.period import PeriodError, buckets, resolve
from tests.report.conftest import ts

NOW = ts("2026-11-22T07:30:00+00:00")


def test_month_in_utc_is_midnight_to_midnight() -> None:
    p = resolve(now=NOW, month="2026-10")
    assert (p.start, p.end) == (ts("2026-10-01T00:00:00"), ts("2026-11-01T00:00:00"))


def test_december_rolls_into_next_year() -> None:
    p = resolve(now=NOW, month="2026-12")
    assert p.end == ts("2027-01-01T00:00:00")


def test_month_in_berlin_follows_dst() -> None:
    # October 2026 in Berlin: CEST (+2) at the start, CET (+1) after 25 October
    p = resolve(now=NOW, month="2026-10", tz_name="Europe/Berlin")
    assert p.start == ts("2026-09-30T22:00:00")
    assert p.end == ts("2026-10-31T23:00:00")
    assert p.seconds == 31 * 86400 + 3600
    march = resolve(now=NOW, month="2026-03", tz_name="Europe/Berlin")
    assert march.seconds == 31 * 86400 - 3600


def test_from_to_dates_and_rfc3339() -> None:
    p = resolve(now=NOW, start="2026-10-01", end="2026-10-02T12:00:00Z")
    assert (p.start, p.end) == (ts("2026-10-01T00:00:00"), ts("2026-10-02T12:00:00"))
    q = resolve(
        now=NOW, start="2026-10-01T00:00:00+05:30", end="2026-10-01T06:00", tz_name="Asia/Tokyo"
    )
    assert q.start == ts("2026-09-30T18:30:00")
    assert q.end == ts("2026-09-30T21:00:00")  # no offset: taken in --tz (+9)


def test_from_alone_runs_to_now() -> None:
    p = resolve(now=NOW, start="2026-11-01")
    assert p.end == NOW


def test_last_is_relative_to_now() -> None:
    assert resolve(now=NOW, last="7d").start == NOW - 7 * 86400
    assert resolve(now=NOW, last="12h").start == NOW - 12 * 3600
    assert resolve(now=NOW, last="2w").start == NOW - 14 * 86400


def test_default_is_this_month_so_far_in_zone() -> None:
    p = resolve(now=NOW, tz_name="America/New_York")
    assert p.start == ts("2026-11-01T00:00:00-04:00")  # EDT until 1 November 2026, 02:00
    assert p.end == NOW


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"start": "2026-10-02", "end": "2026-10-01"}, "inverted"),
        ({"start": "2026-10-01", "end": "2026-10-01"}, "empty"),
        ({"month": "2026-13"}, "--month"),
        ({"month": "October"}, "--month"),
        ({"last": "0d"}, "--last"),
        ({"last": "7 days"}, "--last"),
        ({"start": "yesterday"}, "--from"),
        ({"start": "2026-02-30"}, "--from"),
        ({"end": "2026-10-01"}, "--to needs --from"),
        ({"month": "2026-10", "last": "7d"}, "choose one"),
        ({"month": "2026-10", "tz_name": "Mars/Olympus"}, "--tz"),
        # issue 18 (fail on 6c36c52, which moved the first to 03:30 silently and took one of
        # the two instants of the second)
        (
            {"start": "2026-03-29T02:30:00", "tz_name": "Europe/Berlin"},
            r"--from: '2026-03-29T02:30:00' does not exist in Europe/Berlin .*"
            r"e\.g\. 2026-03-29T03:30:00\+02:00",
        ),
        (
            {"start": "2026-10-01", "end": "2026-10-25T02:30:00", "tz_name": "Europe/Berlin"},
            r"--to: .* happens twice in Europe/Berlin .*\+02:00 or .*\+01:00",
        ),
    ],
)
def test_bad_periods_are_refused(kwargs: dict[str, str], message: str) -> None:
    """Each refusal is one line naming the option."""
    with pytest.raises(PeriodError, match=message):
        resolve(now=NOW, **kwargs)


def test_chart_buckets_are_local_midnights_across_dst() -> None:
    p = resolve(now=NOW, month="2026-10", tz_name="Europe/Berlin")
    edges = buckets(p)
    assert len(edges) == 32
    berlin = ZoneInfo("Europe/Berlin")
    for edge in edges:
        local = datetime.fromtimestamp(edge, berlin)
        assert (local.hour, local.minute) == (0, 0)
    assert edges[25] - edges[24] == 25 * 3600  # 25 October has 25 hours


def test_chart_buckets_hourly_weekly_monthly() -> None:
    day = resolve(now=NOW, start="2026-10-01", end="2026-10-02")
    assert len(buckets(day)) == 25
    year = resolve(now=NOW, start="2026-01-01", end="2027-01-01")
    assert len(buckets(year)) == 13
    quarter = resolve(now=NOW, start="2026-01-05", end="2026-04-06")
    edges = buckets(quarter)
    assert all(b - a == 7 * 86400 for a, b in itertools.pairwise(edges))
