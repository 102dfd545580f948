"""`gpuquota report` with the usage ledger (issue #19, contract section 3): used GPU-hours,
efficiency, idle-allocated GPU-hours, energy, its cost and carbon, and coverage in every view
and format; the idle-allocations view; missing usage never shown as 0. Ledger rows are
inserted directly here, with the meaning the contract gives them (the controller's ingestion
writes them in production), on SQLite and PostgreSQL."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert

from gpuquota.quota.store.models import ClaimAllocation, UsageSeries
from tests.report.conftest import A100, H100, Store, ts
from tests.report.helpers import NOW, T0, WINDOW, H, assert_refused, ledger, uid


def as_json(report: Any, store: Store, *argv: str) -> dict[str, Any]:
    result = report(*WINDOW, *NOW, *argv, "--format", "json", db=store)
    assert result.rc == 0, result.err
    doc: dict[str, Any] = json.loads(result.out)
    return doc


def rows_by(doc: dict[str, Any], key: str = "namespace") -> dict[str, dict[str, Any]]:
    return {r["group"][key]: r for r in doc["rows"]}


def test_used_efficiency_energy_coverage_per_namespace(store: Store, report: Any) -> None:
    # ml: one GPU 10:00-12:00, half busy, 0.1 kWh an hour, fully sampled
    store.alloc("ml", T0, T0 + 2 * H)
    ledger(store, uid(store), [(T0, 1800, 360_000, H), (T0 + H, 1800, 360_000, H)])
    # web: two GPUs 10:00-12:00, the ledger saw only one hour of one GPU
    store.alloc("web", T0, T0 + 2 * H, units=2)
    ledger(store, uid(store), [(T0, 360, 720_000, H)], namespace="web")
    # batch: allocated, no ledger rows at all: no usage data, not zero
    store.alloc("batch", T0, T0 + H)
    # a GPU nobody held: its energy is nobody's (half of a window before the period)
    ledger(
        store,
        "",
        [(ts("2026-10-04T23:30:00"), 0, 100_000, H), (T0, 0, 130_000, H)],
        kind="unallocated",
        namespace="",
        name="",
        device="GPU-9",
    )
    doc = as_json(report, store)
    rows = rows_by(doc)
    ml, web, batch = rows["ml"], rows["web"], rows["batch"]
    assert ml["gpu_seconds_used"] == 3600
    assert ml["gpu_hours_used"] == 1.0
    assert ml["efficiency_pct"] == 50.0
    assert ml["gpu_hours_idle_allocated"] == 1.0
    assert ml["energy_joules"] == 720_000
    assert ml["energy_kwh"] == 0.2
    assert ml["usage_coverage_ratio"] == 1.0
    assert ml["usage_coverage_pct"] == 100.0
    # web: 1 of 4 GPU-hours sampled; efficiency and idle over the covered GPU-hour only
    assert web["usage_coverage_ratio"] == 0.25
    assert web["efficiency_pct"] == 10.0
    assert web["gpu_hours_idle_allocated"] == 0.9
    for field in (
        "gpu_seconds_used",
        "gpu_hours_used",
        "efficiency_pct",
        "energy_joules",
        "energy_kwh",
        "usage_coverage_ratio",
        "gpu_hours_idle_allocated",
    ):
        assert batch[field] is None, field
    assert batch["gpu_hours_raw"] == 1.0
    assert doc["total"]["gpu_seconds_used"] == 3960
    assert doc["total"]["energy_joules"] == 1_440_000
    assert doc["total"]["usage_coverage_ratio"] == pytest.approx(3 / 7, abs=1e-4)
    messages = "\n".join(doc["notes"]["messages"])
    assert "no usage data" in messages and "batch" in messages
    assert doc["notes"]["unallocated_energy_joules"] == {"c1": 180_000}
    assert "GPUs nobody held in cluster 'c1' used 0.05 kWh" in messages
    assert "covers 42.9%" in messages


def test_period_edge_cuts_a_window_pro_rata(store: Store, report: Any) -> None:
    store.alloc("ml", T0, T0 + 2 * H)
    ledger(store, uid(store), [(T0, 1800, 360_000, H), (T0 + H, 3600, 720_000, H)])
    doc = as_json(report, store, "--from", "2026-10-05T10:30:00Z", "--to", "2026-10-05T11:15:00Z")
    ml = rows_by(doc)["ml"]
    # half of the first window and a quarter of the second
    assert ml["gpu_seconds_used"] == 900 + 900
    assert ml["energy_joules"] == 180_000 + 180_000
    assert ml["usage_coverage_ratio"] == 1.0


def test_table_and_csv_carry_the_same_columns(store: Store, report: Any) -> None:
    store.alloc("ml", T0, T0 + 2 * H)
    ledger(store, uid(store), [(T0, 1800, 360_000, H), (T0 + H, 1800, 360_000, H)])
    store.alloc("batch", T0, T0 + H)
    table = report(*WINDOW, *NOW, db=store)
    assert table.rc == 0, table.err
    head = table.out.splitlines()[2]
    for title in ("used GPU-h", "eff. %", "idle alloc GPU-h", "energy kWh", "coverage %"):
        assert title in head
    batch_line = next(line for line in table.out.splitlines() if line.startswith("batch"))
    # raw, phys, share, est.; the ledger's cells blank, never 0
    assert batch_line.split() == ["batch", "1.00", "1.00", "33.33", "0.00"]
    total_line = next(line for line in table.out.splitlines() if line.startswith("TOTAL"))
    assert total_line.split()[-1] == "66.7"  # 2 of 3 allocated GPU-hours covered
    result = report(*WINDOW, *NOW, "--format", "csv", db=store)
    assert result.rc == 0, result.err
    rows = {
        r["namespace"]: r for r in csv.DictReader(io.StringIO(result.out)) if r["row"] == "group"
    }
    # CSV carries the exact figures, unrounded (docs/report.md, "Rounding")
    assert float(rows["ml"]["gpu_hours_used"]) == 1.0
    assert float(rows["ml"]["energy_kwh"]) == 0.2
    assert rows["batch"]["gpu_hours_used"] == ""
    assert rows["batch"]["usage_coverage_pct"] == ""
    assert "no usage data" in result.err


def test_without_a_ledger_the_columns_stay_out(store: Store, report: Any) -> None:
    store.alloc("ml", T0, T0 + H)
    doc = as_json(report, store)
    row = rows_by(doc)["ml"]
    assert "gpu_hours_used" not in row
    assert row["gpu_seconds_used"] is None and row["usage_coverage_ratio"] is None


def test_pod_level_keys_join_by_pod_uid(store: Store, report: Any) -> None:
    store.alloc("ml", T0, T0 + H, owner=("Job", "a"), model=A100, pool="pool-b")
    ledger(store, uid(store), [(T0, 3600, 1000, H)])
    store.alloc("ml", T0, T0 + H, owner=("Job", "b"))
    ledger(store, uid(store), [(T0, 360, 500, H)], device="GPU-1")
    by_owner = rows_by(as_json(report, store, "--by", "owner"), "owner")
    assert by_owner["ml/Job/a"]["gpu_seconds_used"] == 3600
    assert by_owner["ml/Job/b"]["gpu_seconds_used"] == 360
    # the allocation's model and pool (node labels), not the series' NVML name
    by_model = rows_by(as_json(report, store, "--by", "model,pool"), "model")
    assert by_model[A100]["energy_joules"] == 1000
    assert by_model[A100]["group"]["pool"] == "pool-b"
    # namespace labels as they were at each window's start
    store.labels("ml", {"team": "x"}, T0 - H, None)
    by_team = rows_by(as_json(report, store, "--by", "label:team"), "label:team")
    assert by_team["x"]["gpu_seconds_used"] == 3960


def test_a_holder_without_allocation_rows_has_its_devices_node_and_model(
    store: Store, report: Any
) -> None:
    # a pod the controller missed (no allocation row) on a GPU of node-7, and one it saw
    ledger(store, "uid-missed", [(T0, 1800, 1000, H)], name="missed", device="GPU-7", node="node-7")
    store.alloc("ml", T0, T0 + H, pod="seen")
    ledger(store, uid(store), [(T0, 3600, 2000, H)])
    # grouped by the series' own keys (the node: its device's), no join to the allocations
    by_node = rows_by(as_json(report, store, "--by", "node"), "node")
    assert by_node["node-7"]["gpu_seconds_used"] == 1800
    assert by_node["node-1"]["gpu_seconds_used"] == 3600
    # joined to the allocations: the missed pod keeps its series' name, its device's model
    # (the NVML name) and node
    doc = as_json(report, store, "--by", "model,node,pod")
    found = {(r["group"]["model"], r["group"]["node"], r["group"]["pod"]): r for r in doc["rows"]}
    assert found[("NVIDIA H100 80GB HBM3", "node-7", "ml/missed")]["energy_joules"] == 1000
    assert found[(H100, "node-1", "ml/seen")]["energy_joules"] == 2000


def test_a_pod_with_two_resources_is_not_counted_twice(store: Store, report: Any) -> None:
    store.alloc("ml", T0, T0 + H, units=1)
    pod = uid(store)
    with store.engine.begin() as conn:  # the same pod UID with a second GPU resource
        conn.execute(
            insert(UsageSeries.__table__.metadata.tables["allocations"]).values(
                cluster="c1",
                pod_uid=pod,
                namespace="ml",
                pod_name="p",
                node="node-1",
                node_pool="pool-a",
                gpu_model=A100,
                resource_name="nvidia.com/mig-1g.10gb",
                raw_units=1,
                physical_gpus=1 / 7,
                share_numerator=1,
                share_denominator=7,
                started_at=T0,
                ended_at=T0 + H,
                estimated=False,
                updated_at=T0,
            )
        )
    ledger(store, pod, [(T0, 800, 8000, H)])
    doc = as_json(report, store)
    assert rows_by(doc)["ml"]["gpu_seconds_used"] == pytest.approx(800)
    by_resource = rows_by(as_json(report, store, "--by", "resource"), "resource")
    assert by_resource["nvidia.com/gpu"]["gpu_seconds_used"] == pytest.approx(700)
    assert by_resource["nvidia.com/mig-1g.10gb"]["gpu_seconds_used"] == pytest.approx(100)


def claim(store: Store, claim_uid: str, pod_uid: str, pod: str, start: int, end: int) -> None:
    with store.engine.begin() as conn:
        conn.execute(
            insert(ClaimAllocation).values(
                cluster="c1",
                claim_uid=claim_uid,
                pod_uid=pod_uid,
                resource_name="gpu.nvidia.com",
                namespace="dra",
                claim_name="shared",
                pod_name=pod,
                owner_kind="Job",
                owner_name=pod,
                node="node-1",
                node_pool="pool-a",
                gpu_model=A100,
                raw_units=1,
                physical_gpus=1.0,
                share_numerator=1,
                share_denominator=1,
                pod_started_at=start,
                pod_ended_at=end,
                started_at=start,
                ended_at=end if pod == "p1" else start,
                updated_at=start,
            )
        )


def test_claims_join_by_claim_uid(store: Store, report: Any) -> None:
    claim(store, "claim-1", "pod-1", "p1", T0, T0 + H)
    claim(store, "claim-1", "pod-2", "p2", T0, T0 + H)
    ledger(store, "claim-1", [(T0, 2000, 4000, H)], kind="claim", namespace="dra", name="shared")
    doc = as_json(report, store)
    dra = rows_by(doc)["dra"]
    assert dra["gpu_seconds_used"] == 2000 and dra["usage_coverage_ratio"] == 1.0
    by_pod = rows_by(as_json(report, store, "--by", "pod"), "pod")
    assert by_pod["dra/p1"]["gpu_seconds_used"] == 1000  # shared equally by its pods
    assert by_pod["dra/p2"]["gpu_seconds_used"] == 1000
    by_path = rows_by(as_json(report, store, "--by", "path"), "path")
    assert by_path["dra"]["energy_joules"] == 4000


def test_energy_cost_and_carbon_from_the_rate_card(
    store: Store, report: Any, tmp_path: Path
) -> None:
    card = tmp_path / "card.yaml"
    card.write_text(
        "currency: EUR\ndefault_rate: 1\n"
        "energy_price_per_kwh:\n  - rate: 0.5\n  - {rate: 1.0, from: '2026-10-05T11:00:00Z'}\n"
        "carbon_g_per_kwh: 400\n"
    )
    store.alloc("ml", T0, T0 + 2 * H)
    ledger(store, uid(store), [(T0, 1800, 3_600_000, H), (T0 + H, 1800, 3_600_000, H)])
    doc = as_json(report, store, "--rate-card", str(card))
    ml = rows_by(doc)["ml"]
    assert ml["energy_cost_EUR"] == 1.5  # 1 kWh at 0.5, then 1 kWh at 1.0
    assert ml["carbon_kg_co2e"] == 0.8
    assert ml["carbon_grams_co2e"] == 800
    assert ml["cost_EUR"] == 2.0


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("energy_price_per_kwh: -1\n", "energy_price_per_kwh: a rate cannot be negative"),
        (
            "carbon_g_per_kwh:\n  - rate: 300\n  - {rate: 200}\n",
            "carbon_g_per_kwh[1].from: missing",
        ),
        (
            "energy_price_per_kwh:\n  - {rate: 1, from: 2026-10-02}\n"
            "  - {rate: 2, from: 2026-10-01}\n",
            "energy_price_per_kwh[1].from: effective dates must increase",
        ),
    ],
)
def test_energy_rate_card_is_validated(
    report: Any, sqlite_store: Store, tmp_path: Path, text: str, needle: str
) -> None:
    card = tmp_path / "card.yaml"
    card.write_text("default_rate: 1\n" + text)
    assert_refused(report(*WINDOW, "--rate-card", str(card), db=sqlite_store), needle)


def test_idle_allocations(store: Store, report: Any) -> None:
    # idle for 3 h, then busy, still allocated
    store.alloc("ml", T0, None, owner=("Job", "idle"), pod="sleepy")
    windows = [(T0 + i * H, 36.0, 1000, H) for i in range(3)] + [(T0 + 3 * H, 3000, 1000, H)]
    ledger(store, uid(store), windows, progress=T0 + 4 * H)
    # idle for 2 h up to the last ingested window: still idle
    store.alloc("web", T0 + 2 * H, None, units=2, pod="waiting")
    for device in ("GPU-2", "GPU-3"):  # two GPUs, a series each
        ledger(
            store,
            uid(store),
            [(T0 + 2 * H, 5, 1000, H), (T0 + 3 * H, 0, 1000, H)],
            namespace="web",
            device=device,
        )
    # busy
    store.alloc("ml", T0, T0 + H, pod="busy")
    ledger(store, uid(store), [(T0, 3000, 1000, H)], device="GPU-4")
    doc = as_json(report, store, "--idle-allocations", "--now", "2026-10-05T14:00:00Z")
    found = {r["name"]: r for r in doc["idle_allocations"]["rows"]}
    assert set(found) == {"sleepy", "waiting"}
    sleepy, waiting = found["sleepy"], found["waiting"]
    assert sleepy["idle_since"] == "2026-10-05T10:00:00Z"
    assert sleepy["idle_until"] == "2026-10-05T13:00:00Z" and not sleepy["still_idle"]
    assert sleepy["idle_allocated_gpu_hours"] == pytest.approx(3 * (3600 - 36) / 3600, abs=0.01)
    assert sleepy["owner"] == "Job/idle" and sleepy["activity_pct"] == 1.0
    assert waiting["still_idle"] and waiting["idle_until"] is None
    assert waiting["gpus"] == 2
    # a longer minimum leaves only the 3-hour run; a lower threshold leaves none
    doc = as_json(report, store, "--idle-allocations", "--idle-for", "150m")
    assert [r["name"] for r in doc["idle_allocations"]["rows"]] == ["sleepy"]
    doc = as_json(report, store, "--idle-allocations", "--idle-threshold", "0.5%")
    assert [r["name"] for r in doc["idle_allocations"]["rows"]] == ["waiting"]
    table = report(*WINDOW, *NOW, "--idle-allocations", db=store)
    assert table.rc == 0 and "Idle allocations (activity under 5.0% for at least 1h" in table.out
    assert "sleepy" in table.out
    result = report(*WINDOW, *NOW, "--idle-allocations", "--format", "csv", db=store)
    idle = [r for r in csv.DictReader(io.StringIO(result.out)) if r["row"] == "idle_allocation"]
    assert {r["name"] for r in idle} == {"sleepy", "waiting"}


def test_idle_threshold_is_checked(report: Any, sqlite_store: Store) -> None:
    assert_refused(
        report(*WINDOW, "--idle-allocations", "--idle-threshold", "lots", db=sqlite_store),
        "--idle-threshold",
        "'lots' is no ratio (0.05) or percentage (5%)",
    )
    assert_refused(
        report(*WINDOW, "--idle-threshold", "120%", db=sqlite_store),
        "--idle-threshold",
        "'120%' is outside 0-1",
    )


def test_idle_threshold_reads_as_the_controllers(report: Any, sqlite_store: Store) -> None:
    """Issue 27 (fails on 4b1b947, where the report read 0.05 as 0.05 % and 5 as 5 %): a bare
    number is the controller's ratio, a percentage carries its sign, and a bare number over 1
    (the old percentage spelling) is refused instead of guessed."""
    from fractions import Fraction

    from gpuquota.cli_common.commandline import OneLineParser
    from gpuquota.quota.controller import cli as controller_cli
    from gpuquota.quota.report import cli as report_cli

    for spelling in ("0.05", "5%"):
        parser = OneLineParser(prog="gpuquota")
        controller_cli.add_arguments(parser)
        args, _ = parser.parse_known_args(["--idle-threshold", spelling])
        assert args.idle_threshold == Fraction(5, 100), spelling
        parser = OneLineParser(prog="gpuquota")
        report_cli.add_arguments(parser)
        args, _ = parser.parse_known_args(["--idle-threshold", spelling])
        assert report_cli.request_of(args).idle_threshold == Fraction(5, 100), spelling
    assert_refused(
        report(*WINDOW, "--idle-threshold", "5", db=sqlite_store),
        "--idle-threshold",
        "for a percentage write 5%",
    )


def _window(start: int, used: float, sampled: float = H, *, last: bool = False) -> Any:
    """One window of a pod holding one GPU."""
    from fractions import Fraction

    from gpuquota.quota.report.query import HolderWindow

    return HolderWindow(
        ("c1", "pod", "u1"),
        "ml",
        "p",
        None,
        Fraction(1),
        True,
        start,
        start + H,
        used,
        sampled,
        last,
    )


def test_idle_runs_break_at_holes_and_unsampled_windows() -> None:
    from fractions import Fraction

    from gpuquota.quota.report.compute import idle_runs

    quiet = [_window(T0, 10), _window(T0 + H, 10)]
    hole = [_window(T0 + 3 * H, 10)]  # T0 + 2H missing: a new run
    unsampled = [_window(T0 + 4 * H, 0, 0), _window(T0 + 5 * H, 0, last=True)]
    runs = idle_runs([*quiet, *hole, *unsampled], Fraction(5, 100), H, T0, T0 + 24 * H)
    assert sorted((r.since, r.until, r.still_idle) for r in runs) == [
        (T0, T0 + 2 * H, False),
        (T0 + 3 * H, T0 + 4 * H, False),
        (T0 + 5 * H, T0 + 6 * H, True),
    ]
    # the period cuts a run: only the part inside counts toward the minimum
    assert idle_runs(quiet, Fraction(5, 100), 2 * H, T0 + H // 2, T0 + 24 * H) == []
    # at the threshold is not under it
    assert idle_runs([_window(T0, 180)], Fraction(5, 100), H, T0, T0 + H) == []


def test_the_computed_report_is_frozen(store: Store) -> None:
    from dataclasses import FrozenInstanceError

    from gpuquota.quota.report import build, period
    from gpuquota.quota.store import db

    store.alloc("ml", T0, T0 + H)
    window = period.resolve(
        now=T0 + 2 * H, tz_name="UTC", start=None, end=None, month=None, last=2 * H
    )
    request = build.ReportRequest(window=window, now=T0 + 2 * H)
    with db.reading(store.url) as conn:
        fetched = build.fetch(conn, request)
    computed = build.compute_report(fetched, request)  # no connection needed any more
    with pytest.raises(FrozenInstanceError):
        computed.groups = []
    with pytest.raises(FrozenInstanceError):
        computed.groups[0].raw_seconds = 0
    assert computed.groups[0].raw_seconds == H
