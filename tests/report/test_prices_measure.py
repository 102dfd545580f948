"""Prices never change measurements (issue #36, item 4): a rate card changes cost columns only,
its ``mig_fractions`` price MIG instances apart from the physical GPU-hours that share,
efficiency and idle use, and every table of one report agrees on physical GPU-hours."""

from __future__ import annotations

import csv
import io
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert

from gpuquota.quota.report.compute import round_half_up
from gpuquota.quota.store.models import Gap
from tests.report.conftest import H100, Store, ts
from tests.report.helpers import doc_of, known, ledger, uid

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_CARD = ROOT / "docs" / "examples" / "ratecard.yaml"  # 3g.40gb: 0.5, 1g.10gb: 0.125
H = 3600
OCT5 = ts("2026-10-05T00:00:00")
PERIOD = ("--from", "2026-10-05T00:00:00Z", "--to", "2026-10-06T00:00:00Z")
MIG3 = "nvidia.com/mig-3g.40gb"


def fill(store: Store, *, begins: int = OCT5, gap: tuple[int, int] | None = None) -> None:
    """The ledger demo's shape in small: a whole-GPU trainer, a service on a 3g.40gb MIG
    instance (mixed strategy) and one on a single-strategy 1g.10gb node, each with ledger
    windows; capacity for the idle table."""
    known(store, begins, OCT5 + 24 * H)
    if gap is not None:
        with store.engine.begin() as conn:
            conn.execute(
                insert(Gap).values(
                    cluster="c1", kind="Pod", started_at=gap[0], ended_at=gap[1], reason="restart"
                )
            )
    store.capacity("gpu-a", OCT5 - 48 * H, None, units=2)
    store.capacity("gpu-b", OCT5 - 48 * H, None, units=7, physical=3, resource=MIG3)
    store.capacity("gpu-c", OCT5 - 48 * H, None, units=7, physical=1, pool="pool-b")
    store.alloc("train", OCT5 - 2 * H, OCT5 + 10 * H, units=2, node="gpu-a")
    ledger(store, uid(store), [(OCT5 + i * H, 0.5 * H, 1e5, H) for i in range(10)],
           namespace="train", device="GPU-a")  # fmt: skip
    store.alloc("inference", OCT5, OCT5 + 12 * H, units=1, physical=3 / 7, resource=MIG3,
                node="gpu-b")  # fmt: skip
    ledger(store, uid(store), [(OCT5 + i * H, 0.15 * H, 4e4, H) for i in range(12)],
           namespace="inference", device="MIG-b", mig_profile="3g.40gb")  # fmt: skip
    store.alloc("notebook", OCT5 + H, OCT5 + 9 * H, units=3, physical=3 / 7, node="gpu-c",
                pool="pool-b", mig_profile="1g.10gb")  # fmt: skip
    ledger(store, uid(store), [(OCT5 + H + i * H, 0.01 * H, 1e4, H) for i in range(8)],
           namespace="notebook", device="MIG-c", mig_profile="1g.10gb")  # fmt: skip


def price_column(name: str) -> bool:
    """Columns a rate card adds: money, the GPU-hours it prices, and carbon (energy x the
    card's intensity)."""
    return name.startswith(
        ("cost_", "energy_cost_", "idle_cost_", "spread_idle_cost_", "carbon_")
    ) or (name == "gpu_hours_priced")


def measurements(doc: dict[str, Any]) -> dict[str, Any]:
    """Every figure of the report's JSON but the price columns."""

    def strip(row: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in row.items() if not price_column(k)}

    return {
        "rows": {tuple(r["group"].values()): strip(r) for r in doc["rows"]},
        "total": strip(doc["total"]),
        "idle": [strip(r) for r in doc["idle"]["rows"]],
        "idle_total": strip(doc["idle"]["total"]),
    }


@pytest.mark.parametrize("keys", ["namespace", "model,pool", "namespace,resource"])
def test_a_rate_card_changes_cost_columns_only(store: Store, report: Any, keys: str) -> None:
    fill(store)
    argv = (*PERIOD, "--by", keys, "--spread-idle", "proportional")
    plain = doc_of(report, store, *argv)
    priced = doc_of(report, store, *argv, "--rate-card", str(EXAMPLE_CARD))
    assert measurements(priced) == measurements(plain)
    if keys == "namespace":
        rows = {r["group"]["namespace"]: r for r in priced["rows"]}
        inference = rows["inference"]
        # physical: the store's 3/7 of a GPU for 12 h; the card prices it as 0.5 of one
        assert inference["gpu_hours_physical"] == pytest.approx(12 * 3 / 7)
        assert inference["gpu_hours_priced"] == 6.0
        assert inference["cost_USD"] == pytest.approx(6.0 * 4.10)
        # used 0.15 of an hour each hour: efficiency against the physical 3/7
        assert inference["efficiency_pct"] == pytest.approx(0.15 * 100 * 7 / 3)
        notebook = rows["notebook"]
        assert notebook["gpu_hours_physical"] == pytest.approx(8 * 3 / 7)
        assert notebook["gpu_hours_priced"] == pytest.approx(8 * 3 * 0.125)
        assert rows["train"]["gpu_hours_priced"] == rows["train"]["gpu_hours_physical"]
        assert priced["total"]["share_pct"] == 100.0
    # the table: the same figures, cost columns beside them
    table = report(*argv, "--rate-card", str(EXAMPLE_CARD), "--now", "2026-11-22T00:00:00Z",
                   db=store)  # fmt: skip
    assert table.rc == 0, table.err
    plain_table = report(*argv, "--now", "2026-11-22T00:00:00Z", db=store)
    assert "GPU-h priced" in table.out and "GPU-h priced" not in plain_table.out


def test_without_a_mig_fraction_in_the_card_no_priced_column(store: Store, report: Any,
                                                             tmp_path: Path) -> None:  # fmt: skip
    fill(store)
    card = tmp_path / "card.yaml"
    card.write_text(f"default_rate: 2\nmodels:\n  {H100}: 3\n")
    doc = doc_of(report, store, *PERIOD, "--rate-card", str(card))
    assert all("gpu_hours_priced" not in r for r in doc["rows"])
    for r in doc["rows"]:
        assert r["cost_USD"] == pytest.approx(r["gpu_hours_physical"] * 3)


def exact_tables(doc: dict[str, Any]) -> tuple[float, float]:
    """The usage table's physical total and the idle table's allocated + uncovered allocated."""
    idle = doc["idle"]["total"]
    return (
        doc["total"]["gpu_hours_physical"],
        idle["allocated_gpu_hours"] + idle.get("uncovered_allocated_gpu_hours", 0.0),
    )


@pytest.mark.parametrize("card", [False, True])
def test_every_table_agrees_on_physical_gpu_hours(store: Store, report: Any, card: bool) -> None:
    # the data begins 1 h into the period (the trainer ran since before) and pods were not
    # followed for an hour: allocations there are billed but are not set against capacity
    fill(store, begins=OCT5 + H, gap=(OCT5 + 4 * H, OCT5 + 5 * H))
    priced = ("--rate-card", str(EXAMPLE_CARD)) if card else ()
    doc = doc_of(report, store, *PERIOD, "--idle", *priced)
    # exact: 2 GPUs x 10 h, 3/7 x 12 h, 3/7 x 8 h
    whole = Fraction(20) + Fraction(3, 7) * 12 + Fraction(3, 7) * 8
    total, idle = exact_tables(doc)
    assert total == pytest.approx(float(whole), abs=1e-9)
    assert idle == pytest.approx(total, abs=1e-9)
    # outside the covered time: the first hour (trainer, inference) and the gap's hour (all)
    outside = Fraction(2) + Fraction(3, 7) + Fraction(2) + Fraction(3, 7) + Fraction(3, 7)
    uncovered = doc["idle"]["total"]["uncovered_allocated_gpu_hours"]
    assert uncovered == pytest.approx(float(outside), abs=1e-9)
    # per model and pool, the idle table's rows are the usage table's
    by_pool = doc_of(report, store, *PERIOD, "--idle", "--by", "model,pool", *priced)
    usage = {tuple(r["group"].values()): r["gpu_hours_physical"] for r in by_pool["rows"]}
    idle_rows = {
        (r["model"], r["node_pool"]): r["allocated_gpu_hours"]
        + r.get("uncovered_allocated_gpu_hours", 0.0)
        for r in by_pool["idle"]["rows"]
        if r["allocated_gpu_hours"] or r.get("uncovered_allocated_gpu_hours")
    }
    assert usage.keys() == idle_rows.keys()
    for key, hours in usage.items():
        assert idle_rows[key] == pytest.approx(hours, abs=1e-9), key
    # printed: each figure rounded half up from its own exact value (docs/report.md)
    table = report(*PERIOD, "--idle", *priced, "--now", "2026-11-22T00:00:00Z", db=store)
    assert table.rc == 0, table.err
    totals = [line.split() for line in table.out.splitlines() if line.startswith("TOTAL")]
    main, idle_line = totals[0], totals[1]
    assert main[2] == shown(whole)
    allocated = Fraction(doc["idle"]["total"]["allocated_gpu_hours"]).limit_denominator(7000)
    assert idle_line[2] == shown(allocated)
    assert idle_line[-2] == shown(outside)  # uncovered alloc GPU-h, before idle %
    assert allocated + outside == whole


def shown(hours: Fraction) -> str:
    """A GPU-hour figure as the table prints it."""
    n = round_half_up(hours * 100)
    return f"{n // 100}.{n % 100:02d}"


def test_the_focus_export_consumes_physical_and_prices_the_cards_fraction(
    store: Store, report: Any
) -> None:
    fill(store)
    argv = (*PERIOD, "--now", "2026-11-22T00:00:00Z", "--rate-card", str(EXAMPLE_CARD))
    result = report(*argv, "--format", "focus", db=store)
    assert result.rc == 0, result.err
    rows = {
        (r["SubAccountId"].rpartition("/")[2], r["SkuId"]): r  # SubAccountId: cluster/namespace
        for r in csv.DictReader(io.StringIO(result.out))
        if r["SkuMeter"] == "GPU allocation"
    }
    inference = rows[("inference", f"gpu/{H100}/{MIG3}")]
    # consumed: the report's physical GPU-hours (3/7 x 12 h); priced: the card's 0.5 x 12 h
    assert Fraction(inference["ConsumedQuantity"]) == round(Fraction(3, 7) * 12, 6)
    assert Fraction(inference["PricingQuantity"]) == 6
    assert Fraction(inference["BilledCost"]) == Fraction(inference["ListUnitPrice"]) * 6
    train = rows[("train", f"gpu/{H100}/nvidia.com/gpu")]
    assert train["ConsumedQuantity"] == train["PricingQuantity"] == "20.000000"
