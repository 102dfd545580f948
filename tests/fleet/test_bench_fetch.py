"""bench/fleet_fetch.py at a toy size (24 GPUs: one fenced, one node silent in the window) on
a real Prometheus and a real VictoriaMetrics: it runs, and the change-based fetch gives the
history every sample gives on both (the benchmark fails otherwise). No timing is asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_fleet_fetch_benchmark_runs_at_a_toy_size() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.fleet_fetch", "--gpus", "24", "--no-write"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("same_history=yes ")
    figures = dict(pair.split("=") for pair in last.split())
    assert {"prometheus_24_changes_wall_s", "victoriametrics_24_changes_peak_mb"} <= set(figures)
    # the stores' lines: 9 of 24 GPUs busy (GPU 3 fenced, node 1's eight silent), the rest
    # one quiet reading each
    stores = [json_line for json_line in done.stdout.splitlines() if " 24 {" in json_line]
    assert len(stores) == 2 and all('"busy": 9,' in line for line in stores)
