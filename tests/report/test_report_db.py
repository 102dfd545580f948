"""`gpuquota report` against real stores (SQLite file and PostgreSQL): window edges, month and
DST boundaries, rate changes, MIG and time-slicing, label history, quota, idle, outputs."""

from __future__ import annotations

import csv
import io
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.report.conftest import A100, H100, Store, ts
from tests.report.helpers import assert_refused

OCT = ts("2026-10-01T00:00:00")
NOV = ts("2026-11-01T00:00:00")
NOW = "2026-11-22T00:00:00Z"
H = 3600


def rows_json(report: Any, store: Store, *argv: str) -> dict[str, Any]:
    result = report(*argv, "--format", "json", "--now", NOW, db=store)
    assert result.rc == 0, result.err
    doc: dict[str, Any] = json.loads(result.out)
    return doc


def by_group(doc: dict[str, Any]) -> dict[tuple[str | None, ...], dict[str, Any]]:
    return {tuple(r["group"].values()): r for r in doc["rows"]}


def test_intervals_are_split_pro_rata_at_window_edges(store: Store, report: Any) -> None:
    store.alloc("ml", OCT - 2 * H, OCT + 3 * H, units=2)  # 3 h inside
    store.alloc("ml", NOV - H, NOV + 5 * H)  # 1 h inside
    store.alloc("ml", OCT - 9 * H, OCT)  # ends exactly at the start: nothing
    store.alloc("ml", NOV, NOV + H)  # starts exactly at the end: nothing
    store.alloc("web", OCT - H, NOV + H, units=4)  # covers the whole month
    store.alloc("web", OCT + H, OCT + H)  # zero length
    doc = rows_json(report, store, "--month", "2026-10")
    g = by_group(doc)
    assert g[("ml",)]["gpu_seconds_raw"] == 2 * 3 * H + H
    assert g[("web",)]["gpu_seconds_raw"] == 4 * 31 * 24 * H
    assert doc["total"]["gpu_seconds_raw"] == 7 * H + 4 * 31 * 24 * H


def test_running_allocations_count_up_to_now_or_window_end(store: Store, report: Any) -> None:
    store.alloc("ml", OCT + H, None)
    early = report("--month", "2026-10", "--now", "2026-10-01T03:30:00Z", "--json", db=store)
    assert json.loads(early.out)["rows"][0]["gpu_seconds_raw"] == 2 * H + 1800
    late = rows_json(report, store, "--month", "2026-10")
    assert late["rows"][0]["gpu_seconds_raw"] == 31 * 24 * H - H


def test_month_boundary_in_a_time_zone(store: Store, report: Any) -> None:
    # 31 Oct 22:00 UTC .. 1 Nov 02:00 UTC; in Berlin (UTC+1 after 25 Oct) October ends at 23:00 UTC
    store.alloc("ml", ts("2026-10-31T22:00:00"), ts("2026-11-01T02:00:00"))
    utc = rows_json(report, store, "--month", "2026-10")
    berlin = rows_json(report, store, "--month", "2026-10", "--tz", "Europe/Berlin")
    assert utc["rows"][0]["gpu_seconds_raw"] == 2 * H
    assert berlin["rows"][0]["gpu_seconds_raw"] == 1 * H
    assert berlin["period"]["end"] == "2026-11-01T00:00:00+01:00"


def test_dst_day_has_25_hours(store: Store, report: Any) -> None:
    store.alloc("ml", OCT, None)
    doc = rows_json(
        report, store, "--from", "2026-10-25", "--to", "2026-10-26", "--tz", "Europe/Berlin"
    )
    assert doc["rows"][0]["gpu_seconds_raw"] == 25 * H
    assert doc["rows"][0]["gpu_hours_raw"] == 25.0


def test_rate_change_mid_period_and_mig_and_time_slicing(
    store: Store, report: Any, tmp_path: Path
) -> None:
    card = tmp_path / "card.yaml"
    card.write_text(
        f"currency: EUR\ndefault_rate: 1\nmodels:\n  {H100}:\n    - rate: 4\n    - {{rate: 2, from: 2026-10-15}}\n"
        f"  {A100}: 3\nmig_fractions:\n  3g.20gb: 0.5\n"
    )
    store.alloc("ml", ts("2026-10-14T00:00:00"), ts("2026-10-16T00:00:00"))  # 24 h at 4, 24 h at 2
    # time-slicing: 2 replicas of a GPU shared 4 ways = half a GPU
    store.alloc(
        "ts",
        ts("2026-10-14T00:00:00"),
        ts("2026-10-14T10:00:00"),
        units=2,
        physical=0.5,
        replicas=4,
    )
    # MIG: 1g.5gb keeps the store's N/7; 3g.20gb is priced at the card's 0.5
    store.alloc(
        "mig",
        OCT,
        OCT + 7 * H,
        units=2,
        physical=2 / 7,
        resource="nvidia.com/mig-1g.5gb",
        model=A100,
    )
    store.alloc(
        "mig",
        OCT,
        OCT + 2 * H,
        units=1,
        physical=3 / 7,
        resource="nvidia.com/mig-3g.20gb",
        model=A100,
    )
    store.alloc("l4", OCT, OCT + H, model="NVIDIA-L4")
    doc = rows_json(report, store, "--month", "2026-10", "--rate-card", str(card))
    g = by_group(doc)
    assert g[("ml",)]["cost_EUR"] == 24 * 4 + 24 * 2
    assert g[("ts",)]["gpu_hours_raw"] == 20.0
    assert g[("ts",)]["gpu_hours_physical"] == 5.0
    assert g[("ts",)]["cost_EUR"] == 20.0
    assert g[("mig",)]["gpu_hours_raw"] == 16.0
    # physical: the store's 2/7 * 7 h + 3/7 * 2 h; priced: 2/7 * 7 h + the card's 0.5 * 2 h
    assert g[("mig",)]["gpu_hours_physical"] == pytest.approx(2 + 6 / 7)
    assert g[("mig",)]["gpu_hours_priced"] == 3.0
    assert g[("mig",)]["cost_EUR"] == 9.0
    assert g[("ts",)]["gpu_hours_priced"] == 5.0
    assert g[("l4",)]["cost_EUR"] == 1.0
    assert doc["notes"]["unpriced_models"] == ["NVIDIA-L4"]
    assert doc["total"]["cost_EUR"] == pytest.approx(144 + 20 + 9 + 1)


def test_labels_as_they_were_split_where_they_changed(store: Store, report: Any) -> None:
    store.labels("ml", {"team": "vision"}, OCT - 86400, OCT + 10 * H)
    store.labels("ml", {"team": "speech", "env": "prod"}, OCT + 10 * H, None)
    store.labels("web", {"env": "prod"}, 0, None)
    store.alloc("ml", OCT, OCT + 30 * H, units=2)
    store.alloc("web", OCT, OCT + H)
    store.alloc("new", OCT, OCT + H)  # no label history at all
    doc = rows_json(report, store, "--month", "2026-10", "--by", "label:team")
    g = by_group(doc)
    assert g[("vision",)]["gpu_seconds_raw"] == 2 * 10 * H
    assert g[("speech",)]["gpu_seconds_raw"] == 2 * 20 * H
    assert g[(None,)]["gpu_seconds_raw"] == 2 * H  # web has no team label, new has no labels
    assert doc["total"]["gpu_seconds_raw"] == 62 * H
    two = by_group(
        rows_json(report, store, "--month", "2026-10", "--by", "namespace", "--by", "label:env")
    )
    assert two[("ml", "prod")]["gpu_seconds_raw"] == 2 * 20 * H
    assert two[("ml", None)]["gpu_seconds_raw"] == 2 * 10 * H
    assert two[("web", "prod")]["gpu_seconds_raw"] == H


def test_group_keys(store: Store, report: Any) -> None:
    store.alloc("ml", OCT, OCT + H, node="n1", owner=("Job", "a"), model=H100, cluster="east")
    store.alloc(
        "ml", OCT, OCT + 2 * H, node="n2", owner=None, model=A100, cluster="west", pool="pool-b"
    )
    doc = rows_json(report, store, "--month", "2026-10", "--by", "namespace,model")
    assert set(by_group(doc)) == {("ml", H100), ("ml", A100)}
    assert set(by_group(rows_json(report, store, "--month", "2026-10", "--by", "owner"))) == {
        ("ml/Job/a",),
        (None,),
    }
    assert set(by_group(rows_json(report, store, "--month", "2026-10", "--by", "node,pool"))) == {
        ("n1", "pool-a"),
        ("n2", "pool-b"),
    }
    clusters = by_group(rows_json(report, store, "--month", "2026-10", "--by", "cluster"))
    assert clusters[("west",)]["gpu_seconds_raw"] == 2 * H
    only_east = rows_json(report, store, "--month", "2026-10", "--cluster", "east")
    assert only_east["total"]["gpu_seconds_raw"] == H


def test_quota_average_and_peak_from_history(store: Store, report: Any) -> None:
    # hard 4 all month; used 2 for the first half, 4 for the second (31 days: split at 15.5 days)
    store.quota("ml", OCT - 100, hard=4, used=2)
    store.quota("ml", OCT + 31 * 12 * H, hard=4, used=4)
    store.quota(
        "ml", OCT + 31 * 12 * H, hard=2, used=0, resource="limits.nvidia.com/gpu"
    )  # ignored
    store.alloc("ml", OCT, OCT + H)
    doc = rows_json(report, store, "--month", "2026-10")
    (r,) = doc["quota"]["rows"]  # one quota, one resource (requests form, prefix dropped)
    assert (r["group"], r["quota"], r["resource"]) == (
        {"namespace": "ml"},
        "gpu-quota",
        "nvidia.com/gpu",
    )
    assert r["quota_avg_used"] == 3.0
    assert r["quota_peak_used"] == 4.0
    assert r["quota_avg_hard"] == 4.0
    assert r["quota_unused_gpu_hours"] == 2 * 31 * 12  # (4-2) for half the month


def test_idle_per_model_and_pool_with_spread(store: Store, report: Any) -> None:
    store.capacity("n1", OCT - H, None, units=8)  # 8 H100 all month
    store.capacity(
        "n2",
        OCT,
        OCT + 10 * H,
        units=28,
        physical=4.0,
        model=A100,
        pool="pool-b",
        resource="nvidia.com/mig-1g.5gb",
    )  # 4 A100 in 28 MIG slices, 10 h
    store.alloc("ml", OCT, OCT + 100 * H, units=2)
    store.alloc(
        "web",
        OCT,
        OCT + 10 * H,
        units=7,
        physical=1.0,
        model=A100,
        pool="pool-b",
        resource="nvidia.com/mig-1g.5gb",
    )
    doc = rows_json(report, store, "--month", "2026-10", "--spread-idle", "proportional")
    idle = {(r["model"], r["node_pool"]): r for r in doc["idle"]["rows"]}
    month = 31 * 24
    assert idle[(H100, "pool-a")]["allocatable_gpu_hours"] == 8 * month
    assert idle[(H100, "pool-a")]["idle_gpu_hours"] == 8 * month - 200
    assert idle[(A100, "pool-b")]["idle_gpu_hours"] == 30.0
    total_idle = 8 * month - 200 + 30
    assert doc["idle"]["total"]["idle_gpu_hours"] == total_idle
    g = by_group(doc)
    spread = "spread_idle_gpu_hours"  # the group's share: not the idle table's figure
    assert g[("ml",)][spread] + g[("web",)][spread] == pytest.approx(total_idle)
    assert g[("ml",)][spread] == pytest.approx(total_idle * 200 / 210, abs=0.01)


def test_estimated_intervals_are_flagged(store: Store, report: Any) -> None:
    store.alloc("ml", OCT, OCT + H, estimated=True, units=2)
    store.alloc("ml", OCT, OCT + H)
    doc = rows_json(report, store, "--month", "2026-10")
    assert doc["notes"]["estimated_intervals"] == 1
    assert doc["rows"][0]["estimated_gpu_hours_raw"] == 2.0
    table = report("--month", "2026-10", "--now", NOW, db=store)
    assert "closed by estimate" in table.out


def test_best_effort_gpu_pods_are_named_as_escaping_scoped_quotas(
    store: Store, report: Any
) -> None:
    store.alloc("ml", OCT, OCT + H, qos_class="BestEffort")
    store.alloc("ml", OCT + H, None, qos_class="BestEffort")
    store.alloc("web", OCT, OCT + H)  # Guaranteed: not named
    store.alloc("batch", OCT - 2 * H, OCT - H, qos_class="BestEffort")  # before the window
    doc = rows_json(report, store, "--month", "2026-10")
    assert doc["notes"]["best_effort_gpu_pods"] == {"ml": 2}
    table = report("--month", "2026-10", "--now", NOW, db=store)
    assert "2 pod(s) held GPUs while BestEffort" in table.out
    assert "ml (2)" in table.out and "web" not in table.out.split("BestEffort")[-1]


def test_totals_equal_the_sum_of_displayed_rows_in_every_format(
    store: Store, report: Any, tmp_path: Path
) -> None:
    card = tmp_path / "card.yaml"
    card.write_text("default_rate: 0.37\n")
    for i in range(7):  # awkward thirds and sevenths everywhere
        store.alloc(
            f"ns{i}",
            OCT + 7 * i,
            OCT + 1200 + 13 * i,
            units=1,
            physical=1 / 7,
            resource="nvidia.com/mig-1g.5gb",
            model=A100,
        )
    result = report(
        "--month", "2026-10", "--rate-card", str(card), "--format", "csv", "--now", NOW, db=store
    )
    assert result.rc == 0
    records = list(csv.DictReader(io.StringIO(result.out)))
    groups = [r for r in records if r["row"] == "group"]
    (total,) = [r for r in records if r["row"] == "total"]
    assert len(groups) == 7
    # CSV and JSON carry exact values: the rows add up to the total (to a double's precision)
    for column in ("gpu_hours_raw", "gpu_hours_physical", "cost_USD", "share_pct"):
        assert sum(float(r[column]) for r in groups) == pytest.approx(float(total[column]))
    assert float(total["share_pct"]) == 100.0
    assert sum(int(r["gpu_seconds_raw"]) for r in groups) == int(total["gpu_seconds_raw"])
    doc = rows_json(report, store, "--month", "2026-10", "--rate-card", str(card))
    for column in ("gpu_hours_physical", "cost_USD"):
        assert sum(r[column] for r in doc["rows"]) == pytest.approx(doc["total"][column])
    # the table: each figure rounded from its own value, the total from the exact sum, so it
    # is within the rounding of the printed rows (half a cent per row)
    table = report("--month", "2026-10", "--rate-card", str(card), "--now", NOW, db=store).out
    lines = table.splitlines()
    body = [line.split() for line in lines if line.startswith("ns")]
    total_line = next(line.split() for line in lines if line.startswith("TOTAL"))
    for i in range(1, 5):
        shown = sum(Decimal(b[i]) for b in body)
        assert abs(shown - Decimal(total_line[i])) <= Decimal("0.005") * len(body), i
        column = ["", "gpu_hours_raw", "gpu_hours_physical", "cost_USD", "share_pct"][i]
        exact = {r["namespace"]: Decimal(r[column]) for r in groups}
        for b in body:
            assert abs(Decimal(b[i]) - exact[b[0]]) <= Decimal("0.005"), (b, column)


def test_top_folds_the_rest(store: Store, report: Any) -> None:
    for i in range(4):
        store.alloc(f"ns{i}", OCT, OCT + (i + 1) * H)
    doc = rows_json(report, store, "--month", "2026-10", "--top", "2")
    assert [r["group"]["namespace"] for r in doc["rows"]] == ["ns3", "ns2", "(other)"]
    assert doc["rows"][2]["gpu_seconds_raw"] == 3 * H


def test_chart_is_drawn(store: Store, report: Any, tmp_path: Path) -> None:
    store.alloc("ml", OCT, OCT + 50 * H)
    for name in ("usage.svg", "usage.png"):
        out = tmp_path / name
        result = report("--month", "2026-10", "--chart", str(out), "--now", NOW, db=store)
        assert result.rc == 0, result.err
        head = out.read_bytes()[:200]
        assert (
            (b"<svg" in head or b"<?xml" in head)
            if name.endswith("svg")
            else head.startswith(b"\x89PNG")
        )


def test_empty_store_is_refused_and_a_covered_period_without_use_is_zero(
    store: Store, report: Any
) -> None:
    """An empty store is no bill of zero (a monthly job would file it): exit 2, one line. A
    period the store covers with no GPU use in it is a true zero."""
    assert_refused(report("--month", "2026-10", "--now", NOW, db=store), "holds no data yet")
    store.alloc("ml", OCT - 2 * H, OCT - H)  # the store's data, before the period
    doc = rows_json(report, store, "--month", "2026-10")
    assert doc["rows"] == [] and doc["total"]["gpu_seconds_raw"] == 0
    table = report("--month", "2026-10", "--now", NOW, db=store)
    assert table.rc == 0 and "no GPU usage" in table.out


def test_csv_idle_rows_add_up(store: Store, report: Any, tmp_path: Path) -> None:
    card = tmp_path / "card.yaml"
    card.write_text(f"default_rate: 1\nmodels:\n  {H100}: 3\n")
    store.capacity("n1", OCT, None, units=8)
    store.capacity("n2", OCT, OCT + 7 * H, units=3, model=A100, pool="pool-b")
    store.alloc("ml", OCT, OCT + 5 * H, units=3)
    store.alloc("web", OCT, OCT + 3 * H, model=A100, pool="pool-b")
    result = report(
        "--month",
        "2026-10",
        "--idle",
        "--rate-card",
        str(card),
        "--format",
        "csv",
        "--now",
        NOW,
        db=store,
    )
    assert result.rc == 0, result.err
    records = list(csv.DictReader(io.StringIO(result.out)))
    idle = [r for r in records if r["row"] == "idle"]
    (total,) = [r for r in records if r["row"] == "idle_total"]
    assert {(r["model"], r["node_pool"]) for r in idle} == {(H100, "pool-a"), (A100, "pool-b")}
    for column in (
        "allocatable_gpu_hours",
        "allocated_gpu_hours",
        "idle_gpu_hours",
        "idle_cost_USD",
    ):
        assert sum(Decimal(r[column]) for r in idle) == Decimal(total[column]), column
    b = next(r for r in idle if r["model"] == A100)
    assert (Decimal(b["allocatable_gpu_hours"]), Decimal(b["idle_gpu_hours"])) == (
        Decimal(21),
        Decimal(18),
    )
    assert Decimal(b["idle_cost_USD"]) == 18  # A100 not in the card: default rate


def test_quota_by_label_as_it_was(store: Store, report: Any) -> None:
    store.labels("ml", {"team": "vision"}, OCT - 86400, OCT + 10 * H)
    store.labels("ml", {"team": "speech"}, OCT + 10 * H, None)
    store.quota("ml", OCT - 100, hard=4, used=2)
    store.quota("web", OCT - 100, hard=1, used=0)  # web never had labels
    store.alloc("ml", OCT, OCT + 20 * H)
    doc = rows_json(report, store, "--month", "2026-10", "--by", "label:team")
    g = by_group(doc)
    q = by_group(doc["quota"])
    month = 31 * 24
    assert q[("vision",)]["quota_unused_gpu_hours"] == 2 * 10
    assert q[("speech",)]["quota_unused_gpu_hours"] == 2 * (month - 10)
    assert q[(None,)]["quota_unused_gpu_hours"] == month
    # averages over the time the group had samples (not diluted by the rest of the month)
    assert q[("vision",)]["quota_avg_hard"] == 4.0
    assert q[("vision",)]["sampled_pct"] == pytest.approx(1000 / month)
    assert q[("vision",)]["quota_peak_used"] is None  # peaks of namespaces do not add up
    assert g[("vision",)]["gpu_seconds_raw"] == 10 * H
    assert (None,) in q and (None,) not in g  # quota but no usage: still a quota row
    assert doc["quota"]["totals"]["nvidia.com/gpu"]["quota_avg_hard"] == pytest.approx(5.0)


def test_single_strategy_mig_is_priced_by_its_recorded_profile(
    store: Store, report: Any, tmp_path: Path
) -> None:
    card = tmp_path / "card.yaml"
    card.write_text(f"default_rate: 1\nmodels:\n  {A100}: 8\nmig_fractions:\n  1g.10gb: 0.125\n")
    # single strategy: every nvidia.com/gpu of the node is one 1g.10gb instance
    store.alloc("ml", OCT, OCT + 4 * H, units=2, physical=2 / 7, model=A100, mig_profile="1g.10gb")
    store.alloc("web", OCT, OCT + 7 * H, units=1, physical=1 / 7, model=A100, mig_profile="2g.20gb")
    g = by_group(rows_json(report, store, "--month", "2026-10", "--rate-card", str(card)))
    # priced: 2 x 0.125 x 4 h, the card's fraction; physical: the store's 2/7 x 4 h
    assert g[("ml",)]["gpu_hours_priced"] == 1.0
    assert g[("ml",)]["gpu_hours_physical"] == pytest.approx(8 / 7)
    assert g[("ml",)]["cost_USD"] == 8.0
    assert g[("web",)]["gpu_hours_physical"] == 1.0  # no fraction in the card: the store's 1/7
    assert g[("web",)]["gpu_hours_priced"] == 1.0
