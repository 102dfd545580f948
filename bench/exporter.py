"""Benchmark: gpu-exporter against nvitop-exporter on the same simulated node.

Both exporters run as their own processes against the same NVML stand-in state, one after
the other, with the same collection interval. For each node shape and exporter:

* CPU seconds per 1,000 collections: utime+stime from /proc/<pid>/stat over a window with no
  scrapes, divided by the collections done in it (ours counts them itself; nvitop-exporter
  does not, so its count is window / interval, an upper bound when it keeps up).
* scrape latency p50/p99 under concurrent scrapers: threads doing HTTP GET /metrics, a new
  connection per request (no keep-alive), a fixed number of requests.
* resident memory: VmRSS at the end and the peak VmHWM, from /proc/<pid>/status.

Shapes: ``h100x8`` (8 GPUs) and ``a100-mig`` (4 GPUs x 7 MIG instances, 28 pods attributed
through the kubelet pod-resources stand-in). Run:

    .venv/bin/python -m bench.exporter            # writes docs/benchmarks.md, section exporter
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.results import write_section
from sim.harness import stop_process
from sim.kubelet.podresources import PodResourcesServer, one_pod_each
from sim.nvml.control import SimNode

CLK_TCK = os.sysconf("SC_CLK_TCK")
VENV_BIN = Path(sys.executable).parent
MIG_RESOURCE = "nvidia.com/mig-1g.5gb"
# The exporter's own count of finished collections (a counter in its metric table).
COLLECTIONS_RE = re.compile(
    rb"^gpuquota_exporter_collections_total(?:\{[^}]*\})? ([0-9.e+]+)$", re.M
)


@dataclass
class Result:
    shape: str
    exporter: str
    devices: int
    pods: int
    collections: float
    counted: bool  # collections counted by the exporter (True) or window / interval
    cpu_seconds: float
    p50_ms: float
    p99_ms: float
    scrape_bytes: int
    scrape_cpu_ms: float  # the exporter's CPU per scrape during the scrape phase
    rss_mb: float
    hwm_mb: float
    errors: int

    @property
    def cpu_per_1000(self) -> float:
        return self.cpu_seconds / self.collections * 1000 if self.collections else float("nan")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # fields[0] is the state (field 3); utime and stime are fields 14 and 15
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def memory_mb(pid: int) -> tuple[float, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    values = dict(re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", status, re.M))
    return int(values["VmRSS"]) / 1024, int(values["VmHWM"]) / 1024


def fetch(url: str, timeout: float = 5.0) -> bytes:
    request = urllib.request.Request(url, headers={"Connection": "close"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return bytes(response.read())


def scrape_once(port: int) -> tuple[float, int]:
    """One GET /metrics on a fresh connection; (seconds, body bytes)."""
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
        chunks = []
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    elapsed = time.perf_counter() - started
    data = b"".join(chunks)
    if not data.startswith(b"HTTP/1.") or b" 200 " not in data.split(b"\r\n", 1)[0]:
        raise RuntimeError(f"bad scrape answer: {data[:80]!r}")
    return elapsed, len(data)


def scrape_latencies(port: int, concurrency: int, requests: int) -> tuple[list[float], int, int]:
    per_thread = requests // concurrency
    latencies: list[float] = []
    errors = 0
    size = 0
    lock = threading.Lock()
    start = threading.Barrier(concurrency)

    def worker() -> None:
        nonlocal errors, size
        start.wait()
        mine: list[float] = []
        failed = 0
        for _ in range(per_thread):
            try:
                elapsed, size_now = scrape_once(port)
            except (OSError, RuntimeError):
                failed += 1
                continue
            mine.append(elapsed)
        with lock:
            latencies.extend(mine)
            errors += failed
            size = max(size, size_now) if mine else size

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, errors, size


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def pods_attributed(port: int) -> int:
    """Distinct pods in the exporter's pod attribution join metric."""
    body = fetch(f"http://127.0.0.1:{port}/metrics")
    return len(set(re.findall(rb'^gpu_pod_info\{[^}]*pod="([^"]*)"', body, re.M)))


def collections_counted(port: int) -> float | None:
    match = COLLECTIONS_RE.search(fetch(f"http://127.0.0.1:{port}/metrics"))
    return float(match.group(1)) if match else None


def wait_ready(
    proc: subprocess.Popen[bytes], port: int, expect: bytes, timeout: float = 60
) -> None:
    deadline = time.monotonic() + timeout
    last = b""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exporter exited with {proc.returncode}")
        try:
            last = fetch(f"http://127.0.0.1:{port}/metrics", timeout=2)
            if expect in last:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"exporter on port {port} not ready (no {expect!r} in its metrics)")


def run_one(
    shape: str,
    name: str,
    node: SimNode,
    argv: list[str],
    port: int,
    expect: bytes,
    args: argparse.Namespace,
    pods: int,
    devices: int,
    log_dir: Path,
) -> Result:
    env = {**os.environ, **node.env()}
    log = (log_dir / f"{shape}-{name}.log").open("wb")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_ready(proc, port, expect)
        time.sleep(args.warmup)
        counted_before = collections_counted(port) if name == "gpu-exporter" else None
        cpu_before, t_before = cpu_seconds(proc.pid), time.monotonic()
        time.sleep(args.window)
        cpu_after, t_after = cpu_seconds(proc.pid), time.monotonic()
        counted_after = collections_counted(port) if counted_before is not None else None
        if counted_before is not None and counted_after is not None:
            collections, counted = counted_after - counted_before, True
        else:
            collections, counted = (t_after - t_before) / args.interval, False
        if name == "gpu-exporter":
            pods = pods_attributed(port)
        cpu_scrapes = cpu_seconds(proc.pid)
        latencies, errors, size = scrape_latencies(port, args.concurrency, args.requests)
        cpu_scrapes = cpu_seconds(proc.pid) - cpu_scrapes
        rss, hwm = memory_mb(proc.pid)
    finally:
        stop_process(proc)
        log.close()
    if not latencies:
        raise RuntimeError(f"{name} on {shape}: every scrape failed (see {log.name})")
    return Result(
        shape=shape,
        exporter=name,
        devices=devices,
        pods=pods,
        collections=collections,
        counted=counted,
        cpu_seconds=cpu_after - cpu_before,
        p50_ms=statistics.median(latencies) * 1000,
        p99_ms=percentile(latencies, 99) * 1000,
        scrape_bytes=size,
        scrape_cpu_ms=cpu_scrapes / max(1, len(latencies)) * 1000,
        rss_mb=rss,
        hwm_mb=hwm,
        errors=errors,
    )


def bench_shape(shape: str, args: argparse.Namespace, work: Path) -> list[Result]:
    node = SimNode.create(work / f"{shape}.state", shape)
    mig_uuids = [u for i in range(node.gpu_count) for u in node.mig_uuids(i)]
    devices = node.gpu_count + len(mig_uuids)
    socket_path = work / f"{shape}.sock"
    kubelet = PodResourcesServer(socket_path, one_pod_each(mig_uuids, MIG_RESOURCE, "bench"))
    kubelet.start()
    results = []
    try:
        port = free_port()
        ours = [
            str(VENV_BIN / "gpu-exporter"),
            f"--listen=127.0.0.1:{port}",
            f"--interval={args.interval}",
            f"--pod-resources-socket={socket_path}",
        ]
        expect = b'pod="pod-0"' if mig_uuids else b"gpu_"
        results.append(
            run_one(
                shape, "gpu-exporter", node, ours, port, expect, args, len(mig_uuids), devices, work
            )
        )
        port = free_port()
        nvitop = [
            str(VENV_BIN / "nvitop-exporter"),
            "--bind-address=127.0.0.1",
            f"--port={port}",
            f"--interval={args.interval}",
        ]
        results.append(
            run_one(
                shape,
                "nvitop-exporter",
                node,
                nvitop,
                port,
                b"gpu_utilization_Percentage{",
                args,
                0,
                devices,
                work,
            )
        )
    finally:
        kubelet.stop()
    return results


def table(results: list[Result], args: argparse.Namespace) -> str:
    lines = [
        "| node | exporter | devices | pods attributed | CPU s / 1,000 collections "
        "| scrape p50 | scrape p99 | CPU / scrape | VmRSS | VmHWM | scrape size |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.shape} | {r.exporter} | {r.devices} | {r.pods} | {r.cpu_per_1000:.2f}"
            f"{'' if r.counted else ' *'} | {r.p50_ms:.2f} ms | {r.p99_ms:.2f} ms "
            f"| {r.scrape_cpu_ms:.2f} ms "
            f"| {r.rss_mb:.1f} MB | {r.hwm_mb:.1f} MB | {r.scrape_bytes / 1024:.1f} KiB |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="h100x8,a100-mig")
    parser.add_argument("--interval", type=float, default=0.25, help="collection interval, s")
    parser.add_argument("--window", type=float, default=20.0, help="CPU window, s")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--no-write", action="store_true", help="print, leave docs alone")
    args = parser.parse_args(argv)
    if shutil.which("nvitop-exporter", path=str(VENV_BIN)) is None:
        raise SystemExit("nvitop-exporter is not installed in this venv (pip install -e '.[dev]')")
    work = Path(tempfile.mkdtemp(prefix="bx-", dir="/tmp"))
    results: list[Result] = []
    try:
        for shape in args.shapes.split(","):
            results.extend(bench_shape(shape, args, work))
            for r in results[-2:]:
                print(
                    f"{r.shape:9} {r.exporter:16} cpu/1000={r.cpu_per_1000:.2f}s "
                    f"p50={r.p50_ms:.2f}ms p99={r.p99_ms:.2f}ms cpu/scrape={r.scrape_cpu_ms:.2f}ms "
                    f"rss={r.rss_mb:.1f}MB "
                    f"hwm={r.hwm_mb:.1f}MB errors={r.errors}",
                    flush=True,
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    body = table(results, args)
    load = os.getloadavg()
    ours = {r.shape: r for r in results if r.exporter == "gpu-exporter"}
    theirs = {r.shape: r for r in results if r.exporter == "nvitop-exporter"}
    first = next(iter(ours))
    ratio = ours[first].cpu_per_1000 / theirs[first].cpu_per_1000
    verdicts = [
        f"CPU at most half of nvitop-exporter's on {first}: ratio {ratio:.2f} "
        f"({'met' if ratio <= 0.5 else 'missed'})",
        f"scrape p99 < 5 ms on {first}: {ours[first].p99_ms:.1f} ms "
        f"({'met' if ours[first].p99_ms < 5 else 'missed'})",
        f"resident memory < 60 MB: peak {max(r.hwm_mb for r in ours.values()):.1f} MB "
        f"({'met' if all(r.hwm_mb < 60 for r in ours.values()) else 'missed'})",
    ]
    text = "\n".join(
        [
            f"gpu-exporter against nvitop-exporter {nvitop_version()} on the same NVML "
            f"stand-in, one after the other, both collecting every {args.interval} s "
            "(nvitop-exporter's minimum).",
            "",
            f"- CPU: utime+stime of the exporter process over a {args.window:.0f} s window "
            "without scrapes, scaled to 1,000 collections. gpu-exporter counts its "
            "collections (gpuquota_exporter_collections_total); nvitop-exporter does not, so "
            "its count (*) is window / interval, which flatters it if it falls behind.",
            f"- Scrapes: {args.requests} GET /metrics by {args.concurrency} concurrent threads, "
            "a new connection each; CPU / scrape is the exporter's CPU during them per scrape.",
            "- Memory: VmRSS after the run and its peak VmHWM, from /proc/<pid>/status.",
            f"- Machine: {os.cpu_count()} CPUs, load average {load[0]:.1f} / {load[1]:.1f} / "
            f"{load[2]:.1f} at the end (latency percentiles move with the load; CPU per "
            "collection and per scrape do not).",
            "- Reproduce: `make bench` or `.venv/bin/python -m bench.exporter` (about 3 minutes).",
            "",
            body,
            "",
            "Targets: " + "; ".join(verdicts) + ".",
        ]
    )
    if not args.no_write:
        write_section("exporter", text)
    print(body)
    print(f"cpu_ratio={ratio:.3f} p99_ms={ours[first].p99_ms:.2f}")
    return 0


def nvitop_version() -> str:
    try:
        from importlib.metadata import version

        return version("nvitop-exporter")
    except Exception:
        return "(version unknown)"


if __name__ == "__main__":
    raise SystemExit(main())
