"""Golden reports: the sim workload generator's events replayed through `gpuquota replay` (the
store's real engine), then `gpuquota report`, compared with the generator's own truth to the
second: raw and physical GPU-seconds per namespace and resource, per label value (labels
changed mid-span), and over a window that cuts intervals at both edges."""

from __future__ import annotations

import json
from collections import defaultdict
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine

from gpuquota.quota import cli as gpuquota
from gpuquota.quota.report import allocations, compute
from gpuquota.sim.workload import Workload, generate
from tests.report.conftest import Store

SEED, HOURS = 11, 12


@pytest.fixture(scope="module")
def workload() -> Workload:
    return generate(SEED, hours=HOURS)


@pytest.fixture
def replayed(
    store: Store, workload: Workload, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> Store:
    events = tmp_path / "events.jsonl"
    events.write_text("\n".join(workload.lines()) + "\n")
    assert gpuquota.main(["replay", str(events), "--db", store.url, "--cluster", "golden"]) == 0
    capsys.readouterr()
    return store


def iso(t: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def report_json(capsys: pytest.CaptureFixture[str], store: Store, *argv: str) -> dict[str, Any]:
    rc = gpuquota.main(["report", *argv, "--db", store.url, "--format", "json"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    doc: dict[str, Any] = json.loads(captured.out)
    return doc


def exact(
    store: Store, keys: list[str], lo: int, hi: int, now: int
) -> dict[tuple[str | None, ...], compute.Group]:
    """The report's own exact figures (physical seconds as Fractions), same code path."""
    engine = create_engine(store.url)
    try:
        with engine.connect() as conn:
            rows = allocations.usage(conn, keys, [lo, hi], now)
    finally:
        engine.dispose()
    return {g.keys: g for g in compute.aggregate(keys, rows, [lo, hi], None).groups}


def test_whole_span_by_namespace_and_resource(
    replayed: Store, workload: Workload, capsys: Any
) -> None:
    lo, hi = workload.start, workload.end
    doc = report_json(
        capsys,
        replayed,
        "--from",
        iso(lo),
        "--to",
        iso(hi),
        "--now",
        iso(hi),
        "--by",
        "namespace,resource",
    )
    got = {
        (r["group"]["namespace"], r["group"]["resource"]): r["gpu_seconds_raw"] for r in doc["rows"]
    }
    truth = {k: v for k, v in workload.truth.gpu_seconds().items() if v}
    assert got == truth
    assert doc["total"]["gpu_seconds_raw"] == sum(truth.values())
    groups = exact(replayed, ["namespace", "resource"], lo, hi, hi)
    physical = {k: v for k, v in workload.truth.physical_seconds_exact().items() if v}
    assert {k: g.physical_seconds for k, g in groups.items()} == physical


def test_window_cutting_intervals_at_both_edges(
    replayed: Store, workload: Workload, capsys: Any
) -> None:
    lo, hi = workload.start + 3 * 3600 + 17, workload.start + 9 * 3600 - 5
    truth_raw: dict[tuple[str, str], int] = defaultdict(int)
    truth_phys: dict[tuple[str, str], Fraction] = defaultdict(Fraction)
    for iv in workload.truth.intervals:
        end = workload.end if iv.end is None else iv.end
        seconds = max(0, min(end, hi) - max(iv.start, lo))
        if seconds:
            truth_raw[(iv.namespace, iv.resource)] += iv.units * seconds
            truth_phys[(iv.namespace, iv.resource)] += iv.units * iv.factor * seconds
    assert any(iv.start < lo < (iv.end or hi) for iv in workload.truth.intervals)  # really cut
    doc = report_json(
        capsys,
        replayed,
        "--from",
        iso(lo),
        "--to",
        iso(hi),
        "--now",
        iso(workload.end),
        "--by",
        "namespace,resource",
    )
    got = {
        (r["group"]["namespace"], r["group"]["resource"]): r["gpu_seconds_raw"] for r in doc["rows"]
    }
    assert got == dict(truth_raw)
    groups = exact(replayed, ["namespace", "resource"], lo, hi, workload.end)
    assert {k: g.physical_seconds for k, g in groups.items()} == dict(truth_phys)


def test_by_label_as_it_was(replayed: Store, workload: Workload, capsys: Any) -> None:
    lo, hi = workload.start, workload.end
    truth = workload.truth.by_label("cost-center")
    assert len({k[0] for k in truth}) >= 4  # the relabelled cost centre shows up as its own value
    doc = report_json(
        capsys,
        replayed,
        "--from",
        iso(lo),
        "--to",
        iso(hi),
        "--now",
        iso(hi),
        "--by",
        "label:cost-center,resource",
    )
    got = {
        (r["group"]["label:cost-center"] or "", r["group"]["resource"]): r["gpu_seconds_raw"]
        for r in doc["rows"]
    }
    assert got == {k: raw for k, (raw, _phys) in truth.items() if raw}
