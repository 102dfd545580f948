"""The fleet history's pure rules (quota/fleet/rules.py, summary.py) without I/O: stretches
and gaps, verdicts dated by the agent's second, XIDs through agent restarts, lost/returned,
recoveries and relapses, and rates over observed time only."""

from __future__ import annotations

import json

from gpuquota.quota.fleet.cost import fence_spans
from gpuquota.quota.fleet.rules import Identity, Prior, Reading, XidSeries, window_history
from gpuquota.quota.fleet.summary import BoardHistory, StoredEvent, StoredStretch, rates, summarize

N1 = Identity("GPU-1", "n1", "0000:18:00.0", "H100")


def reading(t: int, state: str = "healthy", since: int | None = None, **kw: object) -> Reading:
    return Reading(t=t, serial="S", identity=kw.pop("identity", N1), state=state,  # type: ignore[arg-type]
                   since=since, **kw)  # type: ignore[arg-type]  # fmt: skip


def test_stretches_cover_close_readings_and_a_long_silence_is_a_gap() -> None:
    got = window_history(
        [reading(t) for t in (90, 100, 110, 120, 200, 210)], [], {}, 100, 200, max_gap=15
    )
    assert [(s.start, s.end) for s in got.stretches] == [(100, 120)]
    assert [(e.kind, e.at, e.seen) for e in got.events if e.kind == "gap"] == []  # 200: next window
    later = window_history([reading(t) for t in (120, 200, 210)], [], {}, 200, 300, max_gap=15)
    assert [(e.at, e.seen) for e in later.events if e.kind == "gap"] == [(120, 200)]


def test_a_verdict_is_dated_by_the_agents_second_and_compared_with_the_stored_one() -> None:
    prior = {"S": Prior(verdict=("healthy", ()), identity=N1, lost=False)}
    pairs = (("xid_79", "reboot_node"),)
    got = window_history(
        [reading(100, "unhealthy", since=93, reasons=pairs), reading(110, "unhealthy", 93, reasons=pairs)],
        [], prior, 100, 200, max_gap=15,
    )  # fmt: skip
    (verdict,) = [e for e in got.events if e.kind == "verdict"]
    assert (verdict.at, verdict.seen) == (93, 100)
    assert verdict.detail["previous"] == "healthy" and verdict.detail["action"] == "reboot_node"
    assert not [e for e in got.events if e.kind in ("identity", "lost")]  # nothing else changed


def test_xids_count_through_an_agent_restart_and_a_baseline_is_not_counted() -> None:
    readings = [reading(t) for t in range(100, 200, 10)]
    xids = [
        XidSeries("GPU-1", "n1", "13", ((100, 5.0), (110, 5.0), (120, 6.0))),  # baseline 5, +1
        # XID 79 born at 130, the agent restarts at 150 (absent at 150, 160): 1 again at 170
        XidSeries("GPU-1", "n1", "79", ((130, 1.0), (140, 1.0), (170, 1.0))),
    ]
    got = window_history(readings, xids, {}, 100, 200, max_gap=15)
    assert [(e.at, e.detail["code"], e.detail["count"]) for e in got.events if e.kind == "xid"] == [
        (120, "13", 1), (130, "79", 1), (170, "79", 1)
    ]  # fmt: skip


def test_a_relapse_dated_at_or_before_its_release_is_still_a_relapse() -> None:
    """A release and the next fence in the same second, or the fence dated (by the agent's
    own second: an XID read late) before the release that the readings showed first: the
    order of the readings pairs them. Paired by seconds, the relapse was lost and the release
    read as still holding (demo act 6, once, under load)."""

    def verdict(at: int, seen: int, state: str, previous: str) -> StoredEvent:
        return StoredEvent(at, seen, "verdict", "verdict", {"state": state, "previous": previous})

    stretch = StoredStretch(0, 86400, "GPU-1", "n1", None, "H100", "550", None, "healthy", False)
    board = BoardHistory("c", "S", 0, 9000, [stretch], [
        verdict(1000, 1000, "unhealthy", "healthy"),
        verdict(2000, 2000, "healthy", "unhealthy"),   # released ...
        verdict(2000, 2001, "unhealthy", "healthy"),   # ... and fenced again in its second
        verdict(3000, 3000, "healthy", "unhealthy"),   # released ...
        verdict(2998, 3004, "unhealthy", "healthy"),   # ... the next fence dated before it
        verdict(4000, 4000, "healthy", "unhealthy"),
    ])  # fmt: skip
    got = summarize(board, 0, 86400, relapse_within=3600)
    assert got.fences == [1000, 2000, 2998]
    assert [(r.released_at, r.refenced_at, r.held_seconds, r.relapse) for r in got.recoveries] == [
        (2000, 2000, 0, True), (3000, 2998, 0, True), (4000, None, 5000, False)
    ]  # fmt: skip
    assert got.relapses == 2
    # what the fences cost ends at each one's own release, in the same order
    assert [(at, end) for at, end, _ in fence_spans(board)] == [
        (1000, 2000), (2000, 3000), (2998, 4000)
    ]  # fmt: skip


def test_recoveries_relapses_and_rates_over_observed_time() -> None:
    def verdict(at: int, state: str, previous: str) -> StoredEvent:
        return StoredEvent(at, at, "verdict", "verdict", {"state": state, "previous": previous})

    stretch = StoredStretch(0, 86400, "GPU-1", "n1", None, "H100", "550", None, "healthy", False)
    board = BoardHistory("c", "S", 0, 2 * 86400, [stretch], [
        verdict(1000, "unhealthy", "healthy"), verdict(2000, "healthy", "unhealthy"),
        verdict(5000, "unhealthy", "healthy"), verdict(6000, "healthy", "unhealthy"),
        verdict(100_000, "unhealthy", "healthy"),
    ])  # fmt: skip
    got = summarize(board, 0, 86400, relapse_within=3600)
    assert got.fences == [1000, 5000]
    assert [(r.held_seconds, r.relapse) for r in got.recoveries] == [(3000, True), (94000, False)]
    # the second day was never observed: unknown, and not in the rate's denominator
    assert got.observed_seconds == 86400 and got.unknown_seconds == 0
    (model,) = rates([board], "model", 0, 2 * 86400, 3600)
    assert model.observed_gpu_days == 1.0 and model.fences == 3 and model.fence_rate == 3000.0


def test_no_rate_under_the_floor_of_observed_gpu_days() -> None:
    """A fence in an observed GPU-hour is no rate of 24,000 per 1,000 GPU-days: under the
    floor the table shows "-" with a note, below the groups that have a rate; CSV and JSON
    keep the exact counts and GPU-days, with no rate and the note."""
    from datetime import UTC

    from gpuquota.quota.fleet.render import rates_text
    from gpuquota.quota.fleet.summary import GroupRate
    from gpuquota.quota.report.period import Period

    few = GroupRate("H200", 1, 3600, 0, 1, 0, 0)  # one GPU-hour, one fence
    many = GroupRate("H100", 8, 20 * 86400, 30, 2, 4, 1)
    period = Period(0, 20 * 86400, UTC)
    text = rates_text([few, many], "model", period, "table", 10.0).splitlines()
    assert text[2].startswith("H100 ") and " 100.0 " in text[2]
    assert text[3].startswith("H200 ") and " -  " in text[3] and " 1.0h " in text[3]
    assert text[4] == "-: under 10 observed GPU-days: too few for a rate (--min-gpu-days)"
    doc = json.loads(rates_text([few, many], "model", period, "json", 10.0))
    h200 = doc["groups"][1]
    assert (h200["fences_per_1000_gpu_days"], h200["observed_gpu_days"]) == (None, 1 / 24)
    assert h200["note"].startswith("under 10 observed GPU-days")
    csv_rows = rates_text([few, many], "model", period, "csv", 10.0).splitlines()
    assert csv_rows[1].startswith("H100,8,20.0,0.00034722222222222224,2,100.0,")
    assert csv_rows[2].startswith("H200,1,0.041666666666666664,0.0,1,,")
