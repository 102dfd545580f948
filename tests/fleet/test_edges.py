"""`gpuquota gpus` at the edges where an RMA case is decided, on series written for them into
a real Prometheus and ingested into a store of either kind: a relapse whose release fell in
the period before, a board whose first fact (a fence dated by the agent's own second) comes
before its first reading, a relapse on the scrape right after the release, across a window's
edge too, and durations of seconds. Expected figures are worked out by hand from the boards
below (every 15 s; the windows are an hour: A, B, C, D as in tests/fleet/scenario.py)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from gpuquota.quota.ledger.ingest import Ingester
from tests.fleet.scenario import BORN, END, STEP, A, B, C, D, Seen, openmetrics
from tests.fleet.test_gpus_cli import gpus, iso
from tests.fleet.test_history import TURNS, settings
from tests.prometheus import Prometheus, create_blocks, serving

XID79 = (("xid_79", "reboot_node"),)
# (from, state, since) in time order: the board's verdict from that reading on
E1 = ((BORN, "healthy", BORN), (B - 900, "unhealthy", B - 900), (B - 60, "healthy", B - 60),
      (B + 60, "unhealthy", B + 60), (B + 600, "healthy", B + 600))  # fmt: skip
# first read at A+15 already fenced since A+14; the second fence holds across B
E2 = ((A + 15, "unhealthy", A + 14), (A + 600, "healthy", A + 600),
      (A + 900, "unhealthy", A + 900), (B + 300, "healthy", B + 300))  # fmt: skip
# released on the last scrape of window A, fenced again on the first of B, dated B-2
E3 = ((BORN, "healthy", BORN), (B - 300, "unhealthy", B - 300), (B - 15, "healthy", B - 15),
      (B, "unhealthy", B - 2), (B + 300, "healthy", B + 300))  # fmt: skip
# fenced for one scrape, released for one, fenced for one: 30 s fenced, a 15 s recovery
E4 = ((BORN, "healthy", BORN), (A + 300, "unhealthy", A + 300), (A + 315, "healthy", A + 315),
      (A + 330, "unhealthy", A + 330), (A + 345, "healthy", A + 345))  # fmt: skip
SILENT = (A + 1515, A + 1530)  # E4 not scraped: a 45 s gap (max_gap 30 here)
BOARDS = {"E1": E1, "E2": E2, "E3": E3, "E4": E4}
MAX_GAP = 30
WINDOW_PAD = 3600


def board(serial: str, t: int) -> Seen | None:
    steps = BOARDS[serial]
    if t < steps[0][0] or (serial == "E4" and t in SILENT):
        return None
    _, state, since = [s for s in steps if s[0] <= t][-1]
    reasons = XID79 if state == "unhealthy" else ()
    fences = sum(1 for s in steps if s[1] == "unhealthy" and s[0] <= t)
    xids = (("79", fences),) if fences else ()
    uuid = f"GPU-{serial.lower()}"
    pci = f"00000000:{10 + int(serial[1:])}:00.0"
    return Seen(serial, uuid, "node-3", pci, state, since, reasons, xids)


def samples() -> Iterator[tuple[int, Seen]]:
    for t in range(BORN, END, STEP):
        for serial in BOARDS:
            found = board(serial, t)
            if found is not None:
                yield t, found


@pytest.fixture(scope="module")
def edges_prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    work = tmp_path_factory.mktemp("edges")
    create_blocks(openmetrics(samples(), pods=()), work / "tsdb", work)
    with serving(work / "tsdb", work) as prometheus:
        yield prometheus


@pytest.fixture
def ingested(edges_prometheus: Prometheus, db_url: str, cluster: str) -> list[str]:
    """The store's history of the boards; the arguments that name it."""
    wanted = replace(settings(edges_prometheus.url), max_gap=MAX_GAP)
    ingester = Ingester(db_url, cluster, wanted, clock=lambda: D + 300, turns=TURNS)
    ingester.run_once()
    ingester.stop()
    return ["--db", db_url, "--cluster", cluster, "--tz", "UTC"]


def period(lo: int, hi: int) -> list[str]:
    return ["--from", iso(lo), "--to", iso(hi)]


def at(t: int) -> str:
    return iso(t).replace("Z", "+00:00")


def by_serial(out: str) -> dict[str, dict]:
    return {g["serial"]: g for g in json.loads(out)["gpus"]}


def test_a_relapse_counts_in_the_period_of_its_fence_wherever_the_release_fell(
    ingested: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """E1 is released at B-60 and fenced again at B+60: B's relapse (its view dropped it)."""
    code, out, err = gpus(capsys, *ingested, *period(B, C), "--json")
    assert (code, err) == (0, "")
    e1 = by_serial(out)["E1"]
    assert (e1["fences"], e1["relapses"]) == ([at(B + 60)], 1)
    release, holding = e1["recoveries"]  # the release before the period that B's fence follows
    assert (release["released"], release["fenced_again"], release["relapse"]) == (
        at(B - 60), at(B + 60), True
    )  # fmt: skip
    assert (holding["released"], holding["holding"]) == (at(B + 600), True)
    # A's view: its fence, no relapse of its own (the fence after its release is B's)
    code, out, _ = gpus(capsys, *ingested, *period(A, B), "--json")
    e1 = by_serial(out)["E1"]
    assert (e1["fences"], e1["relapses"]) == ([at(B - 900)], 0)
    # the rates per node count it in B as well
    code, out, _ = gpus(capsys, *ingested, *period(B, C), "--by", "node", "--json")
    (node,) = json.loads(out)["groups"]
    assert (node["group"], node["relapses"]) == ("node-3", 1)  # E1 in B (E3's fence is A's)


def test_the_evidence_tells_the_story_of_the_table(
    ingested: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """E2's first fact is its fence, dated A+14 by its agent, a second before the first reading
    (first_seen); its second fence holds across the edge of two windows. The evidence file,
    the table, CSV and JSON: the same fences, relapses and hours."""
    whole = period(A - WINDOW_PAD, D + WINDOW_PAD)
    code, out, _ = gpus(capsys, *ingested, *whole, "--json", "--serial", "E2")
    row = by_serial(out)["E2"]
    assert (row["fences"], row["relapses"]) == ([at(A + 14), at(A + 900)], 1)
    assert row["fenced_hours"] == (585 + B + 300 - (A + 900)) / 3600
    base = tmp_path / "rma-e2"
    code, out, err = gpus(capsys, *ingested, "--serial", "E2", "--evidence", str(base))
    assert (code, out) == (0, "") and "wrote" in err
    doc = json.loads(base.with_suffix(".json").read_text())
    assert doc["summary"] == row
    assert doc["board"]["first_fact"] == at(A + 14)
    # one fenced stretch per fence (the one across B is one), adding up to the fenced hours
    assert [(f["from"], f["until"]) for f in doc["fenced"]] == [
        (at(A + 15), at(A + 600)), (at(A + 900), at(B + 300))
    ]  # fmt: skip
    assert sum(f["seconds"] for f in doc["fenced"]) == row["fenced_hours"] * 3600
    fences = [e for e in doc["timeline"] if e["kind"] == "verdict" and e["state"] == "unhealthy"]
    assert [e["at"] for e in fences] == row["fences"]
    text = base.with_suffix(".txt").read_text()
    assert "fences         2 (relapses 1)" in text
    # the CSV's figures are the JSON's, exact
    code, out, _ = gpus(capsys, *ingested, *whole, "--format", "csv", "--serial", "E2")
    (line,) = csv.DictReader(io.StringIO(out))
    assert (float(line["fenced_h"]), float(line["observed_h"])) == (
        row["fenced_hours"], row["observed_hours"]
    )  # fmt: skip
    assert (int(line["fences"]), int(line["relapses"])) == (2, 1)


def test_a_board_fenced_on_the_scrape_after_its_release_relapsed(
    ingested: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """E4 is fenced again on the scrape right after its release; E3 too, across the edge of
    two windows, its fence dated two seconds before the window it was read in."""
    code, out, _ = gpus(capsys, *ingested, *period(A, D), "--json")
    assert code == 0
    got = by_serial(out)
    e4, e3 = got["E4"], got["E3"]
    assert (e4["fences"], e4["relapses"]) == ([at(A + 300), at(A + 330)], 1)
    assert e4["recoveries"][0]["held_hours"] == 15 / 3600
    assert (e3["fences"], e3["relapses"]) == ([at(B - 300), at(B - 2)], 1)
    assert e3["recoveries"][0]["fenced_again"] == at(B - 2)


def test_seconds_are_shown_as_seconds(
    ingested: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """E4: 30 s fenced in two fences, a 15 s recovery, a 45 s gap: the table and the evidence
    say so (they said FENCED_H 0.01, "0m relapse" and "not seen for 0m")."""
    code, out, _ = gpus(capsys, *ingested, *period(A, B), "--serial", "E4")
    assert code == 0
    head, row = out.splitlines()[1:3]
    starts = [i for i, c in enumerate(head) if c != " " and (i == 0 or head[i - 1] == " ")]
    cells = {
        head[a:b].strip().lower(): row[a:b].strip()
        for a, b in zip(starts, [*starts[1:], None], strict=True)
    }
    assert (cells["fenced"], cells["fences"], cells["relapses"]) == ("30s", "2", "1")
    # released at A+345, holding until it was last seen (D-15: windows A to C are ingested)
    assert cells["recoveries"] == "15s relapse, holding 2.9h"
    base = tmp_path / "rma-e4"
    gpus(capsys, *ingested, "--serial", "E4", "--evidence", str(base))
    text = base.with_suffix(".txt").read_text()
    assert "not seen for 45s" in text and "fenced 30s" in text
