"""Benchmark of the usage ledger's ingestion: one hour of a 2,000-GPU cluster's counters.

Generates the node agents' counters (the #19 contract's names and labels) of 2,000 GPUs
running 20,000 pods a day (each GPU busy 90 % of the time, pods of 2.2 h on average, one GPU
each, a per-pod used and energy counter and a per-GPU unallocated energy counter) sampled
every 15 s, writes them into TSDB blocks with promtool and serves them from a real
Prometheus. Then the controller's ingester (quota/ledger/ingest.py) ingests the hour:

- CPU: process CPU time of one ``run_once`` (fetch, compute, write one window, idle
  allocations) into a fresh cluster, on SQLite and on PostgreSQL;
- watch delay: the same turn again while a stand-in watch handler runs in the same process
  (an event every 2 ms, decoded as the controller decodes a pod) and records how late each
  event is handled; the worst and p99 delay, and the same without ingestion for comparison;
- bytes per allocated GPU-hour: the ledger tables' size in PostgreSQL and SQLite after the
  hour, per allocated GPU-hour of the hour, and in steady state (window rows every hour, a
  series row per new pod, the device rows once), and what a month takes. The devices' UUIDs
  are real ones' shape ("GPU-" and a UUID, as NVML gives), so the bytes are those of a real
  cluster.

    .venv/bin/python -m bench.ledger [--gpus 2000] [--pods-per-day 20000] [--pg-url URL]

Writes the `ledger` section of docs/benchmarks.md; the last line printed is
``cpu_s_sqlite=<n> cpu_s_pg=<n> delay_ms=<n> bytes_per_gpu_hour_pg=<n> bytes_per_gpu_hour_sqlite=<n>``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import random
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from sqlalchemy import create_engine, text

from bench.results import write_section
from gpuquota.quota.accounting.rows import AllocationRow, Batch
from gpuquota.quota.ledger.ingest import Ingester, LedgerProcess, LedgerSettings
from gpuquota.quota.ledger.rules import DAY, Usage
from gpuquota.quota.ledger.source import SeriesSamples
from gpuquota.quota.ledger.write import LedgerStore
from gpuquota.quota.store import db
from gpuquota.sim import promserver

HOUR = 3600
STEP = 15
MARGIN = 120  # samples this long either side of the hour (coverage at its edges)
BUSY = 0.9
MONTH_HOURS = 730
SCHEMA = "bench_ledger"
# a fixed namespace: the same GPU UUIDs on every run, as a real cluster's stay
GPU_NAMESPACE = uuid.UUID("5d0c3b8e-19a4-4c2f-8e61-7b9d2a4f0c19")
POD_JSON = json.dumps(
    {
        "metadata": {"name": "p", "namespace": "ns", "uid": str(uuid.uuid4()), "labels": {}},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}] * 4},
    }
)


def gpu_uuid(gpu: int) -> str:
    """The ``gpu``-th GPU's UUID, as NVML gives it: "GPU-" and a UUID (40 characters)."""
    return f"GPU-{uuid.uuid5(GPU_NAMESPACE, f'bench/{gpu}')}"


@dataclass(frozen=True)
class Pod:
    gpu: int
    uid: str
    name: str
    namespace: str
    start: int
    end: int
    activity: float
    watts: float


def schedule(
    lo: int, hi: int, gpus: int, pods_per_day: int, seed: int = 19
) -> tuple[list[Pod], list[list[tuple[int, int]]]]:
    """The pods that run on each GPU over [lo, hi) (each GPU busy BUSY of the time, pods of
    gpus x 1 day / pods_per_day x BUSY seconds on average), and each GPU's held spans."""
    rng = random.Random(seed)
    cycle = gpus * 86400 / pods_per_day  # a GPU's pod plus the gap after it, on average
    pods: list[Pod] = []
    held: list[list[tuple[int, int]]] = []
    for gpu in range(gpus):
        t = lo + MARGIN - int(rng.uniform(0, 3 * cycle))
        spans: list[tuple[int, int]] = []
        while t < hi:
            length = max(60, int(rng.expovariate(1 / (cycle * BUSY))))
            gap = int(rng.expovariate(1 / (cycle * (1 - BUSY))))
            if t + length > lo:
                ns = f"team-{rng.randrange(50):02d}"
                pods.append(
                    Pod(
                        gpu,
                        str(uuid.UUID(int=rng.getrandbits(128))),
                        f"job-{rng.getrandbits(32):08x}-0",
                        ns,
                        t,
                        t + length,
                        rng.random(),
                        rng.uniform(80, 700),
                    )
                )
                spans.append((t, t + length))
            t += length + gap
        held.append(spans)
    return pods, held


def generate(
    path: Path, start: int, gpus: int, pods_per_day: int, seed: int = 19
) -> tuple[list[Pod], int, int]:
    """OpenMetrics samples of [start - MARGIN, start + HOUR + MARGIN] into ``path``; returns
    the pods overlapping it, the samples written and the series written."""
    lo, hi = start - MARGIN, start + HOUR + MARGIN
    pods, held = schedule(lo, hi, gpus, pods_per_day, seed)
    samples = 0
    series = 0
    times = range((lo // STEP) * STEP, hi + 1, STEP)
    origin = start - 86400
    with path.open("w") as out:
        for metric in ("used_seconds", "energy_joules"):
            out.write(f"# TYPE gpu_pod_{metric} counter\n")
            for p in pods:
                rate = p.activity if metric == "used_seconds" else p.watts
                extra = ',activity="sm_active"' if metric == "used_seconds" else ""
                labels = (
                    f'{{gpu="{p.gpu % 8}",uuid="{gpu_uuid(p.gpu)}",instance="node-{p.gpu // 8}:9400",'
                    f'namespace="{p.namespace}",pod="{p.name}",pod_uid="{p.uid}"{extra}}}'
                )
                lines = [
                    f"gpu_pod_{metric}_total{labels} {rate * (t - p.start):.3f} {t}\n"
                    for t in times
                    if p.start <= t < p.end
                ]
                out.writelines(lines)
                samples += len(lines)
                series += 1 if lines else 0
        out.write("# TYPE gpu_unallocated_energy_joules counter\n")
        for gpu, spans in enumerate(held):
            labels = f'{{gpu="{gpu % 8}",uuid="{gpu_uuid(gpu)}",instance="node-{gpu // 8}:9400"}}'
            for t in times:
                # 60 W while nobody holds it, counted from a day before the hour
                busy = sum(max(0, min(e, t) - max(s, origin)) for s, e in spans)
                out.write(
                    f"gpu_unallocated_energy_joules_total{labels} {60.0 * (t - origin - busy):.1f} {t}\n"
                )
                samples += 1
            series += 1
        out.write("# EOF\n")
    return pods, samples, series


@dataclass(frozen=True)
class Day:
    """A day of the ledger written hour by hour through the ingester's own writer, then rolled
    up by its own roll-up: the rows and bytes of each stage."""

    gpu_hours: float
    series: int  # every series in the store: the day's pods' and the GPUs' unallocated
    new_series: int  # series of the pods that started that day
    hourly_rows: int
    rolled_rows: int
    hourly_bytes: tuple[int, int, int]  # (windows, series, devices) after the day's windows
    rolled_bytes: tuple[int, int, int]  # the same after the roll-up (PostgreSQL: VACUUM FULL)
    rollup_cpu_s: float


def _day_windows(
    day: int, pods: list[Pod], held: list[list[tuple[int, int]]]
) -> list[tuple[int, list[tuple[SeriesSamples, Usage]]]]:
    """Per hour of the day, each series' row as ingestion writes it: a pod's for every hour
    it ran in (used, energy and sampled over the time it ran), a GPU's unallocated energy (60
    W) for every hour it was not held all of."""
    out = []
    for hour in range(day, day + DAY, HOUR):
        end = hour + HOUR
        rows: list[tuple[SeriesSamples, Usage]] = []
        for p in pods:
            ran = min(p.end, end) - max(p.start, hour)
            if ran <= 0:
                continue
            upto = min(p.end, end) - p.start
            labels = SeriesSamples(
                gpu_uuid(p.gpu), "pod", p.uid, p.namespace, p.name,
                f"node-{p.gpu // 8}:9400", None, None, "sm_active",
            )  # fmt: skip
            rows.append(
                (
                    labels,
                    Usage(p.activity * ran, p.watts * ran, float(ran), p.activity * upto,
                          p.watts * upto),
                )
            )  # fmt: skip
        for gpu, spans in enumerate(held):
            busy = sum(max(0, min(e, end) - max(s, hour)) for s, e in spans)
            if busy >= HOUR:
                continue  # no increase: no row (rules.stored)
            labels = SeriesSamples(gpu_uuid(gpu), "unallocated", "", node=f"node-{gpu // 8}:9400")
            joules = 60.0 * (HOUR - busy)
            rows.append((labels, Usage(0.0, joules, float(HOUR), None, joules + hour)))
        out.append((hour, rows))
    return out


def store_day(url: str, day: int, gpus: int, pods_per_day: int, sqlite: Path | None) -> Day:
    """Write a day of windows into a fresh store, hour by hour (LedgerStore.replace_window),
    then roll it up (LedgerStore.roll_up_day), measuring the bytes before and after."""
    pods, held = schedule(day - MARGIN, day + DAY, gpus, pods_per_day, seed=23)
    pods = [p for p in pods if p.end > day]
    db.upgrade(url)
    store = db.open_store(url)
    ledger = LedgerStore(store, "bench-day")
    windows = _day_windows(day, pods, held)
    for hour, rows in windows:
        usage = {s.key: u for s, u in rows}

        def usage_of(
            series: SeriesSamples, _base: object, found: dict[tuple[str, str, str], Usage] = usage
        ) -> Usage:
            return found[series.key]

        ledger.replace_window(hour, HOUR, [s for s, _ in rows], usage_of)

    def size() -> tuple[int, int, int]:
        return sqlite_bytes(sqlite) if sqlite is not None else pg_bytes(url)

    hourly = size()
    cpu = time.process_time()
    before, after = ledger.roll_up_day(day)
    cpu = time.process_time() - cpu
    store.close()
    if sqlite is None:
        engine = create_engine(url, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            for table in LEDGER_TABLES:
                conn.execute(text(f"VACUUM FULL {table}"))
        engine.dispose()
    rolled = size()
    gpu_hours = sum(min(p.end, day + DAY) - max(p.start, day) for p in pods) / HOUR
    return Day(
        gpu_hours,
        row_counts(url)[0],
        sum(1 for p in pods if p.start >= day),
        before,
        after,
        hourly,
        rolled,
        cpu,
    )


def allocations(pods: list[Pod], at: int) -> Batch:
    """The open allocations at ``at`` (idle allocations are computed over them)."""
    rows = [
        AllocationRow(
            pod_uid=p.uid,
            resource_name="nvidia.com/gpu",
            namespace=p.namespace,
            pod_name=p.name,
            owner_kind=None,
            owner_name=None,
            node=f"node-{p.gpu // 8}",
            node_pool=None,
            gpu_model="NVIDIA-H100-80GB-HBM3",
            raw_units=1,
            physical_gpus=1.0,
            replicas=None,
            sharing_strategy=None,
            mig_profile=None,
            started_at=p.start,
            ended_at=None,
            end_reason=None,
            estimated=False,
            qos_class=None,
            updated_at=p.start,
            share_numerator=1,
            share_denominator=1,
        )
        for p in pods
        if p.start <= at < p.end
    ]
    return Batch(allocations=rows, observed_at=at)


class WatchStandIn:
    """Events arrive every ``every`` s (a producer thread); the handler thread decodes each
    as the controller decodes a pod and records how late it was handled."""

    def __init__(self, every: float = 0.002) -> None:
        self.every = every
        self.delays: list[float] = []
        self._queue: queue.SimpleQueue[float | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._produce, daemon=True),
            threading.Thread(target=self._handle, daemon=True),
        ]

    def _produce(self) -> None:
        due = time.perf_counter()
        while not self._stop.is_set():
            due += self.every
            pause = due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            self._queue.put(due)  # when it should have arrived: late producing counts too
        self._queue.put(None)

    def _handle(self) -> None:
        while (sent := self._queue.get()) is not None:
            json.loads(POD_JSON)
            self.delays.append(time.perf_counter() - sent)

    def __enter__(self) -> WatchStandIn:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()

    def worst_ms(self) -> tuple[float, float]:
        ordered = sorted(self.delays)
        return ordered[-1] * 1000, ordered[int(len(ordered) * 0.99)] * 1000


def _pg_schema_url(base: str, schema: str) -> str:
    admin = create_engine(base)
    with admin.begin() as conn:
        conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    admin.dispose()
    return f"{base}{'&' if '?' in base else '?'}options={quote(f'-csearch_path={schema}')}"


def ingest(url: str, prom: str, start: int, pods: list[Pod], cluster: str) -> tuple[float, int]:
    """CPU seconds of one ingest turn (the hour, then idle allocations) into ``cluster``."""
    store = db.open_store(url)
    store.write(cluster, allocations(pods, start + HOUR))
    store.close()
    settings = LedgerSettings(prom, backfill=HOUR, lookback=0)
    ingester = Ingester(url, cluster, settings, clock=lambda: start + HOUR + 300)
    cpu = time.process_time()
    turned = ingester.run_once()
    cpu = time.process_time() - cpu
    rows = ingester.facts.rows
    ingester.stop()
    assert turned == 1, turned
    return cpu, rows


def ingest_in_child(url: str, prom: str, start: int, pods: list[Pod], cluster: str) -> None:
    """The controller's way: the same turn in a LedgerProcess (real clock: ``start`` must be
    the last closed hour)."""
    store = db.open_store(url)
    store.write(cluster, allocations(pods, start + HOUR))
    store.close()
    child = LedgerProcess(url, cluster, LedgerSettings(prom, backfill=HOUR, lookback=0))
    child.start()
    deadline = time.monotonic() + 600
    while child.facts.turns < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    child.stop()
    if child.facts.windows != 1:
        raise SystemExit(
            f"the ledger process ingested {child.facts.windows} windows: {child.facts}"
        )


LEDGER_TABLES = ("usage_windows", "usage_series", "usage_devices")


def pg_bytes(url: str) -> tuple[int, int, int]:
    """Bytes (table and indexes) of usage_windows, usage_series and usage_devices."""
    engine = create_engine(url)
    with engine.connect() as conn:
        windows, series, devices = (
            int(conn.execute(text(f"SELECT pg_total_relation_size('{t}')")).scalar() or 0)
            for t in LEDGER_TABLES
        )
    engine.dispose()
    return windows, series, devices


def row_counts(url: str) -> tuple[int, int]:
    """Rows of usage_series and usage_devices."""
    engine = create_engine(url)
    with engine.connect() as conn:
        series = conn.execute(text("SELECT count(*) FROM usage_series")).scalar()
        devices = conn.execute(text("SELECT count(*) FROM usage_devices")).scalar()
    engine.dispose()
    return int(series or 0), int(devices or 0)


def sqlite_bytes(path: Path) -> tuple[int, int, int]:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("VACUUM")
    sizes = dict(
        conn.execute(
            "SELECT tbl_name, SUM(pgsize) FROM dbstat JOIN sqlite_master USING (name) "
            f"WHERE tbl_name IN {LEDGER_TABLES} GROUP BY tbl_name"
        ).fetchall()
    )
    conn.close()
    windows, series, devices = (int(sizes.get(t, 0)) for t in LEDGER_TABLES)
    return windows, series, devices


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=2000)
    parser.add_argument("--pods-per-day", type=int, default=20_000)
    parser.add_argument(
        "--pg-url",
        default=os.environ.get(
            "GPUQUOTA_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
        ),
    )
    parser.add_argument("--no-write", action="store_true", help="do not update docs/benchmarks.md")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="gq-bench-ledger-"))
    try:
        return run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, work: Path) -> int:
    start = (int(time.time()) - 300) // HOUR * HOUR - HOUR  # the last closed hour
    source = work / "samples.om"
    began = time.monotonic()
    pods, samples, series = generate(source, start, args.gpus, args.pods_per_day)
    print(
        f"{samples:,} samples of {series:,} series in {time.monotonic() - began:.0f} s",
        file=sys.stderr,
    )
    began = time.monotonic()
    promserver.create_blocks(source, work / "tsdb")
    source.unlink()
    tsdb_bytes = sum(f.stat().st_size for f in (work / "tsdb").rglob("*") if f.is_file())
    print(f"promtool blocks in {time.monotonic() - began:.0f} s", file=sys.stderr)
    gpu_hours = sum(max(0, min(p.end, start + HOUR) - max(p.start, start)) for p in pods) / HOUR
    new_pods = sum(1 for p in pods if start <= p.start < start + HOUR)
    hour_pods = sum(1 for p in pods if p.start < start + HOUR and p.end > start)
    sqlite_path = work / "ledger.db"
    sqlite_url = f"sqlite:///{sqlite_path}"
    db.upgrade(sqlite_url)
    pg_url = _pg_schema_url(args.pg_url, SCHEMA)
    db.upgrade(pg_url)
    load = os.getloadavg()[0]
    with promserver.serving_blocks(work / "tsdb", work) as prom:
        cpu_sqlite, rows = ingest(sqlite_url, prom.url, start, pods, "bench")
        cpu_pg, _ = ingest(pg_url, prom.url, start, pods, "bench")
        bytes_sqlite = sqlite_bytes(sqlite_path)
        bytes_pg = pg_bytes(pg_url)
        n_series, n_devices = row_counts(pg_url)
        with WatchStandIn() as alone:
            time.sleep(5)
        idle_worst, idle_p99 = alone.worst_ms()
        with WatchStandIn() as during:  # in a thread of the same process: for comparison
            ingest(pg_url, prom.url, start, pods, "bench-thread")
        thread_worst, thread_p99 = during.worst_ms()
        delays = {}
        for name, url in (("pg", pg_url), ("sqlite", sqlite_url)):
            with WatchStandIn() as during:
                ingest_in_child(url, prom.url, start, pods, f"bench-process-{name}")
            delays[name] = during.worst_ms()
        (worst, p99), (worst_sqlite, p99_sqlite) = delays["pg"], delays["sqlite"]
    load_after = os.getloadavg()[0]
    day = (start // DAY - 2) * DAY  # a whole past UTC day
    print("a day of rows, then its roll-up ...", file=sys.stderr)
    day_pg = store_day(
        _pg_schema_url(args.pg_url, f"{SCHEMA}_day"), day, args.gpus, args.pods_per_day, None
    )
    day_path = work / "day.db"
    day_sqlite = store_day(f"sqlite:///{day_path}", day, args.gpus, args.pods_per_day, day_path)

    def day_per_gpu_hour(d: Day, rolled: bool) -> float:
        """A day's window rows (rolled up or not), a series row per pod that started in it and
        the device rows over a month (as per_gpu_hour), per allocated GPU-hour of the day."""
        windows, series_bytes, device_bytes = d.rolled_bytes if rolled else d.hourly_bytes
        series_part = series_bytes / max(1, d.series) * d.new_series
        return (windows + series_part + device_bytes * 24 / MONTH_HOURS) / d.gpu_hours

    def per_gpu_hour(sizes: tuple[int, int, int], steady: bool) -> float:
        """Window rows come every hour; a series row once per pod (and once per GPU for its
        unallocated energy), a device row once per GPU: in steady state only the hour's new
        pods add series, and the device rows, written once for the GPU's life, count for a
        month of hours (a short life: more bytes per hour than a real GPU's years)."""
        windows, series_bytes, device_bytes = sizes
        # the hour's series: its pods' and every GPU's unallocated energy (those without a row
        # this hour too); in steady state only the new pods add series
        per_series = series_bytes / max(1, n_series)
        series_part = per_series * new_pods if steady else series_bytes
        device_part = device_bytes / MONTH_HOURS if steady else device_bytes
        return (windows + series_part + device_part) / gpu_hours

    first_pg, first_sqlite = per_gpu_hour(bytes_pg, False), per_gpu_hour(bytes_sqlite, False)
    steady_pg, steady_sqlite = per_gpu_hour(bytes_pg, True), per_gpu_hour(bytes_sqlite, True)
    rolled_pg, rolled_sqlite = day_per_gpu_hour(day_pg, True), day_per_gpu_hour(day_sqlite, True)
    unrolled_pg = day_per_gpu_hour(day_pg, False)
    unrolled_sqlite = day_per_gpu_hour(day_sqlite, False)
    month_gpu_hours = gpu_hours * MONTH_HOURS
    prom_per_sample = tsdb_bytes / samples
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    summary = (
        f"cpu_s_sqlite={cpu_sqlite:.2f} cpu_s_pg={cpu_pg:.2f} delay_ms={max(worst, worst_sqlite):.1f} "
        f"bytes_per_gpu_hour_pg={rolled_pg:.0f} bytes_per_gpu_hour_sqlite={rolled_sqlite:.0f}"
    )
    markdown = f"""### Usage ledger: ingesting one hour of a 2,000-GPU cluster

Command: `.venv/bin/python -m bench.ledger --gpus {args.gpus} --pods-per-day {args.pods_per_day}`
({machine}; Prometheus {_prom_version()}, PostgreSQL and SQLite on the same machine; load
average {load:.1f} before, {load_after:.1f} after).

Data: {args.gpus:,} GPUs, {args.pods_per_day:,} pods a day (each GPU busy {BUSY:.0%} of the
time), one hour of the node agents' counters at a 15 s scrape interval, written with
`promtool tsdb create-blocks-from openmetrics` and served by a real Prometheus:
{samples:,} samples of {series:,} series ({hour_pods:,} pods in the hour, {new_pods:,} of
them new, {gpu_hours:,.0f} allocated GPU-hours); {rows:,} ledger rows for the hour, of
{n_series:,} series (the pods' and every GPU's unallocated energy).
Per row, PostgreSQL: a window {bytes_pg[0] / max(1, rows):.0f} B, a series
{bytes_pg[1] / max(1, n_series):.0f} B, a device {bytes_pg[2] / max(1, n_devices):.0f} B
({n_devices:,} devices); SQLite: {bytes_sqlite[0] / max(1, rows):.0f} B,
{bytes_sqlite[1] / max(1, n_series):.0f} B and {bytes_sqlite[2] / max(1, n_devices):.0f} B
(tables and indexes).

| | SQLite | PostgreSQL | target |
|---|---:|---:|---|
| controller CPU to ingest the hour (fetch, compute, write, idle allocations) | **{cpu_sqlite:.2f} s** | **{cpu_pg:.2f} s** | < 5 s |
| worst delay of a watch event handled meanwhile (p99) | **{worst_sqlite:.1f} ms** ({p99_sqlite:.1f}) | **{worst:.1f} ms** ({p99:.1f}) | < 100 ms |
| bytes per allocated GPU-hour, steady state: a day's rows rolled up (`--ledger-rollup-after`, the default), a series row per pod | **{rolled_sqlite:.0f} B** | **{rolled_pg:.0f} B** | < 200 B |
| the same day before its roll-up (hourly rows) | {unrolled_sqlite:.0f} B | {unrolled_pg:.0f} B | |
| the hour ingested from Prometheus (hourly rows, a series row per new pod) | {steady_sqlite:.0f} B | {steady_pg:.0f} B | |
| the hour, every series new (a ledger's first hour) | {first_sqlite:.0f} B | {first_pg:.0f} B | |
| a month of this cluster ({month_gpu_hours:,.0f} GPU-hours), rolled up | {rolled_sqlite * month_gpu_hours / 1e6:.0f} MB | {rolled_pg * month_gpu_hours / 1e6:.0f} MB | |
| controller CPU to roll a day up (once a day, in the ledger process) | {day_sqlite.rollup_cpu_s:.2f} s | {day_pg.rollup_cpu_s:.2f} s | |

The day: {day_pg.gpu_hours:,.0f} allocated GPU-hours of {day_pg.new_series:,} new pods (the
same cluster, another seed), written window by window through the ingester's own writer
(`LedgerStore.replace_window`) and rolled up by its own roll-up (`LedgerStore.roll_up_day`):
{day_pg.hourly_rows:,} hourly rows became {day_pg.rolled_rows:,}
({day_pg.hourly_rows / day_pg.gpu_hours:.2f} and {day_pg.rolled_rows / day_pg.gpu_hours:.2f}
rows per allocated GPU-hour). PostgreSQL: a rolled row {day_pg.rolled_bytes[0] / max(1, day_pg.rolled_rows):.0f} B, a series
{day_pg.rolled_bytes[1] / max(1, day_pg.series):.0f} B; SQLite {day_sqlite.rolled_bytes[0] / max(1, day_sqlite.rolled_rows):.0f} B and
{day_sqlite.rolled_bytes[1] / max(1, day_sqlite.series):.0f} B. Measured after `VACUUM FULL`
on PostgreSQL: in a running store autovacuum makes the rolled-up hours' space reusable, so
the table stays at the rolled-up rows plus the hourly rows of the days not yet rolled up
(about {2 * day_pg.hourly_bytes[0] / 1e6:.0f} MB for two days of this cluster, a constant, not
a share of each month).

Watch delay: a stand-in watch handler in the controller's process (an event every 2 ms, each
decoded like a pod) records how late each event is handled while the controller's ledger
process (quota/ledger/ingest.py LedgerProcess, niced) ingests the hour; without ingestion its
worst is {idle_worst:.1f} ms (p99 {idle_p99:.1f}); with the same ingestion in a thread of the
controller's process instead (PostgreSQL) {thread_worst:.1f} ms (p99 {thread_p99:.1f}), which
is why it runs in a process of its own. CPU is measured in the benchmark's process (the same
code as the child runs, without its interpreter start). Bytes: `pg_total_relation_size` of usage_windows,
usage_series and usage_devices (indexes included), SQLite's `dbstat` after VACUUM; device UUIDs
of a real GPU's shape ("GPU-" and a UUID).

Instead of the ledger, users keep Prometheus data for the month: this hour's blocks take
{prom_per_sample:.2f} bytes per sample, {prom_per_sample * samples / gpu_hours:,.0f} B per
allocated GPU-hour for the raw counters (recording rules of hourly increases per pod would be
{prom_per_sample * 2 * series / gpu_hours:,.1f} B but still need the raw data for the hour and
a month of retention), and nothing of it survives the retention.
"""
    print(markdown)
    if not args.no_write:
        write_section("ledger", markdown)
    print(summary)
    return 0


def _prom_version() -> str:
    import subprocess

    out = subprocess.run([promserver.binary(), "--version"], capture_output=True, text=True)
    first = (out.stdout or out.stderr).splitlines()[0] if (out.stdout or out.stderr) else ""
    return first.split()[2] if len(first.split()) > 2 else "?"


if __name__ == "__main__":
    sys.exit(main())
