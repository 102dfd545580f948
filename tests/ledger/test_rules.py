"""The ledger's pure rules: which windows are due, increases over resets, coverage, idle."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuquota.quota.ledger import rules
from gpuquota.quota.ledger.ingest import LedgerSettings, check

H = 3600


def plan(until: int | None, now: float, **kw: int) -> list[int]:
    args = {"window": H, "delay": 300, "lookback": 0, "backfill": 24 * H} | kw
    return rules.plan(until, now, **args)


def test_align() -> None:
    assert rules.align(7199.9, H) == H
    assert rules.align(7200, H) == 2 * H


def test_plan() -> None:
    # a window is due once it closed --ledger-delay ago
    assert plan(10 * H, 11 * H + 299) == []
    assert plan(10 * H, 11 * H + 300) == [10 * H]
    # nothing new closed: nothing, not even the look-back
    assert plan(11 * H, 11 * H + 3000, lookback=2 * H) == []
    # a new window closed: the look-back's windows again, in order, then the new one
    assert plan(11 * H, 12 * H + 300, lookback=2 * H) == [9 * H, 10 * H, 11 * H]
    # downtime: everything missed, back to the back-fill limit only
    assert plan(10 * H, 20 * H + 300, backfill=3 * H) == [17 * H, 18 * H, 19 * H]
    assert plan(10 * H, 20 * H + 300) == list(range(10 * H, 20 * H, H))
    # never ingested: the back-fill's windows
    assert plan(None, 20 * H + 300, backfill=2 * H) == [18 * H, 19 * H]
    # rolled-up windows are final: never again, whatever the look-back or back-fill
    assert plan(11 * H, 12 * H + 300, lookback=5 * H, rolled_until=10 * H) == [10 * H, 11 * H]
    assert plan(None, 20 * H + 300, rolled_until=19 * H) == [19 * H]


DAY = rules.DAY


def row(
    start: int, seconds: int = H, used: float = 1.0, end: float | None = None
) -> rules.WindowRow:
    return rules.WindowRow(start, seconds, rules.Usage(used, 2 * used, seconds, end, end))


def test_roll_up_merges_adjacent_windows_of_a_day() -> None:
    day = 20 * DAY
    rows = [row(day - H, end=1), row(day, end=2), row(day + H, used=3, end=5)]
    rows += [row(day + 3 * H, end=None), row(day + 4 * H, seconds=H // 2, end=9)]
    got = rules.roll_up(rows)
    assert [(r.window_start, r.window_seconds) for r in got] == [
        (day - H, H),  # the day before stays apart, however adjacent
        (day, 2 * H),
        (day + 3 * H, H + H // 2),  # a gap (no row for day + 2h) starts a new run
    ]
    assert got[1].usage == rules.Usage(4.0, 8.0, 2 * H, 5, 5)  # sums; the last end values
    assert got[2].usage.end_used == 9 and got[2].usage.sampled_seconds == H + H // 2
    # the run's last row's end values, as they are (the next window's baseline reads them)
    assert rules.roll_up([row(day, end=4), row(day + H, end=None)])[0].usage.end_used is None
    assert rules.roll_up(got) == got  # rolling up again changes nothing
    # a series whose missing windows mean no increase (unallocated energy): a row per day
    whole = rules.roll_up(rows, across_gaps=True)
    assert [(r.window_start, r.window_seconds) for r in whole] == [
        (day - H, H),
        (day, 4 * H + H // 2),
    ]
    assert whole[1].usage.used_gpu_seconds == 6.0 and whole[1].usage.end_energy == 9
    assert rules.roll_up([]) == []


def test_rollup_days() -> None:
    def days(until: int, rolled: int | None, first: int | None, **kw: int | None) -> list[int]:
        args = {"window": H, "lookback": H, "rollup_after": 0} | kw
        return rules.rollup_days(until, rolled, first, **args)  # type: ignore[arg-type]

    # a day is rolled up once no window of it can be ingested again (the look-back)
    assert days(10 * DAY + H - 1, 9 * DAY, None) == []
    assert days(10 * DAY + H, 9 * DAY, None) == [9 * DAY]
    # ... and it ended --ledger-rollup-after ago
    assert days(10 * DAY + H, 9 * DAY, None, rollup_after=DAY) == []
    assert days(11 * DAY + H, 8 * DAY, None, rollup_after=DAY) == [8 * DAY, 9 * DAY]
    # never rolled up: from the day of the oldest row; no rows: nothing
    assert days(10 * DAY + H, None, 7 * DAY + 5 * H) == [7 * DAY, 8 * DAY, 9 * DAY]
    assert days(10 * DAY + H, None, None) == []
    assert days(10 * DAY + H, 9 * DAY, None, rollup_after=None) == []


def test_increase_from_baseline_over_resets_without_extrapolation() -> None:
    samples = [(90.0, 5.0), (100.0, 10.0), (115.0, 20.0), (130.0, 3.0), (145.0, 7.0), (200.0, 50.0)]
    # stored baseline 8: 2 + 10, reset: 3, then 4; the sample at the window's end is the next's
    assert rules.increase(samples, 100, 200, 8.0) == (19.0, 7.0)
    # no stored baseline: the sample before the window
    assert rules.increase(samples, 100, 200, None) == (22.0, 7.0)  # 5 + 10 + 3 + 4
    # a new series: from 0
    assert rules.increase(samples[1:], 100, 200, None) == (27.0, 7.0)


def test_sampled_seconds_clipped_and_gaps_left_out() -> None:
    times = [95.0, 110.0, 125.0, 300.0, 315.0, 410.0]
    # [100,110] + [110,125] + (gap 125->300) + [300,315] + (gap 315->410, though 410 is out)
    assert rules.sampled_seconds(times, 100, 400, max_gap=60) == 40
    assert rules.sampled_seconds(times, 100, 400, max_gap=200) == 300


def test_window_usage_none_without_samples_inside() -> None:
    assert (
        rules.window_usage(
            [(50.0, 1.0)], [], 100, 100, base_used=None, base_energy=None, max_gap=60
        )
        is None
    )


def test_a_holder_window_with_energy_but_no_used_samples_is_not_covered() -> None:
    """The agent leaves a holder's used counter out while it cannot measure its activity:
    the energy of that time counts, the time is not covered (never zero use, fully covered)."""
    energy = [(100.0, 10.0), (130.0, 40.0), (160.0, 70.0)]
    got = rules.window_usage([], energy, 100, 100, base_used=5.0, base_energy=10.0, max_gap=60)
    assert got is not None
    assert (got.used_gpu_seconds, got.energy_joules, got.sampled_seconds) == (0.0, 60.0, 0.0)
    unallocated = rules.window_usage(
        [], energy, 100, 100, base_used=None, base_energy=10.0, max_gap=60, energy_only=True
    )
    assert unallocated is not None and unallocated.sampled_seconds == 60.0


def w(start: int, used: float, sampled: float = H) -> rules.HolderWindow:
    return rules.HolderWindow(start, H, used, sampled)


def test_idle_allocations() -> None:
    holders = [
        rules.OpenHolder("busy", "a", "p-busy", 1.0, 0),
        rules.OpenHolder("idle", "a", "p-idle", 2.0, 0),
        rules.OpenHolder("short", "b", "p-short", 1.0, 0),
        rules.OpenHolder("nodata", "b", "p-nodata", 1.0, 0),
        rules.OpenHolder("young", "b", "p-young", 1.0, 4 * H + 1800),
    ]
    windows = {
        "busy": [w(3 * H, 0.5 * H), w(4 * H, 0.5 * H)],
        # 2 GPUs, 4 % of them in window 3, 1 % in 4; busy in 2
        "idle": [w(2 * H, 2 * H), w(3 * H, 0.04 * 2 * H), w(4 * H, 0.01 * 2 * H)],
        # idle only in the last window
        "short": [w(3 * H, H), w(4 * H, 0.0)],
        # idle, but window 3 had no samples: the run is window 4 alone
        "nodata": [w(3 * H, 0.0, 0.0), w(4 * H, 0.0)],
        "young": [w(4 * H, 0.0, 1800)],
    }
    got = rules.idle_allocations(
        holders, windows, ingested_until=5 * H, threshold=0.05, idle_for=2 * H
    )
    assert [(i.holder_uid, i.since, i.physical_gpus) for i in got] == [("idle", 3 * H, 2.0)]
    assert got[0].idle_gpu_seconds == pytest.approx(2 * 2 * H - 0.05 * 2 * H)
    got = rules.idle_allocations(holders, windows, ingested_until=5 * H, threshold=0.05, idle_for=H)
    assert [i.holder_uid for i in got] == ["idle", "nodata", "short"]  # young: half an hour


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"window": 7000}, "--ledger-window"),
        ({"delay": 10}, "--ledger-delay"),
        ({"lookback": 1800}, "--ledger-lookback"),
        ({"backfill": 60}, "--ledger-backfill"),
        ({"idle_threshold": 1.5}, "--idle-threshold"),
        ({"idle_for": 60}, "--idle-for"),
        ({"rollup_after": -1}, "--ledger-rollup-after"),
        ({"rollup_tz": "Mars/Olympus"}, "--ledger-rollup-tz: unknown time zone"),
        # India's midnight is at :30 UTC: not an hourly window's edge
        ({"rollup_tz": "Asia/Kolkata"}, "--ledger-rollup-tz: midnight in Asia/Kolkata"),
    ],
)
def test_settings_checked(change: dict[str, float], message: str) -> None:
    assert check(LedgerSettings("http://p:9090")) is None
    problem = check(LedgerSettings("http://p:9090", **change))  # type: ignore[arg-type]
    assert problem is not None and problem.startswith(message)


def test_days_of_a_zone_follow_its_clock_changes() -> None:
    """Berlin's days: 23 hours on the day clocks go forward, 25 when they go back; the
    roll-up's days of the zone and its merges follow them (UTC stays 24 h)."""
    zone = "Europe/Berlin"
    spring = 1774652400  # 2026-03-28T00:00+01:00 (Saturday)
    sunday = rules.next_day(spring, zone)
    assert sunday - spring == DAY and rules.next_day(sunday, zone) - sunday == DAY - H
    autumn = 1792879200  # 2026-10-25T00:00+02:00
    assert rules.next_day(autumn, zone) - autumn == DAY + H
    assert rules.day_start(autumn + DAY, zone) == autumn  # the 25th hour is the same day
    assert rules.day_start(sunday + 5 * H, zone) == sunday
    assert rules.rollup_days(
        sunday + 2 * DAY, None, spring + H, window=H, lookback=H, rollup_after=0, zone=zone
    ) == [spring, sunday, sunday + DAY - H]
    # a rolled_until inside a day of the zone (the zone was changed): the rest of that day
    assert rules.rollup_days(
        sunday + 2 * DAY, spring + 5 * H, None, window=H, lookback=H, rollup_after=0, zone=zone
    ) == [spring + 5 * H, sunday, sunday + DAY - H]
    rows = [row(autumn + DAY), row(autumn + DAY + H)]  # the 25th hour, then the next midnight
    assert [r.window_start for r in rules.roll_up(rows, zone=zone)] == [
        autumn + DAY,
        autumn + DAY + H,
    ]
    assert len(rules.roll_up(rows)) == 1  # both in one UTC day
    assert check(LedgerSettings("http://p:9090", rollup_tz="Asia/Kolkata", window=1800)) is None


def test_ledger_metrics_from_the_ingester_facts() -> None:
    from prometheus_client import generate_latest

    from gpuquota.quota.controller.metrics import ControllerMetrics
    from gpuquota.quota.ledger.ingest import LedgerFacts

    metrics = ControllerMetrics()
    assert "gpuquota_ledger" not in generate_latest(metrics.registry).decode()  # no ingester
    idle = rules.Idle("team-b", "p5", "u5", 2.0, 7200, 9000.0)
    facts = LedgerFacts(ingested_until=10800, windows=3, errors={"prometheus": 2}, idle=(idle,))
    metrics.ledger.read_from(lambda: facts)
    text = generate_latest(metrics.registry).decode()
    assert "gpuquota_ledger_ingested_until_timestamp_seconds 10800.0" in text
    assert "gpuquota_ledger_windows_ingested_total 3.0" in text
    assert 'gpuquota_ledger_errors_total{reason="prometheus"} 2.0' in text
    labels = '{kind="pod",name="p5",namespace="team-b"}'
    assert f"gpuquota_idle_allocation_gpus{labels} 2.0" in text
    assert f"gpuquota_idle_allocation_since_timestamp_seconds{labels} 7200.0" in text
    assert f"gpuquota_idle_allocation_idle_gpu_seconds{labels} 9000.0" in text


def test_device_shards_partition_every_uuid() -> None:
    """Each UUID falls in exactly one shard (Prometheus anchors its regular expressions)."""
    import re

    from gpuquota.quota import prompieces

    uuids = ["GPU-5a1b2c3d-0000-1111-2222-3344556677ff", "MIG-AB12", "GPU-1", "x", "GPU-0A"]
    uuids += [f"GPU-{i:08x}" for i in range(300)]
    for count in (4, 16, 64, 256):
        shards = prompieces.shards(count)
        assert len(shards) == count + 1
        for uuid in uuids:
            hits = 0
            for shard in shards:
                op, pattern = re.fullmatch(r',uuid(=~|!~)"(.*)"', shard).groups()  # type: ignore[union-attr]
                matched = re.fullmatch(pattern, uuid) is not None
                hits += matched if op == "=~" else not matched
            assert hits == 1, (count, uuid)


def test_two_prometheus_series_of_one_counter_are_one_ledger_series() -> None:
    """The activity label changed (a second pod joined a GPU: sm_active -> process_sm): the
    counter goes on in a new Prometheus series; the ledger merges both in time order."""
    from gpuquota.quota.ledger.source import group, settle
    from gpuquota.quota.promhttp import MatrixSeries

    def item(activity: str, values: list[tuple[float, float]]) -> MatrixSeries:
        labels = {"__name__": "gpu_pod_used_seconds_total", "uuid": "GPU-a", "pod_uid": "u"}
        return MatrixSeries({**labels, "activity": activity, "pod": "p", "namespace": "n"},
                            values)  # fmt: skip

    out = group(
        [
            item("process_sm", [(130.0, 12.0), (145.0, 15.0)]),
            item("sm_active", [(100.0, 5.0), (115.0, float("nan")), (116.0, 9.0)]),
        ]
    )
    (series,) = out.values()
    assert series.unsorted  # fetch_window settles such series
    assert series.activity == "process_sm"  # the labels of the newest sample
    settle(series, 60)  # what fetch_window does: the same samples, in time order
    assert series.used == [(100.0, 5.0), (116.0, 9.0), (130.0, 12.0), (145.0, 15.0)]


def test_two_agents_of_a_surge_rollout_are_followed_one_at_a_time() -> None:
    """During an agent's rollout with a surge (tools/real-cluster, docs/real-cluster.md) the old
    and the new agent both export the pod's counter, each its own process's, scraped in turn.
    Interleaved, every step back to the old agent's value was a counter reset counting its whole
    value again: a pod at 80 % came out at 122 % of its allocation on the real cluster. The
    ledger follows the old agent until the new one's first sample, then the new one."""
    from gpuquota.quota.ledger.source import group, settle
    from gpuquota.quota.promhttp import MatrixSeries

    def agent(ip: str, values: list[tuple[float, float]]) -> MatrixSeries:
        labels = {"__name__": "gpu_pod_used_seconds_total", "uuid": "GPU-a", "pod_uid": "u",
                  "pod": "gpu-a", "namespace": "ml", "activity": "sm_active"}  # fmt: skip
        return MatrixSeries({**labels, "instance": f"{ip}:9400"}, values)

    old = agent("10.244.0.6", [(100.0, 55.1), (115.0, 67.1), (130.0, 79.1), (145.0, 91.1)])
    new = agent("10.244.0.9", [(117.0, 1.6), (132.0, 13.6), (147.0, 25.6), (162.0, 37.6)])
    (series,) = group([old, new]).values()
    settle(series, 60)
    assert series.used == [(100.0, 55.1), (115.0, 67.1), (117.0, 1.6), (132.0, 13.6),
                           (147.0, 25.6), (162.0, 37.6)]  # fmt: skip
    used, last = rules.increase(series.used, 100, 160, 55.1)
    # 12 s of the old agent, then the new one's counter: 1.6 from 0 (its restart), 24 more; at
    # 80 % for the 47 s from 100 to 147 that is 37.6, and nothing near the old agent's 91.1
    assert used == pytest.approx(12.0 + 1.6 + 24.0) and last == 25.6


def test_a_window_beginning_during_a_surge_follows_the_new_agent_throughout() -> None:
    """The next window's samples begin before it, while both agents still ran; the new agent's
    first sample there may come before the old one's (the scrape order is anyone's). The ledger
    still follows the new agent, the one lasting longer, through the whole window: following
    the old one from its first sample on would lose every sample after its end."""
    from gpuquota.quota.ledger.source import group, settle
    from gpuquota.quota.promhttp import MatrixSeries

    def agent(ip: str, values: list[tuple[float, float]]) -> MatrixSeries:
        labels = {"__name__": "gpu_pod_used_seconds_total", "uuid": "GPU-a", "pod_uid": "u",
                  "pod": "gpu-a", "namespace": "ml", "activity": "sm_active"}  # fmt: skip
        return MatrixSeries({**labels, "instance": f"{ip}:9400"}, values)

    new = agent("10.244.0.9", [(float(t), 100.0 + t * 0.8) for t in range(0, 300, 15)])
    old = agent("10.244.0.6", [(float(t), 5000.0 + t * 0.8) for t in range(3, 40, 15)])
    for fetched in ([new, old], [old, new]):
        (series,) = group(fetched).values()
        settle(series, 60)
        assert series.used == new.values
        used, _ = rules.increase(series.used, 60, 240, 100.0 + 45 * 0.8)
        assert used == pytest.approx(180 * 0.8)


def test_a_window_both_agents_outlast_ends_on_the_new_agent() -> None:
    """A surge longer than the samples after a window: both agents are still there at its
    end, the old one scraped last. The window follows the old agent until the new one's first
    sample and the new one after it, so its end value (the next window's baseline) is the new
    agent's: ending on the old one's would make the next window read the new agent's first
    value as a reset and count it again."""
    from gpuquota.quota.ledger.source import group, settle
    from gpuquota.quota.promhttp import MatrixSeries

    def agent(ip: str, values: list[tuple[float, float]]) -> MatrixSeries:
        labels = {"__name__": "gpu_pod_used_seconds_total", "uuid": "GPU-a", "pod_uid": "u",
                  "pod": "gpu-a", "namespace": "ml", "activity": "sm_active"}  # fmt: skip
        return MatrixSeries({**labels, "instance": f"{ip}:9400"}, values)

    old = agent("10.244.0.6", [(float(t), 5000.0 + t) for t in range(5, 300, 15)])
    new = agent("10.244.0.9", [(float(t), t - 200.0) for t in range(201, 290, 15)])
    (series,) = group([old, new]).values()
    settle(series, 60)
    assert series.used[-1] == new.values[-1]
    assert [t for t, _ in series.used] == [t for t, _ in old.values if t < 201] + [
        t for t, _ in new.values
    ]


def _increase_step_by_step(
    samples: list[tuple[float, float]], start: int, end: int, baseline: float | None
) -> tuple[float, float]:
    """rules.increase's rule, one sample at a time (what the summed-in-C version must equal)."""
    prev, total, last = baseline, 0.0, 0.0
    for t, v in samples:
        if t < start:
            prev = v if baseline is None else prev
            continue
        if t >= end:
            break
        total += v - (0.0 if prev is None or v < prev else prev)
        prev, last = v, v
    return total, last


def _sampled_pair_by_pair(times: list[float], start: int, end: int, max_gap: float) -> float:
    covered = 0.0
    for a, b in itertools.pairwise(times):
        if b - a <= max_gap and b > start and a < end:
            covered += min(b, end) - max(a, start)
    return covered


@given(
    steps=st.lists(
        st.tuples(st.integers(1, 120), st.floats(-50, 100, allow_nan=False)), max_size=40
    ),
    first=st.integers(0, 400),
    baseline=st.none() | st.floats(0, 1000, allow_nan=False),
    max_gap=st.integers(1, 90),
)
def test_increase_and_coverage_equal_the_step_by_step_rule(
    steps: list[tuple[int, float]], first: int, baseline: float | None, max_gap: int
) -> None:
    samples, t, v = [], first, 0.0
    for dt, dv in steps:  # drops now and then: resets
        t, v = t + dt, max(0.0, v + dv)
        samples.append((float(t), v))
    start, end = 300, 900
    got, want = (
        rules.increase(samples, start, end, baseline),
        _increase_step_by_step(samples, start, end, baseline),
    )
    assert got == pytest.approx(want, abs=1e-6)
    times = [s[0] for s in samples]
    assert rules.sampled_seconds(times, start, end, max_gap) == pytest.approx(
        _sampled_pair_by_pair(times, start, end, max_gap)
    )
