"""The FOCUS export read as a FinOps analyst reads it (issue #36, "done when"): the file of a
two-cluster store loaded into DuckDB as it is, grouped by cluster, team tag, day and unit,
gives back every figure `gpuquota report` prints for the same period: allocated physical
GPU-hours and their cost, used GPU-hours, energy and its cost per cluster, team and day, and
each cluster's spread idle GPU-hours and cost per team. The queries are docs/report.md's."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import duckdb

from tests.report.conftest import Store
from tests.report.focus_fleet import CARD, PERIOD, fleet
from tests.report.helpers import NOW

# docs/report.md, "The analyst's queries": one row per cluster, team, day and unit
BY_TEAM_DAY = """
SELECT x_Cluster AS cluster,
       json_extract_string(Tags, '$.team') AS team,
       strftime(CAST(ChargePeriodStart AS TIMESTAMPTZ) AT TIME ZONE 'UTC', '%Y-%m-%d') AS day,
       ConsumedUnit AS unit,
       SUM(ConsumedQuantity) AS quantity,
       SUM(BilledCost) AS cost
FROM focus
GROUP BY ALL
ORDER BY ALL
"""


def test_an_analyst_gets_every_figure_of_the_report_back(
    report: Any, store: Store, tmp_path: Path
) -> None:
    fleet(store)
    card = tmp_path / "card.yaml"
    card.write_text(CARD)
    path = tmp_path / "focus.csv"
    result = report(*PERIOD, *NOW, "--rate-card", str(card), "--format", "focus",
                    "--focus-tags", "team", "--spread-idle", "proportional",
                    "--output", str(path), db=store)  # fmt: skip
    assert result.rc == 0, result.err
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    # as a FinOps tool imports it: the CSV as it is, its column types inferred
    con.execute(f"CREATE TABLE focus AS SELECT * FROM read_csv('{path}', header = true)")
    types = dict(con.execute("SELECT column_name, column_type FROM (DESCRIBE focus)").fetchall())
    assert types["BilledCost"].startswith(("DOUBLE", "DECIMAL"))
    assert types["ConsumedQuantity"].startswith(("DOUBLE", "DECIMAL"))
    got: dict[tuple[str, str, str, str], tuple[Fraction, Fraction]] = {
        (cluster, team, day, unit): (Fraction(str(q)), Fraction(str(c)))
        for cluster, team, day, unit, q, c in con.execute(BY_TEAM_DAY).fetchall()
    }
    units = {k[3] for k in got}
    assert units == {"GPU-Hours", "Used GPU-Hours", "kWh", "Idle GPU-Hours"}
    close = Fraction(1, 10**4)  # six decimals a row, a few rows a group

    def near(a: Fraction, b: Any) -> bool:
        return abs(a - Fraction(str(b or 0))) < close

    # each day's report, by cluster and team: allocated, cost, used, energy, energy cost
    checked = 0
    reported: set[tuple[str, str, str]] = set()
    for day, end in (("2026-10-05", "2026-10-06"), ("2026-10-06", "2026-10-07")):
        doc = json.loads(
            report("--from", day, "--to", end, *NOW, "--rate-card", str(card), "--by",
                   "cluster,label:team", "--json", db=store).out
        )  # fmt: skip
        for row in doc["rows"]:
            key = (row["group"]["cluster"], row["group"]["label:team"], day)
            hours, cost = got.get((*key, "GPU-Hours"), (Fraction(0), Fraction(0)))
            assert near(hours, row["gpu_hours_physical"]), (key, hours, row)
            assert near(cost, row["cost_USD"]), (key, cost, row)
            used, zero = got.get((*key, "Used GPU-Hours"), (Fraction(0), Fraction(0)))
            assert near(used, row["gpu_hours_used"]) and zero == 0, (key, used, row)
            kwh, energy_cost = got.get((*key, "kWh"), (Fraction(0), Fraction(0)))
            assert near(kwh, row["energy_kwh"]), (key, kwh, row)
            assert near(energy_cost, row["energy_cost_USD"]), (key, energy_cost, row)
            checked += 1
            reported.add(key)
    # 2 clusters x (research and web on day one, research alone on day two)
    assert checked == 6
    # and no figure beyond the report's: every group of the file is one it printed
    assert {k[:3] for k in got if k[3] != "Idle GPU-Hours"} == reported
    # each cluster's idle is spread among its own namespaces: `--cluster C --spread-idle`
    for cluster in ("alpha", "beta"):
        doc = json.loads(
            report(*PERIOD, *NOW, "--rate-card", str(card), "--cluster", cluster, "--by",
                   "label:team", "--spread-idle", "proportional", "--json", db=store).out
        )  # fmt: skip
        for row in doc["rows"]:
            team = row["group"]["label:team"]
            parts = [
                v for k, v in got.items() if k[:2] == (cluster, team) and k[3] == "Idle GPU-Hours"
            ]
            hours = sum((h for h, _ in parts), Fraction(0))
            cost = sum((c for _, c in parts), Fraction(0))
            assert near(hours, row["spread_idle_gpu_hours"]), (cluster, team, hours, row)
            assert near(cost, row["spread_idle_cost_USD"]), (cluster, team, cost, row)
    # the bill: every row's BilledCost is the report's cost + energy + spread idle cost
    (billed,) = con.execute("SELECT SUM(BilledCost) FROM focus").fetchone() or (None,)
    whole = json.loads(
        report(*PERIOD, *NOW, "--rate-card", str(card), "--by", "cluster", "--json",
               db=store).out
    )["total"]  # fmt: skip
    spread = sum(
        json.loads(
            report(*PERIOD, *NOW, "--rate-card", str(card), "--cluster", c, "--spread-idle",
                   "proportional", "--json", db=store).out
        )["total"]["spread_idle_cost_USD"]
        for c in ("alpha", "beta")
    )  # fmt: skip
    expected = Fraction(str(whole["cost_USD"])) + Fraction(str(whole["energy_cost_USD"]))
    assert near(Fraction(str(billed)), expected + Fraction(str(spread)))
