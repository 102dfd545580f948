"""Benchmark of the fleet history's fetch of one window: every sample against the changes.

A real Prometheus (Debian's, serving blocks written by promtool) and a real VictoriaMetrics
(Debian's, the same samples imported through its HTTP API) each hold the node agents' health
series of ``--gpus`` GPUs (one or more sizes), scraped every 15 s, each node at its own moment,
over a 5-minute window and a minute and a half either side. Per GPU: gpu_info, three health
states, since, four device states, two ECC aggregates, two remapped-rows causes, remap pending
and failure, and the agent's count of the changes of those (gpu_history_changes_total, as
exporter/expose/history.py counts them); per node the agent's start time; every 50th GPU an XID 13 counter and every 40th
a health reason, unchanged. What changes in the window: every 100th GPU is fenced by an XID 79
(its verdict, reason, since and a new XID counter) and every 200th node's agent is silent for
two minutes (about 1.5 % of the GPUs busy).

Each way of fetching runs in a child process of its own (so its peak RSS is its own):

- ``samples``: every sample of the window (``source.fetch(by_changes=False)``, as before);
- ``changes``: PromQL finds the busy GPUs, only their samples are fetched, each quiet GPU is
  one reading over the window (quota/fleet/changes.py, the default).

Per way: wall and CPU time of ``fleet.source.fetch``, the HTTP answers it read, the peak RSS
over the child's RSS before the fetch, the readings; and the window's history from them
(rules.window_history), which must be the same both ways (the command fails otherwise).

    nice .venv/bin/python -m bench.fleet_fetch [--gpus 1000 10000] [--no-write]

Writes the ``fleet_fetch`` section of docs/benchmarks.md; the last line printed is
``same_history=yes`` and, per store and size, ``<store>_<gpus>_changes_wall_s=<n>
<store>_<gpus>_changes_peak_mb=<n>``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.results import write_section
from gpuquota.exporter.expose import history, metrics
from gpuquota.quota import promhttp
from gpuquota.quota.fleet import changes, rules, source
from gpuquota.sim import promserver, vmserver

STEP = 15
WINDOW = 300
MAX_GAP = 60
START = (int(time.time()) // 3600 - 2) * 3600  # the window [START, START + WINDOW)
FIRST, LAST = START - MAX_GAP - 30, START + WINDOW + MAX_GAP + 15
FENCE = START + 120
SILENT = (START + 100, START + 220)
GPU_NAMESPACE = uuid.UUID("0f1c5e2a-7d3b-4c8e-9a61-2b4d6f8e0a13")
MODEL = "NVIDIA H100 80GB HBM3"
FAMILIES = (
    ("gpuquota_exporter_start_time_seconds", "gauge"),
    ("gpu_info", "gauge"),
    ("gpu_health_state", "gauge"),
    ("gpu_health_reason", "gauge"),
    ("gpu_health_since_timestamp_seconds", "gauge"),
    ("gpu_device_state", "gauge"),
    ("gpu_ecc_aggregate_errors_total", "counter"),
    ("gpu_remapped_rows_total", "counter"),
    ("gpu_row_remap_pending", "gauge"),
    ("gpu_row_remap_failure", "gauge"),
    ("gpu_xid_errors_total", "counter"),
    (changes.COUNTER, "counter"),
)

Series = tuple[str, list[tuple[float, float]]]  # labels as text, samples (t, value)


def scrapes(node: int) -> list[float]:
    """When node ``node``'s agent was scraped (its own moment in each 15 s; none while it
    was silent)."""
    offset = round(node * 0.731 % STEP, 3)
    times = [FIRST + offset + STEP * k for k in range((LAST - FIRST) // STEP)]
    if node % 200 == 1:
        return [t for t in times if not SILENT[0] <= t < SILENT[1]]
    return times


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in labels.items())


def family_series(family: str, gpu: int, times: list[float]) -> Iterator[Series]:
    """One GPU's series of ``family`` (the agent's start time: its node's, on its first GPU)."""
    node = gpu // 8
    agent = {"node": f"node-{node:04d}", "instance": f"node-{node:04d}:9400"}
    base = {"uuid": f"GPU-{uuid.uuid5(GPU_NAMESPACE, f'bench/{gpu}')}", "gpu": str(gpu % 8), **agent}  # fmt: skip
    fenced = gpu % 100 == 3

    def constant(labels: dict[str, str], value: float) -> Series:
        return _labels(labels), [(t, value) for t in times]

    def stepped(labels: dict[str, str], before: float, after: float) -> Series:
        return _labels(labels), [(t, before if t < FENCE else after) for t in times]

    if family == "gpuquota_exporter_start_time_seconds":
        if gpu % 8 == 0:
            yield constant(agent, START - 3 * 86400)
    elif family == "gpu_info":
        info = {
            **base,
            "serial": f"{1650000000000 + gpu}",
            "model": MODEL,
            "pci_bus_id": f"00000000:{0x18 + gpu % 8:02X}:00.0",
            "driver_version": "550.54.15",
            "vbios_version": "96.00.89.00.01",
        }
        yield constant(info, 1)
    elif family == "gpu_health_state":
        for state in ("healthy", "degraded", "unhealthy"):
            labels = {**base, "state": state}
            if fenced:
                yield stepped(labels, state == "healthy", state == "unhealthy")
            else:
                yield constant(labels, state == "healthy")
    elif family == "gpu_health_reason":
        if gpu % 40 == 0:
            yield constant({**base, "reason": "ecc_sbe_rate", "action": "none"}, 1)
        if fenced:
            reason = _labels({**base, "reason": "xid_79", "action": "reboot_node"})
            yield reason, [(t, 1) for t in times if t >= FENCE]
    elif family == "gpu_health_since_timestamp_seconds":
        yield stepped(base, START - 86400, FENCE if fenced else START - 86400)
    elif family == "gpu_device_state":
        for state in ("ok", "lost", "reset_required", "error"):
            yield constant({**base, "state": state}, state == "ok")
    elif family == "gpu_ecc_aggregate_errors_total":
        for kind in ("corrected", "uncorrected"):
            yield constant({**base, "type": kind}, 0)
    elif family == "gpu_remapped_rows_total":
        for cause in ("correctable", "uncorrectable"):
            yield constant({**base, "cause": cause}, 0)
    elif family in ("gpu_row_remap_pending", "gpu_row_remap_failure"):
        yield constant(base, 0)
    elif family == "gpu_xid_errors_total":
        if gpu % 50 == 0:
            yield constant({**base, "xid": "13"}, 2)
        if fenced:
            yield _labels({**base, "xid": "79"}), [(t, 1) for t in times if t >= FENCE]
    elif family == changes.COUNTER:
        yield _labels(base), counted(base["uuid"], gpu, times)


def counted(uuid: str, gpu: int, times: list[float]) -> list[tuple[float, float]]:
    """The GPU's history change counter at each scrape, as its agent counts it
    (exporter/expose/history.py) from the history series it renders at that scrape."""
    at: dict[float, list[history.Rendered]] = {t: [] for t in times}
    for family in metrics.HISTORY:
        for labels, samples in family_series(family, gpu, times):
            for t, v in samples:
                at[t].append((family, (("uuid", uuid), ("labels", labels)), f"{float(v):g}"))
    counter = history.ChangeCounter()
    return [(t, counter.update(history.fingerprints(at[t]))[uuid]) for t in times]


def fleet(gpus: int) -> Iterator[tuple[str, str, Series]]:
    """Every series (family, kind, series), family by family as OpenMetrics wants them."""
    times = {node: scrapes(node) for node in range((gpus + 7) // 8)}
    for family, kind in FAMILIES:
        for gpu in range(gpus):
            for series in family_series(family, gpu, times[gpu // 8]):
                yield family, kind, series


def write_openmetrics(gpus: int, path: Path) -> int:
    """The fleet's samples as OpenMetrics (timestamps in seconds) for promtool; how many."""
    count = 0
    with path.open("w") as out:
        seen: set[str] = set()
        for family, kind, (labels, samples) in fleet(gpus):
            if family not in seen:
                seen.add(family)
                out.write(f"# TYPE {family.removesuffix('_total')} {kind}\n")
            head = f"{family}{{{labels}}} "
            out.write("".join(f"{head}{float(v):g} {t:.3f}\n" for t, v in samples))
            count += len(samples)
        out.write("# EOF\n")
    return count


def prometheus_text(gpus: int) -> Iterator[bytes]:
    """The fleet's samples as Prometheus text with millisecond timestamps (VictoriaMetrics)."""
    for family, _kind, (labels, samples) in fleet(gpus):
        head = f"{family}{{{labels}}} "
        yield "".join(f"{head}{float(v):g} {round(t * 1000)}\n" for t, v in samples).encode()


def rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def digest(history: rules.WindowHistory) -> str:
    """The window's stretches and events, as a hash (the same history gives the same)."""
    stretches = sorted((s.serial, s.start, s.end, s.identity, s.state, s.lost) for s in history.stretches)  # fmt: skip
    events = sorted((e.serial, e.at, e.seen, e.kind, e.key, repr(sorted(e.detail.items()))) for e in history.events)  # fmt: skip
    return hashlib.sha256(repr((stretches, events)).encode()).hexdigest()[:16]


def process_cpu(pid: int) -> float:
    """CPU seconds process ``pid`` has used (the store's, during a fetch)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child(url: str, by_changes: bool, store_pid: int, start: int) -> dict[str, Any]:
    """One fetch of the window from ``start`` (the parent's START: the hour may have turned
    since), measured (runs in a process of its own)."""
    answers = [0]
    get_body = promhttp.get_body

    def counted(*args: Any, **kwargs: Any) -> bytes:
        answers[0] += 1
        return get_body(*args, **kwargs)

    promhttp.get_body = counted
    before = rss_mb()
    store = process_cpu(store_pid)
    wall, cpu = time.perf_counter(), time.process_time()
    readings, xids = source.fetch(url, start, WINDOW, MAX_GAP, 600.0, by_changes=by_changes)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    store = process_cpu(store_pid) - store
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before
    history = rules.window_history(readings, xids, {}, start, start + WINDOW, MAX_GAP)
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "store_cpu_s": store,
        "answers": answers[0],
        "rss_peak_mb": peak,
        "readings": len(readings),
        "busy": len({r.agent for r in readings if r.until is None}) if by_changes else None,
        "stretches": len(history.stretches),
        "events": len(history.events),
        "history": digest(history),
    }


def run_child(url: str, by_changes: bool, store_pid: int) -> dict[str, Any]:
    way = "changes" if by_changes else "samples"
    args = [
        sys.executable,
        "-m",
        "bench.fleet_fetch",
        "--child",
        url,
        way,
        str(store_pid),
        str(START),
    ]
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"bench.fleet_fetch child failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def measure(url: str, store_pid: int) -> dict[str, dict[str, Any]]:
    got = {way: run_child(url, way == "changes", store_pid) for way in ("samples", "changes")}
    if got["samples"]["history"] != got["changes"]["history"]:
        raise SystemExit(f"the change-based fetch gave another history: {got}")
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument(
        "--child", nargs=4, metavar=("URL", "WAY", "PID", "START"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.child:
        url, way, pid, start = args.child
        print(json.dumps(child(url, way == "changes", int(pid), int(start))))
        return
    load = os.getloadavg()[0]
    rows: list[tuple[str, int, int, dict[str, dict[str, Any]]]] = []
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        for gpus in args.gpus:
            work = Path(tmp) / str(gpus)
            work.mkdir()
            samples = write_openmetrics(gpus, work / "fleet.om")
            promserver.create_blocks(work / "fleet.om", work / "tsdb")
            (work / "fleet.om").unlink()
            with promserver.serving_blocks(work / "tsdb", work) as prometheus:
                got = measure(prometheus.url, prometheus.proc.pid)
                rows.append(("Prometheus 2.42", gpus, samples, got))
            with vmserver.serving(work / "vm") as vm:
                vmserver.import_text(vm, prometheus_text(gpus))
                rows.append(("VictoriaMetrics 1.79", gpus, samples, measure(vm.url, vm.proc.pid)))
            for store, n, _, got in rows[-2:]:
                print(store, n, json.dumps(got))
    load_after = os.getloadavg()[0]
    table = [
        "| store | GPUs (samples) | way | answers | wall / CPU of the fetch | the store's CPU | peak RSS over the RSS before | readings | busy GPUs |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for store, gpus, samples, got in rows:
        for way in ("samples", "changes"):
            g = got[way]
            bold = "**" if way == "changes" else ""
            table.append(
                f"| {store} | {gpus:,} ({samples:,}) | {way} | {g['answers']} | "
                f"{bold}{g['wall_s']:.2f}{bold} / {g['cpu_s']:.2f} s | {g['store_cpu_s']:.2f} s | {bold}{g['rss_peak_mb']:.0f} MB{bold} | "
                f"{g['readings']:,} | {'' if g['busy'] is None else g['busy']} |"
            )
    text = "\n".join(
        [
            f"### Fleet history: fetching one 5-minute window of {' and '.join(f'{g:,}' for g in args.gpus)} GPUs",
            "",
            f"Command: `nice .venv/bin/python -m bench.fleet_fetch --gpus {' '.join(map(str, args.gpus))}` "
            f"({platform.machine()}, {os.cpu_count()} cores shared with other work, Python "
            f"{platform.python_version()}; load average {load:.1f} before, {load_after:.1f} after).",
            "",
            "Data (bench/fleet_fetch.py): each GPU's 15 health series, its history change counter "
            "(as its agent counts it) and its node's start time, every 15 s, over the window and a minute and a half either side; every 100th "
            "GPU fenced in the window, every 200th node silent for two minutes. The same "
            "samples in a real Prometheus (promtool blocks) and a real VictoriaMetrics "
            "(imported), both asked through their HTTP API on this machine. Each way in a child "
            "process of its own; both ways gave the same history (stretches and events) for "
            "every store and size.",
            "",
            *table,
        ]
    )
    if not args.no_write:
        write_section("fleet_fetch", text)
    figures = " ".join(
        f"{store.split()[0].lower()}_{gpus}_changes_wall_s={got['changes']['wall_s']:.2f} "
        f"{store.split()[0].lower()}_{gpus}_changes_peak_mb={got['changes']['rss_peak_mb']:.0f}"
        for store, gpus, _, got in rows
    )
    print(f"same_history=yes {figures}")


if __name__ == "__main__":
    main()
