"""The fleet history's pure rules for XID counters across silences and restarts, and quiet
runs (quota/fleet/rules.py), without I/O."""

from __future__ import annotations

from typing import Any

from gpuquota.quota.fleet.rules import Identity, Prior, Reading, XidSeries, window_history

N1 = Identity("GPU-1", "n1", "0000:18:00.0", "H100")
STARTED = 1_000.0


def reading(t: int, started: float | None = STARTED, **kw: Any) -> Reading:
    return Reading(t=t, serial="S", identity=N1, state="healthy", since=50, started=started, **kw)


def xid_events(
    readings: list[Reading], samples: tuple[tuple[int, float], ...], prior: Prior
) -> list[tuple[int, int, int, Any]]:
    got = window_history(readings, [XidSeries("GPU-1", "n1", "79", samples)], {"S": prior}, 600, 900, 60)  # fmt: skip
    return [(e.at, e.seen, e.detail["count"], e.detail.get("silence")) for e in got.events if e.kind == "xid"]  # fmt: skip


def silent_since(at: int, xids: dict[str, float] | None, started: float | None) -> Prior:
    """A board last observed at ``at`` with these XID counters and start time then."""
    return Prior(verdict=("healthy", ()), lost=False, identity=N1, last_observed=at, xids_then=xids, started_then=started)  # fmt: skip


def test_a_counter_across_a_long_silence_counts_its_increase_or_its_whole_after_a_restart() -> None:
    back = [reading(t) for t in range(600, 700, 15)]
    samples = tuple((r.t, 3.0) for r in back)
    # the same start time: it went on counting (2 -> 3)
    assert xid_events(back, samples, silent_since(100, {"79": 2.0}, STARTED)) == [(100, 600, 1, [100, 600])]  # fmt: skip
    # a new start time: restarted, from zero (all 3 are new)
    restarted = [reading(t, started=STARTED + 400) for t in range(600, 700, 15)]
    assert xid_events(restarted, samples, silent_since(100, {"79": 2.0}, STARTED)) == [(100, 600, 3, [100, 600])]  # fmt: skip
    # the series was not there before the silence: born during it
    assert xid_events(back, samples, silent_since(100, {}, STARTED)) == [(100, 600, 3, [100, 600])]  # fmt: skip
    # nothing known before (the store no longer held the reading): a baseline
    assert xid_events(back, samples, silent_since(100, None, None)) == []
    # an agent that does not say its start time: a value under the one before is a restart
    unsaid = [reading(t, started=None) for t in range(600, 700, 15)]
    ones = tuple((r.t, 1.0) for r in unsaid)
    assert xid_events(unsaid, ones, silent_since(100, {"79": 2.0}, None)) == [(100, 600, 1, [100, 600])]  # fmt: skip


def test_a_restart_within_the_fetch_is_told_by_the_start_time() -> None:
    before = [reading(t) for t in range(600, 690, 15)]
    after = [reading(t, started=STARTED + 700) for t in range(690, 800, 15)]
    samples = tuple((r.t, 2.0) for r in before) + tuple((r.t, 2.0) for r in after)
    # the counter is 2 again after the restart: two new XIDs, not none
    assert xid_events(before + after, samples, Prior()) == [(690, 690, 2, None)]


def test_a_quiet_run_covers_the_window_without_events() -> None:
    prior = {"S": Prior(verdict=("unhealthy", ()), lost=False, identity=N1, last_observed=600)}
    quiet = Reading(t=599, serial="S", identity=N1, state="healthy", until=900)
    got = window_history([quiet], [], prior, 600, 900, 60)
    assert [(s.start, s.end, s.state) for s in got.stretches] == [(600, 900, "healthy")]
    assert got.events == [] and got.first_seen == {}
    # a reading after the run, within max_gap of its end, continues its stretch
    later = window_history([quiet, reading(950)], [], prior, 600, 1000, 60)
    assert [(s.start, s.end) for s in later.stretches] == [(600, 950)]


def test_busy_gpus_are_asked_in_queries_victoria_metrics_takes() -> None:
    """VictoriaMetrics refuses a query over 16 KB (-search.maxQueryLen): the busy GPUs'
    UUIDs are split so that the longest query, the count of every metric, stays under it
    (10,000 GPUs with 180 busy once asked 78 KB)."""
    from gpuquota.quota import prompieces
    from gpuquota.quota.fleet import changes, source

    uuids = [f"GPU-{i:08x}-1a2b-3c4d-5e6f-0123456789ab" for i in range(1000)]
    regexes = list(changes.regexes(uuids, source.QUERY_BYTES // (len(source.GPU_METRICS) + 1)))
    assert len(regexes) > 1 and "|".join(regexes).split("|") == uuids
    for regex in regexes:
        query = prompieces.count_query(source.GPU_METRICS, 0, 420, f',uuid=~"{regex}"')
        assert len(query) < 16_384


def test_an_agent_that_begins_to_say_its_start_time_was_restarted() -> None:
    """Before the silence the agent did not say its start time, after it does: a new
    agent (an upgrade), whose counter began from zero, even at a value above the one before."""
    back = [reading(t) for t in range(600, 700, 15)]
    samples = tuple((r.t, 3.0) for r in back)
    assert xid_events(back, samples, silent_since(100, {"79": 2.0}, None)) == [(100, 600, 3, [100, 600])]  # fmt: skip
