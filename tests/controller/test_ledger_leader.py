"""The usage ledger in `gpuquota controller`: only the leader ingests, a standby publishes no
ledger series, and the replica that takes the lease over goes on from the stored progress.

A real Prometheus serves known samples (promtool blocks, tests/prometheus.py) of one pod that
used half of its GPU for the last five hours."""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import text as sql

from gpuquota.sim.harness import wait_for
from tests.controller.conftest import FAST_LEASE, metric, ready, start
from tests.ledger.samples import Series, openmetrics, pod
from tests.prometheus import create_blocks, serving

H = 3600
U = "gpu_pod_used_seconds_total"


def _ledger_rows(store) -> list[tuple[int, float]]:
    with store.engine.connect() as conn:
        return [
            (int(r[0]), float(r[1]))
            for r in conn.execute(
                sql(
                    "SELECT w.window_start, w.used_gpu_seconds FROM usage_windows w "
                    "JOIN usage_series s ON s.id = w.series_id WHERE s.cluster = :c "
                    "ORDER BY w.window_start"
                ),
                {"c": store.cluster},
            )
        ]


def _metrics(ctl) -> str:
    try:
        return str(ctl.metrics())
    except OSError:  # not serving yet
        return ""


def test_only_the_leader_ingests_the_ledger(apiserver, store, controllers, tmp_path: Path):
    now = int(time.time())
    born = (now // 15) * 15 - 5 * H
    series = Series(U, pod(U, "GPU-1", "u1", "p1"), lambda t: 0.5 * (t - born), born, now)
    create_blocks(openmetrics([series]), tmp_path / "tsdb", tmp_path)
    last_end = (now - 300) // H * H
    with serving(tmp_path / "tsdb", tmp_path) as prom:
        args = [
            *FAST_LEASE,
            "--ledger-prometheus-url",
            prom.url,
            "--ledger-backfill",
            "3h",
            "--ledger-lookback",
            "0",
        ]
        a = start(apiserver, store, controllers, *args, identity="replica-a")
        ready(store)
        b = start(apiserver, store, controllers, *args, identity="replica-b")
        wait_for(lambda: len(_ledger_rows(store)) == 3, 30, "the leader's ledger rows")
        assert _ledger_rows(store) == [(last_end - k * H, 1800.0) for k in (3, 2, 1)]
        text = a.metrics()
        assert metric(text, "gpuquota_ledger_ingested_until_timestamp_seconds") == last_end
        assert metric(text, "gpuquota_ledger_windows_ingested_total") == 3
        wait_for(lambda: "gpuquota_controller_leader 0.0" in _metrics(b), 20, "the standby")
        assert "gpuquota_ledger_" not in b.metrics()  # a standby ingests nothing
        a.kill()
        wait_for(
            lambda: "\ngpuquota_ledger_ingested_until_timestamp_seconds " in _metrics(b),
            30,
            "the new leader's ledger",
        )
        text = b.metrics()
        assert metric(text, "gpuquota_ledger_ingested_until_timestamp_seconds") == last_end
        assert metric(text, "gpuquota_ledger_windows_ingested_total") == 0  # nothing new
        assert _ledger_rows(store) == [(last_end - k * H, 1800.0) for k in (3, 2, 1)]
