"""The ledger's ingestion against a real Prometheus holding known samples (promtool blocks)
and a real store of either kind: exact used GPU-seconds and joules per window, a counter reset,
a series born mid-window, a gap, late samples, back-fill after downtime, idempotence, idle
allocations, and Prometheus down.

Every expected figure is worked out by hand from the series' definitions below (15 s samples;
windows A = [T0, T0+1h), B, C)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from gpuquota.quota import prompieces
from gpuquota.quota.accounting.rows import AllocationRow, Batch
from gpuquota.quota.ledger.ingest import Ingester, LedgerSettings
from gpuquota.quota.ledger.source import COUNTERS, fetch_window
from gpuquota.quota.promhttp import PrometheusError
from gpuquota.quota.store.db import open_store
from gpuquota.quota.store.models import LedgerProgress, UsageDevice, UsageSeries, UsageWindow
from gpuquota.sim.harness import free_port
from tests.ledger.samples import T0, WINDOW, Series, openmetrics, pod
from tests.prometheus import Prometheus, create_blocks, serving

A, B, C = T0, T0 + WINDOW, T0 + 2 * WINDOW
END = T0 + 3 * WINDOW + 120  # samples stop 2 minutes after C closes
BORN = T0 - 600  # the long-lived series' counters count from here
RESET = T0 + 1800  # p2's agent restarts here
U = "gpu_pod_used_seconds_total"
E = "gpu_pod_energy_joules_total"


def _series(stop_p1: int = END) -> list[Series]:
    return [
        # p1: half busy, 300 W, from before A on
        Series(U, pod(U, "GPU-1", "u1", "p1"), lambda t: 0.5 * (t - BORN), BORN, stop_p1),
        Series(E, pod(E, "GPU-1", "u1", "p1"), lambda t: 300.0 * (t - BORN), BORN, stop_p1),
        # p2: fully busy, 200 W; its agent restarts at RESET (counters from 0 again)
        Series(
            U,
            pod(U, "GPU-2", "u2", "p2"),
            lambda t: float(t - BORN if t < RESET else t - RESET),
            BORN,
            END,
        ),
        Series(
            E,
            pod(E, "GPU-2", "u2", "p2"),
            lambda t: 200.0 * (t - BORN if t < RESET else t - RESET),
            BORN,
            END,
        ),
        # p3: born mid-A (first sample at T0+1005), a quarter busy
        Series(
            U,
            pod(U, "GPU-3", "u3", "p3", "team-b"),
            lambda t: 0.25 * (t - T0 - 1000),
            T0 + 1005,
            END,
        ),
        # p4: fully busy, but no samples in [T0+600, T0+1200] (a 630 s hole: 585 -> 1215)
        Series(
            U,
            pod(U, "GPU-4", "u4", "p4", "team-b"),
            lambda t: float(t - BORN),
            BORN,
            END,
            skip=(T0 + 600, T0 + 1200),
        ),
        # p5: 1 % busy: idle
        Series(U, pod(U, "GPU-7", "u5", "p5", "team-b"), lambda t: 0.01 * (t - BORN), BORN, END),
        # GPU-5: nobody holds it, 100 W
        Series(
            "gpu_unallocated_energy_joules_total",
            {"gpu": "4", "uuid": "GPU-5", "instance": "node-2:9400", "node": "node-2"},
            lambda t: 100.0 * (t - BORN),
            BORN,
            END,
        ),
        # GPU-8: held by someone the whole time: its unallocated energy stays put (no rows)
        Series(
            "gpu_unallocated_energy_joules_total",
            {"gpu": "6", "uuid": "GPU-8", "instance": "node-2:9400", "node": "node-2"},
            lambda t: 5000.0,
            BORN,
            END,
        ),
        # a DRA claim on GPU-6: 2 % busy, 50 W
        Series(
            "gpu_claim_used_seconds_total",
            {
                "gpu": "5",
                "uuid": "GPU-6",
                "namespace": "team-c",
                "claim": "c1",
                "claim_uid": "cu1",
                "activity": "utilization",
            },
            lambda t: 0.02 * (t - BORN),
            BORN,
            END,
        ),
        Series(
            "gpu_claim_energy_joules_total",
            {"gpu": "5", "uuid": "GPU-6", "namespace": "team-c", "claim": "c1", "claim_uid": "cu1"},
            lambda t: 50.0 * (t - BORN),
            BORN,
            END,
        ),
    ]


# (holder_uid, device) -> (used, energy, sampled) in window A
EXPECTED_A = {
    # from the sample at T0-15 (no stored window: the sample before A) to T0+3585: 3600 s
    ("u1", "GPU-1"): (1800.0, 1_080_000.0, 3600.0),
    # 1800 s to T0+1785; the reset sample (0) counts 0; then 1785 more: the 15 s before the
    # restart are lost, as with increase()
    ("u2", "GPU-2"): (3585.0, 717_000.0, 3600.0),
    # new: its first sample counts from 0: 0.25 x 2585; sampled from T0+1005 to the end
    ("u3", "GPU-3"): (646.25, 0.0, 2595.0),
    # the counter still counts through the hole; the hole is not covered
    ("u4", "GPU-4"): (3600.0, 0.0, 2970.0),
    ("u5", "GPU-7"): (36.0, 0.0, 3600.0),
    ("", "GPU-5"): (0.0, 360_000.0, 3600.0),
    ("cu1", "GPU-6"): (72.0, 180_000.0, 3600.0),
}
# in B and C every series is whole: an hour of its rate
EXPECTED_LATER = {
    ("u1", "GPU-1"): (1800.0, 1_080_000.0, 3600.0),
    ("u2", "GPU-2"): (3600.0, 720_000.0, 3600.0),
    ("u3", "GPU-3"): (900.0, 0.0, 3600.0),
    ("u4", "GPU-4"): (3600.0, 0.0, 3600.0),
    ("u5", "GPU-7"): (36.0, 0.0, 3600.0),
    ("", "GPU-5"): (0.0, 360_000.0, 3600.0),
    ("cu1", "GPU-6"): (72.0, 180_000.0, 3600.0),
}


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    work = tmp_path_factory.mktemp("prom")
    create_blocks(openmetrics(_series()), work / "tsdb", work)
    with serving(work / "tsdb", work) as server:
        yield server


def settings(url: str, **overrides: float) -> LedgerSettings:
    values: dict[str, float] = {"delay": 300, "lookback": 0, "backfill": 3 * WINDOW, "poll": 0.2}
    values.update(overrides)
    return LedgerSettings(url, **values)  # type: ignore[arg-type]


def rows(db_url: str, cluster: str) -> dict[tuple[str, str, int], tuple[float, float, float]]:
    """(holder_uid, device, window_start) -> (used, energy, sampled)."""
    store = open_store(db_url)
    try:
        with store.engine.connect() as conn:
            s, w, d = UsageSeries.__table__, UsageWindow.__table__, UsageDevice.__table__
            got = conn.execute(
                select(
                    s.c.holder_uid,
                    d.c.device_uuid,
                    w.c.window_start,
                    w.c.used_gpu_seconds,
                    w.c.energy_joules,
                    w.c.sampled_seconds,
                )
                .join(w, w.c.series_id == s.c.id)
                .join(d, d.c.id == s.c.device_id)
                .where(s.c.cluster == cluster)
            ).all()
    finally:
        store.close()
    return {(r[0], r[1], r[2]): (r[3], r[4], r[5]) for r in got}


def rounded(figures: dict) -> dict:
    """Figures to the micro-unit (sums of float samples), for exact comparison."""
    return {k: tuple(round(x, 6) for x in v) for k, v in figures.items()}


def progress(db_url: str, cluster: str) -> int | None:
    store = open_store(db_url)
    try:
        with store.engine.connect() as conn:
            p = LedgerProgress.__table__
            return conn.execute(select(p.c.ingested_until).where(p.c.cluster == cluster)).scalar()
    finally:
        store.close()


def expected(windows: dict[int, dict[tuple[str, str], tuple[float, float, float]]]) -> dict:
    return {
        (uid, dev, start): fig
        for start, figs in windows.items()
        for (uid, dev), fig in figs.items()
    }


def test_three_windows_exact_then_idempotent(
    prometheus: Prometheus, db_url: str, cluster: str
) -> None:
    ingester = Ingester(db_url, cluster, settings(prometheus.url), clock=lambda: C + WINDOW + 300)
    try:
        assert ingester.run_once() == 3
        assert ingester.run_once() == 0  # nothing new closed
        first = rows(db_url, cluster)
        assert rounded(first) == rounded(
            expected({A: EXPECTED_A, B: EXPECTED_LATER, C: EXPECTED_LATER})
        )
        assert progress(db_url, cluster) == C + WINDOW
        for start in (A, B, C, B):  # again, in any order: the same rows
            ingester.ingest_window(start)
        assert rows(db_url, cluster) == first
    finally:
        ingester.stop()
    store = open_store(db_url)
    try:
        with store.engine.connect() as conn:
            s, d = UsageSeries.__table__, UsageDevice.__table__
            labels = {
                r.holder_uid: r
                for r in conn.execute(
                    select(s, d.c.device_uuid, d.c.node)
                    .join(d, d.c.id == s.c.device_id)
                    .where(s.c.cluster == cluster)
                )
            }
    finally:
        store.close()
    assert labels["u1"].namespace == "team-a" and labels["u1"].holder_name == "p1"
    assert labels["u1"].node == "node-1:9400" and labels["u1"].activity == "sm_active"
    assert labels[""].holder_kind == "unallocated" and labels[""].node == "node-2"
    assert labels["cu1"].holder_kind == "claim" and labels["cu1"].holder_name == "c1"
    assert labels["cu1"].activity == "utilization"


def test_backfill_after_downtime_skips_what_is_beyond_it(
    prometheus: Prometheus, db_url: str, cluster: str, caplog: pytest.LogCaptureFixture
) -> None:
    Ingester(
        db_url, cluster, settings(prometheus.url, backfill=WINDOW), clock=lambda: B + 300
    ).run_once()
    assert progress(db_url, cluster) == B
    # down for two hours; the back-fill reaches one window back: B is skipped, C is whole
    # (its baseline is its sample before C, not A's end: B's use is not moved into C)
    later = Ingester(
        db_url, cluster, settings(prometheus.url, backfill=WINDOW), clock=lambda: C + WINDOW + 300
    )
    with caplog.at_level(logging.WARNING):
        assert later.run_once() == 1
    assert "beyond --ledger-backfill" in caplog.text
    assert rounded(rows(db_url, cluster)) == rounded(expected({A: EXPECTED_A, C: EXPECTED_LATER}))
    # with a long enough back-fill, B is caught up too (from A's end)
    other = f"{cluster}-x"
    Ingester(
        db_url, other, settings(prometheus.url, backfill=WINDOW), clock=lambda: B + 300
    ).run_once()
    Ingester(db_url, other, settings(prometheus.url), clock=lambda: C + WINDOW + 300).run_once()
    assert rounded(rows(db_url, other)) == rounded(
        expected({A: EXPECTED_A, B: EXPECTED_LATER, C: EXPECTED_LATER})
    )


def test_late_samples_are_taken_by_the_lookback(work: Path, db_url: str, cluster: str) -> None:
    only_p1 = _series(stop_p1=B + 1800)[:2]  # p1's samples of the second half of B come late
    tsdb = work / "tsdb"
    create_blocks(openmetrics(only_p1), tsdb, work)
    with serving(tsdb, work) as prom:
        Ingester(
            db_url, cluster, settings(prom.url, lookback=WINDOW), clock=lambda: C + 300
        ).run_once()
    got = rows(db_url, cluster)
    # B: from A's end (T0+3585) to T0+5385; covered to the last sample
    assert got[("u1", "GPU-1", B)] == pytest.approx((900.0, 540_000.0, 1785.0))
    late = [Series(s.metric, s.labels, s.value, B + 1800, END) for s in _series()[:2]]
    create_blocks(openmetrics(late), tsdb, work)
    with serving(tsdb, work) as prom:
        ingester = Ingester(
            db_url, cluster, settings(prom.url, lookback=WINDOW), clock=lambda: C + WINDOW + 300
        )
        assert ingester.run_once() == 2  # B again, then C
    got = rows(db_url, cluster)
    assert got[("u1", "GPU-1", B)] == pytest.approx(EXPECTED_LATER[("u1", "GPU-1")])
    assert got[("u1", "GPU-1", C)] == pytest.approx(EXPECTED_LATER[("u1", "GPU-1")])


def _allocation(uid: str, name: str, namespace: str, gpus: float, started: int) -> AllocationRow:
    return AllocationRow(
        pod_uid=uid,
        resource_name="nvidia.com/gpu",
        namespace=namespace,
        pod_name=name,
        owner_kind=None,
        owner_name=None,
        node="node-1",
        node_pool=None,
        gpu_model="H100",
        raw_units=1,
        physical_gpus=gpus,
        replicas=None,
        sharing_strategy=None,
        mig_profile=None,
        started_at=started,
        ended_at=None,
        end_reason=None,
        estimated=False,
        qos_class=None,
        updated_at=started,
        share_numerator=1,
        share_denominator=1,
    )


def test_idle_allocations(prometheus: Prometheus, db_url: str, cluster: str) -> None:
    store = open_store(db_url)
    try:
        store.write(
            cluster,
            Batch(
                allocations=[
                    _allocation("u1", "p1", "team-a", 1.0, BORN),
                    _allocation("u5", "p5", "team-b", 1.0, T0 + 1800),
                ],
                observed_at=T0,
            ),
        )
    finally:
        store.close()
    ingester = Ingester(
        db_url,
        cluster,
        settings(prometheus.url, idle_for=2 * WINDOW),
        clock=lambda: C + WINDOW + 300,
    )
    ingester.run_once()
    (idle,) = ingester.facts.idle
    assert (idle.namespace, idle.name, idle.physical_gpus) == ("team-b", "p5", 1.0)
    assert idle.since == T0 + 1800  # its allocation began mid-A
    # allocated from T0+1800 to the end of C minus what it used (A's whole 36 counts: the
    # ledger cannot cut a window)
    assert idle.idle_gpu_seconds == pytest.approx(1800 + 2 * 3600 - 3 * 36.0)
    # the GPU model of a pod series whose samples name none comes from its allocation
    store = open_store(db_url)
    try:
        with store.engine.connect() as conn:
            s, d = UsageSeries.__table__, UsageDevice.__table__
            model = conn.execute(
                select(d.c.gpu_model)
                .join(s, s.c.device_id == d.c.id)
                .where(s.c.cluster == cluster, s.c.holder_uid == "u5")
            ).scalar()
    finally:
        store.close()
    assert model == "H100"


def test_coverage_stops_where_the_allocation_ended(
    prometheus: Prometheus, db_url: str, cluster: str
) -> None:
    """A finished holder's last values stay published for the agent's retention (10 minutes):
    those samples are not time it held the GPU. p1's pod ended at T0+1800 and the claim cu1 at
    T0+900 (its series go on in Prometheus, as the retained values do): their coverage stops
    there; the open p5 and the holders without allocation rows keep theirs."""
    from dataclasses import replace

    from gpuquota.quota.accounting.rows import ClaimAllocationRow

    claim = ClaimAllocationRow(
        claim_uid="cu1", pod_uid="cp1", resource_name="gpu.nvidia.com", namespace="team-c",
        claim_name="c1", pod_name="cp1", owner_kind=None, owner_name=None, node="node-1",
        node_pool=None, gpu_model="H100", raw_units=1, physical_gpus=1.0,
        sharing_strategy=None, mig_profile=None, share_estimated=False, pod_started_at=BORN,
        pod_ended_at=T0 + 900, started_at=BORN, ended_at=T0 + 900, end_reason="deleted",
        estimated=False, updated_at=T0 + 900, share_numerator=1, share_denominator=1,
    )  # fmt: skip
    store = open_store(db_url)
    try:
        store.write(
            cluster,
            Batch(
                allocations=[
                    replace(
                        _allocation("u1", "p1", "team-a", 1.0, BORN),
                        ended_at=T0 + 1800,
                        end_reason="succeeded",
                    ),
                    _allocation("u5", "p5", "team-b", 1.0, BORN),
                ],
                claim_allocations=[claim],
                observed_at=T0,
            ),
        )
    finally:
        store.close()
    ingester = Ingester(db_url, cluster, settings(prometheus.url), clock=lambda: B + 300)
    try:
        ingester.run_once()
    finally:
        ingester.stop()
    got = rows(db_url, cluster)
    assert got[("u1", "GPU-1", A)][2] == 1800.0
    assert got[("cu1", "GPU-6", A)][2] == 900.0
    # used and energy are what the counters say (they stop moving when a holder ends)
    assert got[("u1", "GPU-1", A)][:2] == pytest.approx(EXPECTED_A[("u1", "GPU-1")][:2])
    assert got[("u5", "GPU-7", A)][2] == 3600.0
    assert got[("u3", "GPU-3", A)][2] == EXPECTED_A[("u3", "GPU-3")][2]


def test_prometheus_down_is_one_clear_error_retried_and_nothing_written(
    db_url: str, cluster: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    ingester = Ingester(
        db_url, cluster, settings(url, backoff=0.05), clock=lambda: C + WINDOW + 300
    )
    with pytest.raises(PrometheusError, match=f"cannot reach Prometheus at {url}"):
        ingester.run_once()
    with caplog.at_level(logging.ERROR):
        ingester.start()
        deadline = time.monotonic() + 10
        while ingester.facts.errors.get("prometheus", 0) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        ingester.stop()
    assert ingester.facts.errors["prometheus"] >= 3  # retried
    logged = [r for r in caplog.records if "cannot reach Prometheus" in r.getMessage()]
    assert len(logged) == 1  # once per change of state
    assert progress(db_url, cluster) is None
    assert rows(db_url, cluster) == {}


def test_a_window_asked_in_pieces_is_the_same(prometheus: Prometheus) -> None:
    whole = fetch_window(prometheus.url, A, WINDOW, 60)
    # 7 ledger series x ~2 counters x 248 samples: 16 shards of devices; 256; 256 and two
    # slices of time, whose edge A+1800 is a scrape (a sample on it comes in both slices)
    lo, hi = A - 60, A + WINDOW + 60
    total = prompieces.count_samples(prometheus.url, tuple(COUNTERS), lo, hi, 10)
    plans = {small: prompieces.plan(total, lo, hi, small) for small in (400, 40, 6)}
    assert plans == {400: (16, [lo, hi]), 40: (256, [lo, hi]), 6: (256, [lo, A + 1800, hi])}
    for small in plans:
        pieces = fetch_window(prometheus.url, A, WINDOW, 60, max_samples=small)
        assert pieces == whole
    assert len(whole[("GPU-1", "pod", "u1")].used) == (WINDOW + 120) // 15 + 1


def test_a_store_failure_mid_window_leaves_nothing_half_written(
    prometheus: Prometheus, tmp_path: Path
) -> None:
    """SQLite held by another writer for the whole turn: progress is read and the window
    fetched, its write fails, nothing of it stays, and the next turn writes it whole."""
    import sqlite3

    from gpuquota.quota.store import db
    from gpuquota.quota.store.db import StoreError

    path = tmp_path / "locked.db"
    db.upgrade(f"sqlite:///{path}")
    url = f"sqlite:///{path}?timeout=0.3"
    ingester = Ingester(url, "c", settings(prometheus.url, backfill=WINDOW), clock=lambda: B + 300)
    locker = sqlite3.connect(path, isolation_level=None)
    locker.execute("PRAGMA journal_mode=WAL")
    locker.execute("BEGIN IMMEDIATE")  # readers go on (WAL), every other writer waits
    try:
        with pytest.raises(StoreError, match=r"ledger write to .* failed: database is locked"):
            ingester.run_once()
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    assert rows(url, "c") == {} and progress(url, "c") is None
    assert ingester.run_once() == 1
    assert rounded(rows(url, "c")) == rounded(expected({A: EXPECTED_A}))
    ingester.stop()


def test_a_backfill_of_very_many_windows_is_said_at_start() -> None:
    from gpuquota.quota.ledger.ingest import catch_up_warning

    # a week of 5 s windows (a demo's window with the default back-fill): 120,960 windows
    line = catch_up_warning(LedgerSettings("http://p:9090", window=5, backfill=7 * 86400))
    assert line is not None and "120,960 windows" in line and "--ledger-backfill" in line
    # the defaults (a week of hours) and a week of 5-minute windows say nothing
    assert catch_up_warning(LedgerSettings("http://p:9090")) is None
    assert catch_up_warning(LedgerSettings("http://p:9090", window=300)) is None


def test_counting_samples_of_metrics_with_the_same_labels(work: Path) -> None:
    """Two metrics with the same labels (a GPU's gpu_row_remap_pending and _failure): the
    count before a fetch is in pieces adds them up; one count_over_time over both was one
    labelset twice, refused by Prometheus (HTTP 422), and the fleet history stopped (demo
    act 6, after the fleet source began to ask in pieces)."""
    from gpuquota.quota import prompieces

    labels = 'gpu="0",node="n1",uuid="GPU-1"'
    lines = [
        "# TYPE gpu_row_remap_pending gauge",
        *(f"gpu_row_remap_pending{{{labels}}} 0 {T0 + 15 * i}" for i in range(4)),
        "# TYPE gpu_row_remap_failure gauge",
        *(f"gpu_row_remap_failure{{{labels}}} 0 {T0 + 15 * i}" for i in range(4)),
        "# EOF",
    ]
    tsdb = work / "tsdb-same-labels"
    create_blocks("\n".join(lines) + "\n", tsdb, work)
    names = ["gpu_row_remap_pending", "gpu_row_remap_failure", "gpu_row_remap_absent"]
    with serving(tsdb, work) as prometheus:
        assert prompieces.count_samples(prometheus.url, names, T0 - 60, T0 + 120, 10) == 8
