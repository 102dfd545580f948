"""The fleet history's ingestion against a real Prometheus serving the scenario's samples
(tests/fleet/scenario.py) and a real store of either kind: stretches and events by serial
through a controller restart, an agent restart, a GPU moved to another node, a gap in what was
scraped, and ingesting again."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sqlalchemy import select

from gpuquota.quota import prompieces
from gpuquota.quota.controller.metrics import ledger_samples
from gpuquota.quota.fleet import ingest, source
from gpuquota.quota.fleet.write import FleetStore, table
from gpuquota.quota.ledger.ingest import Ingester, LedgerSettings
from gpuquota.quota.store.db import open_store
from gpuquota.quota.store.models import GpuBoard, GpuEvent, GpuObservation
from tests.fleet.scenario import BORN, MODEL, RESTART, WINDOW, A, B, C, D
from tests.prometheus import Prometheus

TURNS = (ingest.turn,)  # as the controller passes it


def settings(url: str) -> LedgerSettings:
    return LedgerSettings(
        prometheus_url=url, window=WINDOW, delay=300, lookback=0, backfill=4 * WINDOW
    )


def dump(db_url: str, cluster: str) -> dict[str, Any]:
    """The cluster's history, without ids: what two ingestions must agree on."""
    b, o, e = table(GpuBoard), table(GpuObservation), table(GpuEvent)
    with open_store(db_url) as store, store.engine.connect() as conn:
        serial = dict(conn.execute(select(b.c.id, b.c.serial).where(b.c.cluster == cluster)).all())
        boards = sorted(
            (r.serial, r.first_seen, r.last_seen)
            for r in conn.execute(select(b).where(b.c.cluster == cluster))
        )
        stretches = sorted(
            (serial[r.board_id], r.started_at, r.ended_at, r.uuid, r.node, r.state, r.lost)
            for r in conn.execute(select(o).where(o.c.cluster == cluster))
        )
        events = sorted(
            (serial[r.board_id], r.seen, r.at, r.kind, r.key, repr(sorted(r.detail.items())))
            for r in conn.execute(select(e).where(e.c.cluster == cluster))
        )
    return {"boards": boards, "stretches": stretches, "events": events}


def events(history: dict[str, Any], serial: str, kind: str) -> list[tuple[Any, ...]]:
    return [x for x in history["events"] if x[0] == serial and x[3] == kind]


def observed(
    history: dict[str, Any], serial: str, lo: int, hi: int, state: str | None = None
) -> int:
    return sum(
        max(0, min(x[2], hi) - max(x[1], lo))
        for x in history["stretches"]
        if x[0] == serial and (state is None or x[5] == state)
    )


def test_history_by_serial_through_restarts_moves_and_gaps(
    fleet_prometheus: Prometheus, db_url: str, cluster: str
) -> None:
    # the controller ingests up to B, stops, and a new one (its own store handle, the ledger's
    # process) catches up on B and C after its downtime
    first = Ingester(
        db_url, cluster, settings(fleet_prometheus.url), clock=lambda: B + 300, turns=TURNS
    )
    first.run_once()
    first.stop()
    with open_store(db_url) as store:
        assert FleetStore(store, cluster).progress().ingested_until == B  # type: ignore[union-attr]
    second = Ingester(
        db_url, cluster, settings(fleet_prometheus.url), clock=lambda: D + 300, turns=TURNS
    )
    second.run_once()
    second.stop()
    history = dump(db_url, cluster)
    # the controller's fence and relapse gauges, from the ledger process' facts
    samples = ledger_samples(second.facts)
    assert samples["fleet_gpu_fences"] == [(("S1", MODEL, "node-1"), 2.0)]
    assert samples["fleet_gpu_relapses"] == [(("S1", MODEL, "node-1"), 1.0)]

    # S1: fenced twice, 1200 s and 600 s, XID 79 once per fence (the second after its agent
    # restarted and its counters began again), XID 13 once (2 -> 3, first sampled at A+1005; the 2 before is baseline)
    assert observed(history, "S1", A, D) == 3 * WINDOW  # the agent's 60 s restart is covered
    assert observed(history, "S1", A, D, "unhealthy") == 1800
    verdicts = [(x[2], x[5]) for x in events(history, "S1", "verdict")]
    states = [(at, "'unhealthy'" in d and "'state', 'unhealthy'" in d) for at, d in verdicts]
    assert [at for at, _ in states] == [BORN, A + 600, A + 1800, B + 300, B + 900]
    assert [fenced for _, fenced in states] == [False, True, False, True, False]
    xids = [(x[2], x[4]) for x in events(history, "S1", "xid")]
    assert xids == [(A + 600, "xid:79"), (A + 1005, "xid:13"), (B + 300, "xid:79")]
    assert all(x[2] != RESTART for x in history["events"])  # the restart itself is no event

    # S2 moved: the same serial on node-2 under a new UUID, after a gap that is recorded and
    # counted as unknown, never as healthy
    assert observed(history, "S2", A, B) == 2985
    assert observed(history, "S2", B, C) == 3000
    nodes = sorted({(x[3], x[4]) for x in history["stretches"] if x[0] == "S2"})
    assert nodes == [("GPU-b1", "node-1"), ("GPU-b2", "node-2")]
    gaps = events(history, "S2", "gap")
    assert [(x[1], x[2]) for x in gaps] == [(B + 600, A + 2985)]
    moves = events(history, "S2", "identity")
    assert [x[1] for x in moves] == [BORN, B + 600]
    assert "'node-1'" in moves[1][5] and "'node-2'" in moves[1][5]
    remaps = [
        (x[1], x[5])
        for x in events(history, "S2", "counter")
        if "correctable" in x[4] and "uncorrectable" not in x[4]
    ]
    assert [(t, "'from', 0.0" in d, "'to', 2.0" in d) for t, d in remaps[1:2]] == [
        (B + 600, True, True)
    ]
    assert [t for t, _ in remaps] == [BORN, B + 600, C]

    # S3: new at B+600, degraded from C+1200
    assert [x[2] for x in events(history, "S3", "verdict")] == [B + 600, C + 1200]
    assert ("S3", B + 600, C + WINDOW) in history["boards"]

    # ingesting every window again leaves the same history
    with open_store(db_url) as store:
        fleet = FleetStore(store, cluster)
        for start in (A, B, C):
            ingest.ingest_window(fleet, settings(fleet_prometheus.url), start)
    assert dump(db_url, cluster) == history


def test_one_pass_equals_catching_up(
    fleet_prometheus: Prometheus, db_url: str, cluster: str
) -> None:
    """A controller that was never down writes what one that caught up wrote."""
    with open_store(db_url) as store:
        fleet = FleetStore(store, cluster)
        assert ingest.run_once(fleet, settings(fleet_prometheus.url), D + 300) == 4
    once = dump(db_url, cluster)
    other = cluster + "-b"
    with open_store(db_url) as store:
        fleet = FleetStore(store, other)
        for now in (A + 300, B + 300, C + 300, D + 300):
            ingest.run_once(fleet, settings(fleet_prometheus.url), now)
    assert dump(db_url, other) == once


SMALL = 10  # samples per answer: 256 shards of devices and 2-3 slices of time per window


def test_windows_asked_in_small_pieces_read_the_same(fleet_prometheus: Prometheus) -> None:
    """Each window asked in hundreds of pieces (256 shards of devices, slices of time; the
    edge of window A's two slices is A+1800, where S1 is released and every GPU is scraped)
    gives the readings and XID series of one query."""
    url, max_gap = fleet_prometheus.url, settings("").max_gap
    for start in (A, B, C):  # D holds only 2 minutes of samples
        lo, hi = start - max_gap, start + WINDOW + max_gap
        total = prompieces.count_samples(url, source.METRICS, lo, hi, 10)
        assert len(prompieces.queries(source.METRICS, lo, hi, total, 10**9)) == 1
        shards, edges = prompieces.plan(total, lo, hi, SMALL)
        assert (shards, len(edges) > 2) == (256, True), start
        assert start != A or A + 1800 in edges
        split = source.fetch(url, start, WINDOW, max_gap, max_samples=SMALL, by_changes=False)
        one = source.fetch(url, start, WINDOW, max_gap, max_samples=10**9, by_changes=False)
        assert split == one and one[0] and one[1], start


def test_windows_asked_in_small_pieces_store_the_same_history(
    fleet_prometheus: Prometheus, ledger_sqlite_url: str, cluster: str
) -> None:
    """The ledger process' turns with answers of 10 samples store what they store with one
    answer per window (the pieces are the source's business: one kind of store is enough)."""
    url = fleet_prometheus.url
    with open_store(ledger_sqlite_url) as store:
        for name, max_samples in ((cluster, 10**9), (cluster + "-split", SMALL)):
            fleet = FleetStore(store, name)
            with_pieces = replace(settings(url), max_samples=max_samples)
            assert ingest.run_once(fleet, with_pieces, D + 300) == 4
    assert dump(ledger_sqlite_url, cluster + "-split") == dump(ledger_sqlite_url, cluster)
