"""Benchmark of the fleet history's fetch of one window: one answer against pieces.

A stand-in Prometheus (an HTTP server in a process of its own, answering the two kinds of
query the fetch asks: the count, and range selectors with or without a shard of UUIDs, with
Prometheus 2's inclusive ranges) serves an hour and two minutes of the node agents' health
series for ``--gpus`` GPUs scraped every 15 s (per GPU: gpu_info, three health states,
since, four device states, two ECC aggregates, two remapped-rows causes, remap pending and
failure; every 50th GPU one XID counter, every 40th a health reason). Each way of fetching
runs in a child process of its own (so its peak RSS is its own):

- ``one``: the whole window in one answer (``max_samples`` above the total: the fetch as it
  was before quota/prompieces.py);
- ``pieces``: the default, about 5,000 samples per answer.

Per way: wall and CPU time of ``fleet.source.fetch``; the longest decode of one answer
(from its last byte read to its series decoded, promhttp.matrix_query); the longest stall of
a thread that wakes every millisecond meanwhile (what the controller's watch threads would
see); the peak RSS over the child's RSS before the fetch; and, in a second run of the child
under tracemalloc, the peak of Python's allocations.

    .venv/bin/python -m bench.fleet_fetch [--gpus 1000] [--no-write]

Writes the ``fleet_fetch`` section of docs/benchmarks.md; the last line printed is
``one_peak_mb=<n> pieces_peak_mb=<n> one_decode_ms=<n> pieces_decode_ms=<n>``.
"""

from __future__ import annotations

import argparse
import bisect
import gc
import json
import multiprocessing
import os
import platform
import re
import resource
import subprocess
import sys
import threading
import time
import tracemalloc
import urllib.parse
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from bench.results import write_section
from gpuquota.quota import promhttp, prompieces
from gpuquota.quota.fleet import source
from gpuquota.sim.harness import free_port, wait_for

STEP = 15
WINDOW = 3600
MAX_GAP = 60
START = 1_800_000_000  # the window [START, START + WINDOW)
GPU_NAMESPACE = uuid.UUID("0f1c5e2a-7d3b-4c8e-9a61-2b4d6f8e0a13")
SELECTOR = re.compile(
    r'\{__name__=~"(?P<names>[^"]*)"(?:,uuid(?P<op>=~|!~)"(?P<re>.*)")?\}\[(?P<len>\d+)s\]'
)
COUNT = re.compile(r"sum\(count_over_time\((?P<sel>.*)\)\)")


def gpu_series(gpu: int) -> Iterator[tuple[dict[str, str], list[str]]]:
    """One GPU's series over the window and a minute either side: labels, and each sample
    already written as Prometheus writes it (``[t,"v"]``, t to the millisecond)."""
    node = f"node-{gpu // 8:03d}"
    base = {
        "gpu": str(gpu % 8),
        "uuid": f"GPU-{uuid.uuid5(GPU_NAMESPACE, f'bench/{gpu}')}",
        "node": node,
        "instance": f"{node}:9400",
        "job": "gpu-exporter",
    }
    offset = (gpu // 8) * 0.731 % STEP  # each node's agent is scraped at its own moment
    times = [START - MAX_GAP - 14 + offset + STEP * k for k in range((WINDOW + 2 * MAX_GAP) // STEP + 2)]  # fmt: skip

    def constant(labels: dict[str, str], value: str) -> tuple[dict[str, str], list[str]]:
        return {**base, **labels}, [f'[{t:.3f},"{value}"]' for t in times]

    info = {
        "__name__": "gpu_info",
        "serial": f"{1650000000000 + gpu}",
        "model": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": f"00000000:{0x18 + gpu % 8:02X}:00.0",
        "driver_version": "550.54.15",
        "vbios_version": "96.00.89.00.01",
    }
    yield constant(info, "1")
    for state in ("healthy", "degraded", "unhealthy"):
        yield constant({"__name__": "gpu_health_state", "state": state}, "1" if state == "healthy" else "0")  # fmt: skip
    yield constant({"__name__": "gpu_health_since_timestamp_seconds"}, "1799000000")
    for state in ("ok", "lost", "reset_required", "error"):
        yield constant({"__name__": "gpu_device_state", "state": state}, "1" if state == "ok" else "0")  # fmt: skip
    for kind in ("corrected", "uncorrected"):
        yield constant({"__name__": "gpu_ecc_aggregate_errors_total", "type": kind}, "0")
    for cause in ("correctable", "uncorrectable"):
        yield constant({"__name__": "gpu_remapped_rows_total", "cause": cause}, "0")
    yield constant({"__name__": "gpu_row_remap_pending"}, "0")
    yield constant({"__name__": "gpu_row_remap_failure"}, "0")
    if gpu % 50 == 0:
        yield constant({"__name__": "gpu_xid_errors_total", "xid": "13"}, "2")
    if gpu % 40 == 0:
        reason = {"__name__": "gpu_health_reason", "reason": "ecc_sbe_rate", "action": "none"}
        yield constant(reason, "1")


class Served:
    """Every series of the fleet, by UUID, with its samples' times."""

    def __init__(self, gpus: int) -> None:
        self.by_uuid: dict[str, list[tuple[str, str, list[float], list[str]]]] = {}
        for gpu in range(gpus):
            for labels, samples in gpu_series(gpu):
                head = json.dumps(labels, separators=(",", ":"))
                times = [float(s[1 : s.index(",")]) for s in samples]
                series = (labels["__name__"], head, times, samples)
                self.by_uuid.setdefault(labels["uuid"], []).append(series)
        self.shards: dict[tuple[str, str], list[str]] = {}

    def uuids(self, op: str | None, pattern: str | None) -> list[str]:
        if op is None or pattern is None:
            return list(self.by_uuid)
        key = (op, pattern)
        if key not in self.shards:
            hit = [u for u in self.by_uuid if (re.fullmatch(pattern, u) is not None) == (op == "=~")]  # fmt: skip
            self.shards[key] = hit
        return self.shards[key]

    def answer(self, promql: str, at: float) -> bytes:
        counted = COUNT.fullmatch(promql)
        match = SELECTOR.fullmatch(counted["sel"] if counted else promql)
        if match is None:
            raise ValueError(promql)
        names = set(match["names"].split("|"))
        lo = at - int(match["len"])
        parts, total = [], 0
        for u in self.uuids(match["op"], match["re"]):
            for name, head, times, samples in self.by_uuid[u]:
                if name not in names:
                    continue
                a, b = bisect.bisect_left(times, lo), bisect.bisect_right(times, at)
                if a < b:
                    total += b - a
                    if not counted:
                        parts.append(f'{{"metric":{head},"values":[{",".join(samples[a:b])}]}}')
        if counted:
            result = f'[{{"metric":{{}},"value":[{at},"{total}"]}}]' if total else "[]"
            kind = "vector"
        else:
            result, kind = f"[{','.join(parts)}]", "matrix"
        body = f'{{"status":"success","data":{{"resultType":"{kind}","result":{result}}}}}'
        return body.encode()


def serve(gpus: int, port: int) -> None:
    served = Served(gpus)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
            if "query" not in query:
                body = b"ok"
            else:
                body = served.answer(query["query"][0], float(query["time"][0]))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


def rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child(url: str, max_samples: int, trace: bool) -> dict[str, float]:
    """One fetch of the window, measured (runs in a process of its own)."""
    decodes: list[float] = []
    received: list[float] = []
    get_body, matrix_query = promhttp.get_body, promhttp.matrix_query

    def timed_body(*args: Any, **kwargs: Any) -> bytes:
        body = get_body(*args, **kwargs)
        received.append(time.perf_counter())
        return body

    def timed_query(*args: Any, **kwargs: Any) -> list[promhttp.MatrixSeries]:
        result = matrix_query(*args, **kwargs)
        decodes.append(time.perf_counter() - received[-1])
        return result

    promhttp.get_body = timed_body
    promhttp.matrix_query = timed_query
    stalls = [0.0]
    done = threading.Event()
    collections: list[float] = []
    began = [0.0]

    def collected(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            collections.append(time.perf_counter() - began[0])

    if trace:  # not in the timed run: a callback lets other threads in mid-collection
        gc.callbacks.append(collected)

    def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            stalls[0] = max(stalls[0], now - last)
            last = now

    before = rss_mb()
    if trace:
        tracemalloc.start()
    thread = threading.Thread(target=ticker, daemon=True)
    thread.start()
    wall, cpu = time.perf_counter(), time.process_time()
    readings, xids = source.fetch(url, START, WINDOW, MAX_GAP, 600.0, max_samples=max_samples)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    done.set()
    thread.join()
    out = {
        "wall_s": wall,
        "cpu_s": cpu,
        "answers": len(decodes),
        "decode_max_ms": 1000 * max(decodes),
        "decode_sum_s": sum(decodes),
        "stall_max_ms": 1000 * stalls[0],
        "readings": len(readings),
        "xids": len(xids),
        "rss_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before,
    }
    if trace:
        current, peak = tracemalloc.get_traced_memory()
        out |= {"traced_peak_mb": peak / 2**20, "traced_kept_mb": current / 2**20}
        out |= {"gc_max_ms": 1000 * max(collections, default=0.0)}
    return out


def run_child(url: str, max_samples: int, trace: bool) -> dict[str, float]:
    args = [sys.executable, "-m", "bench.fleet_fetch", "--child", url, str(max_samples)]
    done = subprocess.run(args + (["--trace"] if trace else []), capture_output=True, text=True, check=True)  # fmt: skip
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--child", nargs=2, metavar=("URL", "MAX_SAMPLES"), help=argparse.SUPPRESS)  # fmt: skip
    parser.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.trace)))
        return
    port = free_port()
    server = multiprocessing.Process(target=serve, args=(args.gpus, port), daemon=True)
    server.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _up(url), timeout=600, what="the stand-in Prometheus")
        lo, hi = START - MAX_GAP, START + WINDOW + MAX_GAP
        total = prompieces.count_samples(url, source.METRICS, lo, hi, 600)
        load = os.getloadavg()[0]
        ways = {"one": int(total) + 1, "pieces": prompieces.MAX_SAMPLES_PER_QUERY}
        got = {}
        for name, max_samples in ways.items():
            got[name] = run_child(url, max_samples, trace=False)
            traced = run_child(url, max_samples, trace=True)
            got[name] |= {k: v for k, v in traced.items() if k.startswith(("traced", "gc"))}
            print(name, json.dumps({k: round(v, 3) for k, v in got[name].items()}))
        load_after = os.getloadavg()[0]
    finally:
        server.terminate()
        server.join()
    one, pieces = got["one"], got["pieces"]
    table = [
        "| | one answer | pieces of 5,000 samples (the default) |",
        "|---|---:|---:|",
        f"| answers | {one['answers']:.0f} | {pieces['answers']:.0f} |",
        f"| longest decode of one answer | **{one['decode_max_ms']:.0f} ms** | **{pieces['decode_max_ms']:.1f} ms** |",
        f"| longest stall of a 1 ms ticker thread | {one['stall_max_ms']:.0f} ms | {pieces['stall_max_ms']:.0f} ms |",
        f"| peak RSS over the RSS before the fetch | **{one['rss_peak_mb']:.0f} MB** | **{pieces['rss_peak_mb']:.0f} MB** |",
        f"| peak of Python's allocations (tracemalloc) | {one['traced_peak_mb']:.0f} MB | {pieces['traced_peak_mb']:.0f} MB |",
        f"| of which kept: the readings | {one['traced_kept_mb']:.0f} MB | {pieces['traced_kept_mb']:.0f} MB |",
        f"| longest garbage collection (tracemalloc run) | {one['gc_max_ms']:.0f} ms | {pieces['gc_max_ms']:.0f} ms |",
        f"| wall / CPU time of the fetch | {one['wall_s']:.1f} / {one['cpu_s']:.1f} s | {pieces['wall_s']:.1f} / {pieces['cpu_s']:.1f} s |",
    ]
    text = "\n".join(
        [
            f"### Fleet history: fetching one window of a {args.gpus:,}-GPU cluster",
            "",
            f"Command: `.venv/bin/python -m bench.fleet_fetch --gpus {args.gpus}` ({platform.machine()}, "
            f"{os.cpu_count()} cores, Python {platform.python_version()}; load average {load:.1f} before, "
            f"{load_after:.1f} after).",
            "",
            f"Data: {args.gpus:,} GPUs' health series ({int(total):,} samples in the window and a "
            f"minute either side; {one['readings']:,.0f} readings, {one['xids']:.0f} XID series), "
            "served by a stand-in Prometheus (bench/fleet_fetch.py: an HTTP server in another "
            "process on the same machine, answering as Prometheus 2 does). Each way runs in a "
            "child process of its own; tracemalloc in a second run.",
            "",
            *table,
        ]
    )
    if not args.no_write:
        write_section("fleet_fetch", text)
    print(
        f"one_peak_mb={one['rss_peak_mb']:.0f} pieces_peak_mb={pieces['rss_peak_mb']:.0f} "
        f"one_decode_ms={one['decode_max_ms']:.0f} pieces_decode_ms={pieces['decode_max_ms']:.1f}"
    )


def _up(url: str) -> bool:
    try:
        promhttp.get_body(f"{url}/-/ready", url, 5)
    except promhttp.PrometheusError:
        return False
    return True


if __name__ == "__main__":
    main()
