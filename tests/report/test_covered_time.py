"""Unknown time is never priced (issue #27, item 1): allocatable capacity, idle GPU-hours, idle
cost and every spread of it count only the time the store covers; what falls outside is noted,
never shown as idle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import insert

from gpuquota.quota import cli as gpuquota
from gpuquota.quota.store import daytwo
from gpuquota.quota.store.models import Gap
from gpuquota.sim.workload import generate
from tests.report.conftest import Store, ts
from tests.report.helpers import doc_of, known

SEP = ts("2026-09-01T00:00:00")
SEP30 = ts("2026-09-30T00:00:00")
OCT = ts("2026-10-01T00:00:00")
H = 3600
NOW = "2026-11-22T00:00:00Z"


def card_of(tmp_path: Any) -> str:
    card = tmp_path / "card.yaml"
    card.write_text("currency: USD\ndefault_rate: 2\n")
    return str(card)


def test_a_replayed_trace_prices_no_idle_before_its_first_event(
    store: Store, report: Any, tmp_path: Any
) -> None:
    # the nodes were created a month before the recording's first event (2026-09-30)
    known(store, SEP30, OCT)
    store.capacity("node-1", SEP, None, units=8)
    store.alloc("ml", SEP30, SEP30 + 4 * H, units=2)
    card = card_of(tmp_path)
    wide = doc_of(report, store, "--from", "2026-09-01", "--to", "2026-10-01", "--idle",
                  "--spread-idle", "proportional", "--rate-card", card)  # fmt: skip
    narrow = doc_of(report, store, "--from", "2026-09-30", "--to", "2026-10-01", "--idle",
                    "--spread-idle", "proportional", "--rate-card", card)  # fmt: skip
    # one covered day: 8 GPUs x 24 h allocatable, 8 GPU-h of it allocated
    assert wide["idle"]["total"]["allocatable_gpu_hours"] == 192.0
    assert wide["idle"]["total"]["idle_gpu_hours"] == 184.0
    assert wide["idle"]["total"]["idle_cost_USD"] == 368.0
    assert wide["idle"]["total"] == narrow["idle"]["total"] | {
        "uncovered_allocatable_gpu_hours": wide["idle"]["total"]["uncovered_allocatable_gpu_hours"]
    }
    assert wide["rows"][0]["spread_idle_cost_USD"] == 368.0
    # the 29 days before the data begins are named, not priced
    assert wide["idle"]["total"]["uncovered_allocatable_gpu_hours"] == 29 * 24 * 8
    assert narrow["idle"]["total"]["uncovered_allocatable_gpu_hours"] == 0.0
    assert wide["covered"]["c1"] == [
        {
            "start": "2026-09-30T00:00:00Z",
            "end": "2026-10-01T00:00:00Z",
            "start_unix": SEP30,
            "end_unix": OCT,
        }
    ]
    assert any("not priced" in m and "uncovered" in m for m in wide["notes"]["messages"])
    table = report("--from", "2026-09-01", "--to", "2026-10-01", "--idle", "--now", NOW, db=store)
    assert "note: covered time: cluster 'c1' 2026-09-30T00:00:00Z .. 2026-10-01T00:00:00Z" in (
        table.out
    )


def test_time_after_the_data_ends_and_inside_gaps_is_not_idle(store: Store, report: Any) -> None:
    known(store, SEP, SEP + 10 * 24 * H)
    store.capacity("node-1", SEP, None, units=4)
    with store.engine.begin() as conn:  # pods were not followed for a day
        conn.execute(
            insert(Gap).values(
                cluster="c1",
                kind="Pod",
                started_at=SEP + 24 * H,
                ended_at=SEP + 48 * H,
                reason="restart",
            )
        )
        # a quota watch gap says nothing about GPUs: covered
        conn.execute(
            insert(Gap).values(
                cluster="c1",
                kind="ResourceQuota",
                started_at=SEP + 72 * H,
                ended_at=SEP + 96 * H,
                reason="gone",
            )
        )
    doc = doc_of(report, store, "--month", "2026-09", "--idle")
    # 10 days of data, one of them a pod gap: 9 days x 24 h x 4 GPUs
    assert doc["idle"]["total"]["allocatable_gpu_hours"] == 9 * 24 * 4
    assert doc["idle"]["total"]["idle_gpu_hours"] == 9 * 24 * 4
    # the gap's day and the 20 days after the data ends: named, not idle
    assert doc["idle"]["total"]["uncovered_allocatable_gpu_hours"] == 21 * 24 * 4


def test_a_prune_never_grows_the_idle_of_the_month_it_cuts(
    store: Store, report: Any, tmp_path: Any
) -> None:
    known(store, SEP, OCT + 30 * 24 * H)
    store.capacity("node-1", SEP, None, units=2)
    for day in range(0, 30, 2):  # one GPU busy 12 h every other day of September and October
        store.alloc("ml", SEP + day * 24 * H, SEP + day * 24 * H + 12 * H)
        store.alloc("ml", OCT + day * 24 * H, OCT + day * 24 * H + 12 * H)
    before = doc_of(report, store, "--from", "2026-09-16", "--to", "2026-10-16", "--idle")
    from_cut = doc_of(report, store, "--from", "2026-10-01", "--to", "2026-10-16", "--idle")
    daytwo.prune(store.url, OCT, apply=True)
    after = doc_of(report, store, "--from", "2026-09-16", "--to", "2026-10-16", "--idle")
    assert after["idle"]["total"]["idle_gpu_hours"] <= before["idle"]["total"]["idle_gpu_hours"]
    # the pruned half-month is outside the covered time: what is left is the cut's side
    for name in ("allocatable_gpu_hours", "allocated_gpu_hours", "idle_gpu_hours"):
        assert after["idle"]["total"][name] == from_cut["idle"]["total"][name], name
    assert after["idle"]["total"]["uncovered_allocatable_gpu_hours"] == 15 * 24 * 2


def test_quota_averages_take_only_sampled_time(store: Store, report: Any) -> None:
    known(store, OCT, OCT + 30 * 24 * H)
    store.alloc("ml", OCT, OCT + H)
    # the quota's first sample comes at mid-month: hard 8 from then on
    store.quota("ml", OCT + 15 * 24 * H, 8, 2)
    doc = doc_of(report, store, "--month", "2026-10")
    (row,) = doc["quota"]["rows"]
    assert row["quota_avg_hard"] == 8.0
    assert row["quota_avg_used"] == 2.0
    assert row["quota_peak_hard"] == 8.0
    assert row["sampled_pct"] == 50.0


def test_quota_coverage_is_over_the_time_the_store_knows(store: Store, report: Any) -> None:
    # a replayed recording of the month's last day, reported for the whole month
    known(store, OCT - 24 * H, OCT)
    store.alloc("ml", OCT - 24 * H, OCT - 23 * H)
    store.quota("ml", OCT - 24 * H, 8, 1)
    doc = doc_of(report, store, "--month", "2026-09")
    (row,) = doc["quota"]["rows"]
    assert row["sampled_pct"] == 100.0  # not 1/30 of the month the store never saw
    assert row["quota_avg_hard"] == 8.0


def test_a_replayed_trace_reported_from_the_month_start_prices_the_same_idle(
    store: Store, report: Any, tmp_path: Path
) -> None:
    """The issue's own reproduction: a replayed recording whose first event is on 2026-09-30,
    reported with --from 2026-09-01, priced idle for the weeks before it (its nodes were
    created earlier); now the idle is the recording's, and the rest is named uncovered."""
    workload = generate(3, hours=2, start=SEP30)
    events = tmp_path / "events.jsonl"
    events.write_text("\n".join(workload.lines()) + "\n")
    assert gpuquota.main(["replay", str(events), "--db", store.url, "--cluster", "rec"]) == 0
    card = card_of(tmp_path)
    wide = doc_of(report, store, "--from", "2026-09-01", "--to", "2026-10-01", "--idle",
                  "--rate-card", card)  # fmt: skip
    narrow = doc_of(report, store, "--from", "2026-09-30", "--to", "2026-10-01", "--idle",
                    "--rate-card", card)  # fmt: skip
    for name in ("allocatable_gpu_hours", "idle_gpu_hours", "idle_cost_USD"):
        assert wide["idle"]["total"][name] == narrow["idle"]["total"][name], name
    covered = sum(s["end_unix"] - s["start_unix"] for s in wide["covered"]["rec"])
    assert covered <= workload.end - SEP30
