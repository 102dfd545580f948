"""Every view of a bill agrees with every other (issue #27, items 2 to 4): one key per group,
one definition per column, one rounding rule, and no silent answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import insert

from gpuquota.quota.report.prometheus import busy_query, step_for
from gpuquota.quota.store.models import Gap
from tests.report.conftest import A100, Store, ts
from tests.report.helpers import Canned, assert_refused, doc_of, known, ledger, uid, vector

OCT = ts("2026-10-01T00:00:00")
H = 3600
NOW = "2026-11-22T00:00:00Z"


def test_an_owner_is_keyed_within_its_namespace(store: Store, report: Any) -> None:
    for i, ns in enumerate(("team-a", "team-b", "team-c")):
        store.alloc(ns, OCT, OCT + (i + 1) * H, owner=("Job", "eval-0001"))
    doc = doc_of(report, store, "--month", "2026-10", "--by", "owner")
    rows = {r["group"]["owner"]: r["gpu_seconds_raw"] for r in doc["rows"]}
    assert rows == {
        "team-a/Job/eval-0001": H,
        "team-b/Job/eval-0001": 2 * H,
        "team-c/Job/eval-0001": 3 * H,
    }


def test_a_label_group_of_two_namespaces_adds_their_quotas(store: Store, report: Any) -> None:
    known(store, OCT, OCT + 31 * 24 * H)
    for ns in ("ml", "web"):
        store.labels(ns, {"cost-center": "cc1"}, OCT - H, None)
        store.alloc(ns, OCT, OCT + H)
    store.quota("ml", OCT, hard=8, used=2)  # the whole month
    store.quota("web", OCT + 16 * 24 * H, hard=4, used=1)  # from the 17th: sampled part only
    doc = doc_of(report, store, "--month", "2026-10", "--by", "label:cost-center")
    (row,) = doc["quota"]["rows"]
    assert row["namespaces"] == 2
    # sums of each namespace's average over its sampled time
    assert (row["quota_avg_hard"], row["quota_avg_used"]) == (12.0, 3.0)
    # coverage per namespace, averaged: (31 + 15) / (2 x 31) days, never "200 %"
    assert row["sampled_pct"] == 100 * (31 + 15) / 62
    table = report("--month", "2026-10", "--by", "label:cost-center", "--now", NOW, db=store)
    assert "74.2" in table.out and "200" not in table.out


def test_a_rate_cards_mig_fraction_never_moves_idle(
    store: Store, report: Any, tmp_path: Path
) -> None:
    known(store, OCT, OCT + 24 * H)
    store.capacity("n1", OCT, None, units=7, physical=1, model=A100,
                   resource="nvidia.com/mig-1g.5gb")  # fmt: skip
    store.alloc("ml", OCT, OCT + 24 * H, units=7, physical=1, model=A100,
                resource="nvidia.com/mig-1g.5gb")  # fmt: skip
    card = tmp_path / "card.yaml"
    card.write_text("default_rate: 1\nmig_fractions:\n  1g.5gb: 0.125\n")
    plain = doc_of(report, store, "--from", "2026-10-01", "--to", "2026-10-02", "--idle")
    priced = doc_of(report, store, "--from", "2026-10-01", "--to", "2026-10-02", "--idle",
                    "--rate-card", str(card))  # fmt: skip
    assert plain["idle"]["total"]["idle_gpu_hours"] == 0.0
    for name in ("allocatable_gpu_hours", "allocated_gpu_hours", "idle_gpu_hours"):
        assert priced["idle"]["total"][name] == plain["idle"]["total"][name], name


def test_the_same_seconds_print_the_same_figure_in_every_row_and_view(
    store: Store, report: Any, tmp_path: Path
) -> None:
    card = tmp_path / "card.yaml"
    card.write_text("default_rate: 1.13\n")
    for ns in ("a", "b", "c"):
        store.alloc(ns, OCT, OCT + 156)  # 156 GPU-s each: 0.0433 GPU-h
        store.labels(ns, {"team": ns}, OCT - H, None)
    store.alloc("big", OCT, OCT + 10 * H)
    argv = ("--month", "2026-10", "--rate-card", str(card), "--now", NOW)

    def figures(*extra: str) -> dict[str, list[str]]:
        result = report(*argv, *extra, db=store)
        assert result.rc == 0, result.err
        out = {}
        for line in result.out.splitlines():
            cells = line.split()
            if cells and cells[0] in ("a", "b", "c", "big", "TOTAL"):
                out[cells[0]] = cells[1:4]
        return out

    by_ns = figures()
    assert by_ns["a"] == by_ns["b"] == by_ns["c"] == ["0.04", "0.04", "0.05"]
    assert figures("--by", "label:team")["a"] == by_ns["a"]
    top = figures("--top", "2")
    assert top["big"] == by_ns["big"] and top["a"] == by_ns["a"]
    # the total is rounded from the exact sum: within half a unit per row of the rows shown
    assert by_ns["TOTAL"][0] == "10.13"


def test_idle_allocations_need_the_ledger(store: Store, report: Any) -> None:
    store.alloc("ml", OCT, OCT + H)
    result = report("--month", "2026-10", "--idle-allocations", "--now", NOW, db=store)
    assert_refused(result, "--idle-allocations", "no usage ledger")


def test_an_idle_run_closes_at_the_periods_end(store: Store, report: Any) -> None:
    t0 = ts("2026-10-05T10:00:00")
    store.alloc("ml", t0, None, pod="sleepy")
    ledger(store, uid(store), [(t0 + i * H, 0.0, 1000, H) for i in range(4)], progress=t0 + 4 * H)
    doc = doc_of(report, store, "--from", "2026-10-05T00:00:00Z", "--to",
                 "2026-10-05T12:00:00Z", "--idle-allocations")  # fmt: skip
    (run,) = doc["idle_allocations"]["rows"]
    # the run goes on after the period; within it, it ends with the period
    assert not run["still_idle"]
    assert run["idle_until"] == "2026-10-05T12:00:00Z"


def test_focus_refuses_views_it_cannot_carry(store: Store, report: Any, tmp_path: Path) -> None:
    store.alloc("ml", OCT, OCT + H)
    card = tmp_path / "card.yaml"
    card.write_text("default_rate: 1\n")
    for flag in (("--idle-allocations",), ("--prometheus", "http://127.0.0.1:9")):
        result = report("--month", "2026-10", "--rate-card", str(card), "--format", "focus",
                        *flag, "--now", NOW, db=store)  # fmt: skip
        assert_refused(result, "--format focus:", flag[0], "do not carry")


def test_a_period_the_store_does_not_cover_is_refused(store: Store, report: Any) -> None:
    known(store, OCT, OCT + 10 * 24 * H)
    store.alloc("ml", OCT, OCT + H)
    with store.engine.begin() as conn:  # pods not followed from the 2nd to the 4th
        conn.execute(
            insert(Gap).values(cluster="c1", kind="Pod", started_at=OCT + 24 * H,
                               ended_at=OCT + 72 * H, reason="restart")
        )  # fmt: skip
    # a day wholly inside the gap: no covered time, so no bill of zero
    result = report("--from", "2026-10-03", "--to", "2026-10-04", "--now", NOW, db=store)
    assert_refused(result, "no data for the period", "covers none of it")


def test_two_activity_sources_are_named(sqlite_store: Store, report: Any) -> None:
    sqlite_store.clear()
    t0 = ts("2026-10-05T10:00:00")
    sqlite_store.alloc("ml", t0, t0 + H)
    ledger(sqlite_store, uid(sqlite_store), [(t0, 1800, 1000, H)])
    canned = Canned()
    try:
        span = 86400
        canned.bodies = {
            busy_query(span, step_for(span)): vector({"ml": 0.0}),
            busy_query(span, step_for(span), measured=True): vector({"ml": 1.0 * H}),
        }
        result = report("--from", "2026-10-05", "--to", "2026-10-06", "--prometheus",
                        canned.url, "--now", NOW, db=sqlite_store)  # fmt: skip
    finally:
        canned.close()
    assert result.rc == 0, result.err
    assert "prom util %" in result.out and "used GPU-h" in result.out
    assert "two activity sources on this page" in result.out
