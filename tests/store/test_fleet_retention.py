"""`gpuquota db prune` and the fleet history (issue 37): kept by board, not by time. A board
last seen before the cut-off goes whole; one last seen fenced (pulled for an RMA whose case
may be open) stays a year longer; a board still in the fleet keeps all of its history, its
stretches and events before the cut-off too. On both databases."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from gpuquota.quota import cli
from gpuquota.quota.fleet import query
from gpuquota.quota.fleet.rules import Event, Identity, Stretch, WindowHistory
from gpuquota.quota.fleet.write import FleetStore, table
from gpuquota.quota.store import daytwo, db
from gpuquota.quota.store.models import GpuBoard

DAY = 86400
CUT = 1767225600  # 2026-01-01T00:00:00Z
START = CUT - 500 * DAY


def board(history: WindowHistory, serial: str, lo: int, hi: int, states: list[str]) -> None:
    """A board seen from lo to hi, its verdict changing to each of ``states`` in turn."""
    who = Identity(f"GPU-{serial}", "node-1")
    step = (hi - lo) // len(states)
    previous = None
    for i, state in enumerate(states):
        a = lo + i * step
        history.stretches.append(Stretch(serial, a, a + step, who, state, False))
        detail = {"state": state, "previous": previous, "reasons": [], "pairs": []}
        history.events.append(Event(serial, a, a, "verdict", "verdict", detail))
        previous = state
    history.first_seen[serial], history.last_seen[serial] = lo, hi


def test_prune_keeps_the_fleet_history_by_board(
    empty_db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db.upgrade(empty_db_url)
    history = WindowHistory()
    board(history, "gone", CUT - 10 * DAY, CUT - 5 * DAY, ["healthy", "unhealthy", "healthy"])
    board(history, "rma", CUT - 10 * DAY, CUT - 5 * DAY, ["healthy", "unhealthy"])
    board(history, "old-rma", CUT - 400 * DAY, CUT - 390 * DAY, ["healthy", "unhealthy"])
    board(history, "serving", CUT - 10 * DAY, CUT + DAY, ["healthy", "unhealthy", "healthy"])
    with db.open_store(empty_db_url) as store:
        FleetStore(store, "c").replace_window(START, 510 * DAY, history)

    code = cli.main(["db", "prune", "--db", empty_db_url, "--before", "2026-01-01"])
    out = capsys.readouterr().out
    shown = {ln.split()[-1]: int(ln.split()[-2]) for ln in out.splitlines()[:-1]}
    assert code == 0
    # gone: 3 stretches and 3 verdicts; old-rma: 2 and 2
    assert (shown["gpu_boards"], shown["gpu_observations"], shown["gpu_events"]) == (2, 5, 5)
    found = daytwo.prune(empty_db_url, CUT, apply=True)
    assert {p.table: p.rows for p in found if p.table.startswith("gpu_")} == {
        "gpu_boards": 2, "gpu_observations": 5, "gpu_events": 5
    }  # fmt: skip
    b = table(GpuBoard)
    with db.open_store(empty_db_url) as store, store.engine.connect() as conn:
        assert sorted(conn.execute(select(b.c.serial)).scalars()) == ["rma", "serving"]
        kept = {h.serial: h for h in query.load(conn, "c", 0, 2**62)}
    # what stays is whole: the stretches and events before the cut-off too
    first = kept["serving"].stretches[0]
    assert (first.start, first.state) == (CUT - 10 * DAY, "healthy")
    assert len(kept["serving"].events) == 3 and len(kept["rma"].stretches) == 2
    again = daytwo.prune(empty_db_url, CUT, apply=False)
    assert all(p.rows == 0 for p in again if p.table.startswith("gpu_"))
