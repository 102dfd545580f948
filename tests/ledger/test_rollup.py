"""The ledger's daily roll-up against a real Prometheus and a real store of either kind: a
final day's hourly rows become one row per run of adjacent windows, a gap keeps two runs
apart, the next window's baseline is the rolled row's, a longer look-back never ingests a
rolled day again, and the report of whole days is the same as without the roll-up."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import func, select

from gpuquota.quota.accounting.rows import Batch
from gpuquota.quota.ledger.ingest import Ingester, LedgerSettings
from gpuquota.quota.report import cli
from gpuquota.quota.store.db import StoreError, open_store
from gpuquota.quota.store.models import LedgerProgress, UsageDevice, UsageSeries, UsageWindow
from tests.ledger.samples import WINDOW, Series, openmetrics, pod
from tests.ledger.test_ingest import _allocation
from tests.prometheus import Prometheus, create_blocks, serving

H = WINDOW
DAY = 86400
D = (int(time.time()) // DAY - 1) * DAY  # yesterday's UTC midnight: every window is closed
BORN = D - 3 * H - 600
END = D + 3 * H + 120
HOLE = (D - 2 * H - 14, D - H - 1)  # no samples of u2 in the window [D-2h, D-1h)
U, E = "gpu_pod_used_seconds_total", "gpu_pod_energy_joules_total"


def _series() -> list[Series]:
    return [
        Series(U, pod(U, "GPU-1", "u1", "p1"), lambda t: 0.5 * (t - BORN), BORN, END),
        Series(E, pod(E, "GPU-1", "u1", "p1"), lambda t: 300.0 * (t - BORN), BORN, END),
        Series(
            U,
            pod(U, "GPU-2", "u2", "p2", "team-b"),
            lambda t: float(t - BORN),
            BORN,
            END,
            skip=HOLE,
        ),
        Series(
            E,
            pod(E, "GPU-2", "u2", "p2", "team-b"),
            lambda t: 200.0 * (t - BORN),
            BORN,
            END,
            skip=HOLE,
        ),
        Series(
            "gpu_unallocated_energy_joules_total",
            {"gpu": "4", "uuid": "GPU-5", "instance": "node-2:9400", "node": "node-2"},
            lambda t: 100.0 * (t - BORN),
            BORN,
            END,
        ),
        # GPU-9: held by someone in [D-2h, D-1h): no increase, no row for that window
        Series(
            "gpu_unallocated_energy_joules_total",
            {"gpu": "5", "uuid": "GPU-9", "instance": "node-2:9400", "node": "node-2"},
            lambda t: 50.0 * (min(t, D - 2 * H - 15) - BORN + max(0, t - (D - H))),
            BORN,
            END,
        ),
    ]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    work = tmp_path_factory.mktemp("prom")
    create_blocks(openmetrics(_series()), work / "tsdb", work)
    with serving(work / "tsdb", work) as server:
        yield server


def ingest(url: str, db_url: str, cluster: str, now: int, **kw: Any) -> Ingester:
    values: dict[str, Any] = {"lookback": H, "backfill": 8 * H, "poll": 0.2} | kw
    ingester = Ingester(db_url, cluster, LedgerSettings(url, **values), clock=lambda: now)
    try:
        ingester.run_once()
    finally:
        ingester.stop()
    return ingester


Rows = dict[tuple[str, int], tuple[int, float, float, float, float | None, float | None]]


def rows(db_url: str, cluster: str) -> Rows:
    """(holder UID, or the device's UUID for unallocated energy, window_start) -> (seconds,
    used, energy, sampled, end_used, end_energy)."""
    store = open_store(db_url)
    try:
        with store.engine.connect() as conn:
            s, w, d = UsageSeries.__table__, UsageWindow.__table__, UsageDevice.__table__
            got = conn.execute(
                select(
                    func.coalesce(func.nullif(s.c.holder_uid, ""), d.c.device_uuid),
                    w.c.window_start,
                    w.c.window_seconds,
                    w.c.used_gpu_seconds,
                    w.c.energy_joules,
                    w.c.sampled_seconds,
                    w.c.end_used,
                    w.c.end_energy,
                )
                .join(w, w.c.series_id == s.c.id)
                .join(d, d.c.id == s.c.device_id)
                .where(s.c.cluster == cluster)
            ).all()
    finally:
        store.close()
    return {(r[0], r[1]): tuple(r[2:]) for r in got}  # type: ignore[misc]


def rolled_until(db_url: str, cluster: str) -> int | None:
    store = open_store(db_url)
    try:
        with store.engine.connect() as conn:
            p = LedgerProgress.__table__
            return conn.execute(select(p.c.rolled_until).where(p.c.cluster == cluster)).scalar()
    finally:
        store.close()


def report(db_url: str, cluster: str, *period: str) -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(
        [
            *period,
            "--db",
            db_url,
            "--cluster",
            cluster,
            "--format",
            "json",
            "--now",
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(D + 6 * H)),
        ]
    )
    out, _ = cli.build(args)
    doc: dict[str, Any] = json.loads(out)
    return doc


def allocations(db_url: str, cluster: str) -> None:
    store = open_store(db_url)
    try:
        store.write(
            cluster,
            Batch(
                allocations=[
                    _allocation("u1", "p1", "team-a", 1.0, BORN),
                    _allocation("u2", "p2", "team-b", 1.0, BORN),
                ],
                observed_at=BORN,
            ),
        )
    finally:
        store.close()


def close(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return a[0] == b[0] and all(
        x == y if x is None or y is None else x == pytest.approx(y, rel=1e-6)
        for x, y in zip(a[1:], b[1:], strict=True)
    )


def test_a_final_day_rolls_up_and_the_report_is_the_same(
    prometheus: Prometheus, db_url: str, cluster: str
) -> None:
    kept, rolled = f"{cluster}-kept", f"{cluster}-rolled"
    for c in (kept, rolled):
        allocations(db_url, c)
    # the same windows, [D-4h, D+3h), with and without the roll-up; the rolled cluster in two
    # turns: yesterday is final once window D is in and out of the look-back
    ingest(prometheus.url, db_url, kept, D + 3 * H + 300, rollup_after=None)
    first = ingest(prometheus.url, db_url, rolled, D + H + 300, rollup_after=0)
    assert first.facts.rolled_until == D == rolled_until(db_url, rolled)
    ingest(prometheus.url, db_url, rolled, D + 3 * H + 300, rollup_after=0)
    assert rolled_until(db_url, rolled) == D  # today is not over: not rolled
    hourly, daily = rows(db_url, kept), rows(db_url, rolled)

    # yesterday: u1's four windows [D-4h, D) are one row; u2's hole splits its rows in two
    # runs; the unallocated GPU's rows are one
    def day_rows(found: Rows, uid: str) -> list[int]:
        return sorted(start for u, start in found if u == uid and start < D)

    assert day_rows(hourly, "u1") == [D - 4 * H, D - 3 * H, D - 2 * H, D - H]
    assert day_rows(daily, "u1") == [D - 4 * H]
    assert day_rows(hourly, "u2") == [D - 4 * H, D - 3 * H, D - H]
    assert day_rows(daily, "u2") == [D - 4 * H, D - H]
    assert day_rows(daily, "GPU-5") == [D - 4 * H]
    # GPU-9's unallocated energy: no row for the hour it was held (no increase); rolled up,
    # one row over the day's span: a missing unallocated window is no increase, not no data
    assert day_rows(hourly, "GPU-9") == [D - 4 * H, D - 3 * H, D - H]
    assert day_rows(daily, "GPU-9") == [D - 4 * H]
    assert daily[("GPU-9", D - 4 * H)][0] == 4 * H

    def summed(uid: str, starts: list[int]) -> tuple[Any, ...]:
        parts = [hourly[(uid, s)] for s in starts]
        return (
            sum(p[0] for p in parts),
            *(sum(p[i] for p in parts) for i in (1, 2, 3)),
            parts[-1][4],
            parts[-1][5],
        )

    assert close(daily[("u1", D - 4 * H)], summed("u1", [D - 4 * H, D - 3 * H, D - 2 * H, D - H]))
    assert daily[("u1", D - 4 * H)][0] == 4 * H
    assert close(daily[("u2", D - 4 * H)], summed("u2", [D - 4 * H, D - 3 * H]))
    assert close(daily[("u2", D - H)], hourly[("u2", D - H)])
    assert close(
        daily[("GPU-9", D - 4 * H)][1:], summed("GPU-9", [D - 4 * H, D - 3 * H, D - H])[1:]
    )
    # today's windows, the first of them ingested again from the rolled row's end: the same
    today = {k for k in hourly if k[1] >= D}
    assert today == {k for k in daily if k[1] >= D} and len(today) == 12
    for key in today:
        assert close(daily[key], hourly[key]), key

    # whole days: the same report, used, energy and coverage per namespace
    period = (
        "--from",
        time.strftime("%Y-%m-%d", time.gmtime(D - DAY)),
        "--to",
        time.strftime("%Y-%m-%d", time.gmtime(D + DAY)),
    )
    a, b = report(db_url, kept, *period), report(db_url, rolled, *period)
    assert a["rows"] and [r["group"]["namespace"] for r in a["rows"]] == ["team-a", "team-b"]
    for x, y in zip(a["rows"], b["rows"], strict=True):
        for field in (
            "gpu_seconds_raw",
            "gpu_seconds_used",
            "energy_joules",
            "usage_coverage_ratio",
        ):
            assert y[field] == pytest.approx(x[field], rel=1e-6), field
    unallocated = a["notes"]["unallocated_energy_joules"]
    assert unallocated[kept] == b["notes"]["unallocated_energy_joules"][rolled] > 0
    # u1: half busy from its first sample (BORN) to its last before D+3h
    assert a["rows"][0]["gpu_seconds_used"] == pytest.approx(0.5 * (6 * H + 600 - 15))

    # a look-back that reaches into yesterday does not ingest its windows again
    again = ingest(prometheus.url, db_url, rolled, D + 4 * H + 300, lookback=6 * H, rollup_after=0)
    assert again.facts.windows == 4  # D to D+3h: nothing before rolled_until
    after = rows(db_url, rolled)
    assert {k: v for k, v in after.items() if k[1] < D} == {
        k: v for k, v in daily.items() if k[1] < D
    }
    for key in today:
        assert close(after[key], daily[key]), key
    # asked directly, a window of a rolled-up day is refused, and nothing changes
    with pytest.raises(StoreError, match="is in a rolled-up day"):
        again.ingest_window(D - H)
    assert rows(db_url, rolled) == after


def test_days_of_the_billing_zone_roll_up_whole_so_its_report_is_exact(
    tmp_path_factory: pytest.TempPathFactory, db_url: str, cluster: str
) -> None:
    """A report in a billing time zone whose days are not UTC's: with UTC days rolled up, the
    zone's day edge (UTC+2: D-2h) falls inside a rolled row, and the report prorates it by
    time; with --ledger-rollup-tz set to that zone, the zone's days are whole rows and the
    report is the same as from the hourly rows. u3 is busy until D-2h and idle after."""
    zone, edge = "Africa/Johannesburg", D - 2 * H  # UTC+2, no DST
    series = [
        Series(U, pod(U, "GPU-3", "u3", "p3"), lambda t: float(min(t, edge) - BORN), BORN, END)
    ]
    work = tmp_path_factory.mktemp("prom-zone")
    create_blocks(openmetrics(series), work / "tsdb", work)
    clusters = {name: f"{cluster}-{name}" for name in ("kept", "utc", "zone")}
    for c in clusters.values():
        store = open_store(db_url)
        try:
            store.write(
                c,
                Batch(allocations=[_allocation("u3", "p3", "team-a", 1.0, BORN)], observed_at=BORN),
            )
        finally:
            store.close()
    now = D + 3 * H + 300
    with serving(work / "tsdb", work) as prom:
        ingest(prom.url, db_url, clusters["kept"], now, rollup_after=None)
        ingest(prom.url, db_url, clusters["utc"], now, rollup_after=0)
        zoned = ingest(prom.url, db_url, clusters["zone"], now, rollup_after=0, rollup_tz=zone)
    assert zoned.facts.rolled_until == edge
    rolled = rows(db_url, clusters["zone"])
    assert sorted(s for _, s in rolled) == [D - 4 * H, *range(edge, D + 3 * H, H)]
    assert rolled[("u3", D - 4 * H)][0] == 2 * H  # the zone's day ends at its midnight
    # the zone's day that ends at its midnight D-2h (its dates: UTC's shifted by 2 hours)
    first, last = (time.strftime("%Y-%m-%d", time.gmtime(t + 2 * H)) for t in (edge - 1, edge))
    period = ("--from", first, "--to", last, "--tz", zone)
    docs = {name: report(db_url, c, *period) for name, c in clusters.items()}
    used = {name: doc["rows"][0]["gpu_seconds_used"] for name, doc in docs.items()}
    # used until D-2h, all inside the zone's day (from its first sample: 15 s after BORN)
    assert used["kept"] == pytest.approx(edge - BORN - 15, rel=1e-6)
    assert used["zone"] == pytest.approx(used["kept"], rel=1e-6)
    # UTC days: [D-4h, D) is one row, half of it before the zone's midnight: about half its use
    assert used["utc"] < 0.51 * used["kept"]
    # and the report says so: one rolled row of 4 h cut by the zone's midnight, all of the
    # used time counted from it pro rata; whole rows (hourly, or the zone's days) say nothing
    cut = {name: doc["notes"]["ledger_prorated"] for name, doc in docs.items()}
    assert cut["utc"]["windows"] == 1 and cut["utc"]["longest_window_seconds"] == 4 * H
    assert cut["utc"]["used_gpu_hours"] * H == pytest.approx(used["utc"], rel=1e-6)
    said = [m for m in docs["utc"]["notes"]["messages"] if "usage-ledger window" in m]
    assert len(said) == 1 and "cuts 1 usage-ledger window(s), up to 4 h" in said[0], said
    assert "--ledger-rollup-tz" in said[0]
    for whole in ("kept", "zone"):
        assert cut[whole] == {"windows": 0, "longest_window_seconds": 0, "used_gpu_hours": 0.0}
        assert not any("usage-ledger window" in m for m in docs[whole]["notes"]["messages"])
