"""XID counters across agent silences and restarts, and the history asked of the time-series
store by changes against every sample, on a real Prometheus serving series written here
(promtool blocks, as tests/fleet/scenario.py's) and a real store of either kind.

Six agents, one GPU each, scraped every 15 s, 5-minute windows (a silence of 10 minutes is
longer than a window and its fetch):

- N1: silent [T+600, T+1200); back with an XID 79 counter at 1 it did not have before.
- N2: an XID 13 counter at 2 from before anything is ingested; silent as N1; back at 3, its
  agent's start time unchanged (it went on counting): one XID 13.
- N3: the same, but its agent restarted during the silence (a new start time; its counter
  began again from zero): back at 3 is three XID 13.
- N4: its agent restarts at T+1500 without a silence (no scrape in [T+1480, T+1500)); the
  XID 13 counter at 2 before, gone after, back at 1 at T+1800: one XID 13, not three.
- N5: a new board at T+1800 with an XID 31 counter already at 1: nothing known before it,
  a baseline (no XID).
- N6: healthy and unchanged throughout (a quiet GPU for the change-based fetch).
"""

from __future__ import annotations

import ast
import json
import time
from collections.abc import Iterator

import pytest

from gpuquota.quota import cli
from gpuquota.quota.fleet import ingest, source
from gpuquota.quota.fleet.write import FleetStore
from gpuquota.quota.ledger.ingest import LedgerSettings
from gpuquota.quota.store.db import open_store
from gpuquota.sim import vmserver
from tests.fleet import scenario
from tests.fleet.test_gpus_cli import iso
from tests.fleet.test_history import dump, events
from tests.prometheus import Prometheus, create_blocks, serving

WINDOW = 300
STEP = 15
T = (int(time.time()) // 3600 - 3) * 3600
BORN, END = T - 600, T + 3000
SILENT = (T + 600, T + 1200)
MODEL = "NVIDIA H100 80GB HBM3"


def said(gpu: int, t: int) -> tuple[float, dict[str, int]] | None:
    """Agent ``gpu``'s start time and XID counters at ``t`` (None: not scraped)."""
    silent = SILENT[0] <= t < SILENT[1]
    if gpu in (1, 2, 3) and silent:
        return None
    if gpu == 1:
        return BORN - 1000, ({"79": 1} if t >= SILENT[1] else {})
    if gpu == 2:
        return BORN - 1000, {"13": 3 if t >= SILENT[1] else 2}
    if gpu == 3:
        return (BORN - 1000, {"13": 2}) if t < SILENT[0] else (T + 1100, {"13": 3})
    if gpu == 4:
        if T + 1480 <= t < T + 1500:
            return None
        if t < T + 1500:
            return BORN - 1000, {"13": 2}
        return T + 1495, ({"13": 1} if t >= T + 1800 else {})
    if gpu == 5:
        return (T + 1790, {"31": 1}) if t >= T + 1800 else None
    return BORN - 1000, {}


def openmetrics() -> str:
    families: dict[str, tuple[str, dict[str, list[str]]]] = {}

    def add(name: str, kind: str, labels: dict[str, str], value: float, t: int) -> None:
        family = name.removesuffix("_total") if kind == "counter" else name
        text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        line = f"{name}{{{text}}} {value} {t}"
        families.setdefault(family, (kind, {}))[1].setdefault(text, []).append(line)

    for t in range(BORN, END, STEP):
        for gpu in range(1, 7):
            got = said(gpu, t)
            if got is None:
                continue
            started, xids = got
            node = f"node-{gpu}"
            agent = {"node": node, "instance": f"{node}:9400"}
            base = {**agent, "gpu": "0", "uuid": f"GPU-n{gpu}"}
            add("gpuquota_exporter_start_time_seconds", "gauge", agent, started, t)
            info = {
                **base,
                "serial": f"N{gpu}",
                "model": MODEL,
                "pci_bus_id": "00000000:18:00.0",
                "driver_version": "550.54.15",
                "vbios_version": "96.00.89.00.01",
            }
            add("gpu_info", "gauge", info, 1, t)
            for state in ("healthy", "degraded", "unhealthy"):
                add("gpu_health_state", "gauge", {**base, "state": state}, int(state == "healthy"), t)  # fmt: skip
            add("gpu_health_since_timestamp_seconds", "gauge", base, BORN, t)
            for code, count in xids.items():
                add("gpu_xid_errors_total", "counter", {**base, "xid": code}, count, t)
    lines: list[str] = []
    for family, (kind, series) in families.items():
        lines.append(f"# TYPE {family} {kind}")
        for samples in series.values():
            lines += samples
    return "\n".join(lines) + "\n# EOF\n"


def vm_lines(openmetrics: str) -> bytes:
    """OpenMetrics lines (seconds) as Prometheus text with milliseconds (VictoriaMetrics')."""
    out = []
    for line in openmetrics.splitlines():
        if line and not line.startswith("#"):
            head, t = line.rsplit(" ", 1)
            out.append(f"{head} {int(t) * 1000}\n")
    return "".join(out).encode()


@pytest.fixture(scope="module")
def victoria_metrics(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """Two real VictoriaMetrics, one holding this module's samples, one the scenario's."""
    with (
        vmserver.serving(tmp_path_factory.mktemp("vm-silences")) as silences,
        vmserver.serving(tmp_path_factory.mktemp("vm-scenario")) as fleet,
    ):
        vmserver.import_text(silences, [vm_lines(openmetrics())])
        vmserver.import_text(fleet, [vm_lines(scenario.openmetrics())])
        yield silences.url, fleet.url


@pytest.fixture(scope="module")
def silences_prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    work = tmp_path_factory.mktemp("silences")
    create_blocks(openmetrics(), work / "tsdb", work)
    with serving(work / "tsdb", work) as prometheus:
        yield prometheus


def settings(url: str, window: int = WINDOW) -> LedgerSettings:
    return LedgerSettings(
        prometheus_url=url, window=window, delay=300, lookback=0, backfill=12 * 3600
    )


def ingested(url: str, db_url: str, cluster: str, now: int, *, window: int = WINDOW, by_changes: bool = True) -> None:  # fmt: skip
    with open_store(db_url) as store:
        assert ingest.run_once(FleetStore(store, cluster), settings(url, window), now, by_changes=by_changes)  # fmt: skip


def test_xids_across_silences_and_restarts(
    silences_prometheus: Prometheus,
    db_url: str,
    cluster: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ingested(silences_prometheus.url, db_url, cluster, END + 300)
    history = dump(db_url, cluster)
    before, after = SILENT[0] - STEP, SILENT[1]
    silence = {"silence": [before, after]}

    def xids(serial: str) -> list[tuple[object, ...]]:
        return [(x[1], x[2], x[4], dict(ast.literal_eval(x[5]))) for x in events(history, serial, "xid")]  # fmt: skip

    # N1: born during its agent's silence; dated to the silence, seen when the agent is back
    assert xids("N1") == [(after, before, "xid:79", {"code": "79", "count": 1, **silence})]
    # N2: the same agent went on counting: 2 -> 3 is one
    assert xids("N2") == [(after, before, "xid:13", {"code": "13", "count": 1, **silence})]
    # N3: its agent restarted meanwhile: its counter began from zero, all 3 are new
    assert xids("N3") == [(after, before, "xid:13", {"code": "13", "count": 3, **silence})]
    # N4: restarted without a silence, counting from zero again: one XID, not the 2 before
    assert xids("N4") == [(T + 1800, T + 1800, "xid:13", {"code": "13", "count": 1})]
    # N5: new with a counter at 1, nothing known before it: a baseline; N6: nothing
    assert xids("N5") == xids("N6") == []
    assert [x[1:3] for x in events(history, "N1", "gap")] == [(after, before)]

    # and in the failure rates: per node and per model
    period = ["--db", db_url, "--cluster", cluster, "--from", iso(T), "--to", iso(END)]
    assert cli.main(["gpus", *period, "--by", "node", "--json"]) == 0
    groups = {g["group"]: g["xids"] for g in json.loads(capsys.readouterr().out)["groups"]}
    assert groups == {"node-1": 1, "node-2": 1, "node-3": 3, "node-4": 1, "node-5": 0, "node-6": 0}
    # a rate over so few GPU-days is held back by default (--min-gpu-days): ask for it
    assert cli.main(["gpus", *period, "--by", "model", "--min-gpu-days", "0", "--json"]) == 0
    (model,) = json.loads(capsys.readouterr().out)["groups"]
    assert (model["group"], model["xids"]) == (MODEL, 6)
    assert model["xids_per_1000_gpu_days"] > 0


def test_changes_give_the_history_of_every_sample(
    silences_prometheus: Prometheus,
    fleet_prometheus: Prometheus,
    victoria_metrics: tuple[str, str],
    ledger_sqlite_url: str,
    cluster: str,
) -> None:
    """Asking only the GPUs that changed (and one reading for each quiet one) stores what
    every sample stores: silences, restarts, appearances, moves, gaps, fences, reasons, lost
    and counters; 5-minute windows on both data sets, and the scenario's hourly ones; and
    VictoriaMetrics, holding the same samples, gives the same history as Prometheus."""
    silences_vm, fleet_vm = victoria_metrics
    cases = (
        (silences_prometheus.url, silences_vm, WINDOW, END + 300),
        (fleet_prometheus.url, fleet_vm, WINDOW, scenario.D + 300),
        (fleet_prometheus.url, fleet_vm, scenario.WINDOW, scenario.D + 300),
    )
    for i, (prometheus, victoria, window, now) in enumerate(cases):
        expected = None
        for store, url in (("prom", prometheus), ("vm", victoria)):
            by_samples, by_changes = f"{cluster}-{i}-{store}-samples", f"{cluster}-{i}-{store}-changes"  # fmt: skip
            ingested(url, ledger_sqlite_url, by_samples, now, window=window, by_changes=False)
            ingested(url, ledger_sqlite_url, by_changes, now, window=window)
            samples = dump(ledger_sqlite_url, by_samples)
            assert samples["stretches"] and samples["events"]
            assert dump(ledger_sqlite_url, by_changes) == samples, (store, window)
            if expected is None:
                expected = samples
            assert samples == expected, (store, window)


def test_quiet_gpus_are_not_fetched(silences_prometheus: Prometheus) -> None:
    """The change-based fetch reads one quiet reading for a GPU that did not change, and
    every sample of one that did."""
    start = T + 2400  # N5 appeared long before, N4's restart is over: all quiet but none
    readings, _ = source.fetch(silences_prometheus.url, start, WINDOW, 60)
    assert sorted((r.serial, r.until) for r in readings) == [
        (f"N{gpu}", start + WINDOW) for gpu in range(1, 7)
    ]
    start = T + 1200  # N1-N3 come back: every sample of theirs, one reading of the others
    readings, _ = source.fetch(silences_prometheus.url, start, WINDOW, 60)
    assert sorted(r.serial for r in readings if r.until is not None) == ["N6"]
    # N1's samples in [start - 60, start + WINDOW + 60], from its return at start on
    assert len([r for r in readings if r.serial == "N1"]) == (WINDOW + 60) // STEP + 1
    all_samples, _ = source.fetch(silences_prometheus.url, start, WINDOW, 60, by_changes=False)
    assert (
        {r.serial for r in all_samples}
        == {r.serial for r in readings}
        == {"N1", "N2", "N3", "N4", "N6"}
    )
