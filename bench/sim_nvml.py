"""Benchmark of the NVML stand-in: XID delivery latency across processes, the CPU an idle
event waiter burns, and the cost of one NVML reading through pynvml.

    .venv/bin/python -m bench.sim_nvml [--events 300] [--no-write]

Writes the "sim_nvml" section of docs/benchmarks.md. No other NVML stand-in loads under
an unchanged pynvml, so the comparison row is the obvious alternative design for event
delivery, a waiter polling the shared state every millisecond, measured by the same harness.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.results import write_section
from gpuquota.sim.nvml import build
from gpuquota.sim.nvml.control import SimNode, library_path

# The waiter: registers XID events on every GPU, reports when it is ready, then prints the
# monotonic receive time of each event (CLOCK_MONOTONIC is shared by all processes).
WAITER = """
import sys, time, resource, pynvml as n
mode, count, idle = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
n.nvmlInit()
es = n.nvmlEventSetCreate()
for i in range(n.nvmlDeviceGetCount()):
    n.nvmlDeviceRegisterEvents(n.nvmlDeviceGetHandleByIndex(i), n.nvmlEventTypeXidCriticalError, es)

def wait(deadline):
    while True:
        try:
            return n.nvmlEventSetWait_v2(es, 1000 if mode == "block" else 0)
        except n.NVMLError_Timeout:
            if time.monotonic() > deadline:
                return None
            if mode == "poll":
                time.sleep(0.001)

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

c0 = cpu()
wait(time.monotonic() + idle)
print("idle", (cpu() - c0) / idle, flush=True)
print("ready", flush=True)
for _ in range(count):
    e = wait(time.monotonic() + 30)
    print(e.eventData, time.monotonic_ns(), flush=True)
"""


def measure_events(node: SimNode, mode: str, count: int, idle: float) -> tuple[list[float], float]:
    """Latencies (microseconds) of `count` injected XIDs, and idle CPU (cores) of the waiter."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WAITER, mode, str(count), str(idle)],
        env={**os.environ, **node.env()},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    try:
        idle_cpu = float(proc.stdout.readline().split()[1])
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("waiter did not start")
        latencies = []
        for k in range(count):
            sent = time.monotonic_ns()
            node.inject_xid(k % node.gpu_count, 1000 + k)
            xid, received = proc.stdout.readline().split()
            if int(xid) != 1000 + k:
                raise RuntimeError(f"expected XID {1000 + k}, got {xid}")
            latencies.append((int(received) - sent) / 1000)
            time.sleep(0.002)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    return latencies, idle_cpu


def measure_reading(node: SimNode, rounds: int) -> float:
    """Microseconds per pynvml call, over the readings an exporter makes of one GPU."""
    node.preload()
    import pynvml

    pynvml.nvmlInit()
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(node.gpu_count)]
        calls: list[Callable[[Any], object]] = [
            lambda h: pynvml.nvmlDeviceGetUtilizationRates(h),
            lambda h: pynvml.nvmlDeviceGetMemoryInfo(h),
            lambda h: pynvml.nvmlDeviceGetTemperature(h, 0),
            lambda h: pynvml.nvmlDeviceGetPowerUsage(h),
            lambda h: pynvml.nvmlDeviceGetTotalEnergyConsumption(h),
            lambda h: pynvml.nvmlDeviceGetClockInfo(h, 1),
            lambda h: pynvml.nvmlDeviceGetTotalEccErrors(h, 1, 0),
            lambda h: pynvml.nvmlDeviceGetNvLinkErrorCounter(h, 0, 0),
            lambda h: pynvml.nvmlDeviceGetFieldValues(h, [82]),
            lambda h: pynvml.nvmlDeviceGetComputeRunningProcesses(h),
        ]
        start = time.perf_counter()
        for _ in range(rounds):
            for h in handles:
                for call in calls:
                    call(h)
        elapsed = time.perf_counter() - start
    finally:
        pynvml.nvmlShutdown()
    return elapsed / (rounds * len(handles) * len(calls)) * 1e6


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sim_nvml", description=__doc__)
    parser.add_argument("--events", type=int, default=300)
    parser.add_argument("--idle", type=float, default=2.0, help="idle seconds to measure CPU")
    parser.add_argument("--no-write", action="store_true", help="print, do not write the doc")
    args = parser.parse_args(argv)
    lib = library_path()
    if not lib.is_file():
        build.build(lib)
    with tempfile.TemporaryDirectory(prefix="gqsim-bench-", dir="/tmp") as tmp:
        node = SimNode.create(Path(tmp) / "node.state", "h100x8")
        rows = []
        for mode, label in (("block", "stand-in: futex wake (nvmlEventSetWait_v2, 1 s timeout)"),
                            ("poll", "alternative: poll every 1 ms (nvmlEventSetWait_v2, 0 ms)")):  # fmt: skip
            lat, idle_cpu = measure_events(node, mode, args.events, args.idle)
            rows.append(
                f"| {label} | {statistics.median(lat):.0f} | {_pct(lat, 0.99):.0f} | "
                f"{max(lat):.0f} | {idle_cpu * 100:.2f} % |"
            )
        per_call = measure_reading(node, rounds=200)
        node.close()
    text = f"""
NVML stand-in (`sim/nvml/`), h100x8 preset, {args.events} XIDs injected from the parent
process into a waiter in another process, 2 ms apart. Latency: injection to return from
`nvmlEventSetWait_v2` in the waiter (CLOCK_MONOTONIC, shared). Idle CPU: the waiter's CPU
time over {args.idle:.0f} s with no events, as a share of one core.

| event delivery | p50 us | p99 us | max us | idle CPU |
|---|---|---|---|---|
{chr(10).join(rows)}

One NVML reading through pynvml (10 exporter readings x 8 GPUs x 200 rounds, in-process):
**{per_call:.1f} us per call**, most of it pynvml/ctypes overhead.

Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}.
Reproduce: `.venv/bin/python -m bench.sim_nvml`.
"""
    print(text)
    if not args.no_write:
        write_section("sim_nvml", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
