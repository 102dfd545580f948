"""Benchmark: scrape latency of gpu-exporter's HTTP endpoint, measured with wrk (C).

gpu-exporter runs as its own process on the NVML stand-in (``h100x8``: 8 GPUs), collecting
every ``--interval`` while Debian's ``wrk`` keeps ``--connections`` keep-alive connections
busy with GET /metrics for ``--duration`` seconds (one wrk thread, so the exporter keeps the
other core of a 2-core machine). It runs twice: with no other client, then while this process
holds ``--held`` connections open, half of them idle and half with half a request header
sent, reopening every one the server closes (as a slowloris client would), so they are held
for the whole run. ``--source REV`` runs the exporter code of a git revision instead (e.g.
``main``, the old thread-pool server) for comparison.

    .venv/bin/python -m bench.scrape                      # this tree; writes docs/benchmarks.md
    .venv/bin/python -m bench.scrape --compare main     # and the old server beside it
    .venv/bin/python -m bench.scrape --source main --no-write

Without wrk it says the command that installs it and exits 1.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import selectors
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bench.results import write_section
from gpuquota.sim.harness import free_port, stop_process
from gpuquota.sim.nvml.control import SimNode

ROOT = Path(__file__).resolve().parents[1]
WRK_INSTALL = "apt-get install -y wrk"
UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


@dataclass
class Run:
    label: str
    held: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    requests_per_s: float
    errors: str
    reopened: int  # held connections the server closed during the run (deadlines at work)
    command: str


def wait_ready(port: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gpu-exporter exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
                conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n")
                if conn.recv(64).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("gpu-exporter did not answer /metrics")


class Holder:
    """Keeps ``count`` connections open: even ones idle, odd ones with half a header sent.

    They are opened over ``spread`` seconds (about the server's header deadline), so the ones
    the server closes at its deadline come back spread out too, as from a slowloris client
    that keeps its connections up, not in one synchronised burst."""

    def __init__(self, port: int, count: int, spread: float = 10.0) -> None:
        self.port, self.count, self.spread = port, count, spread
        self.reopened = 0
        self._stop = threading.Event()
        self._selector = selectors.DefaultSelector()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _open(self, i: int) -> None:
        try:
            conn = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            if i % 2:
                conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: slow\r\nX-Partial: ")
            conn.setblocking(False)
            self._selector.register(conn, selectors.EVENT_READ, i)
        except OSError:
            pass

    def start(self) -> None:
        """Opens them all (taking ``spread`` seconds), then keeps them open in a thread."""
        began = time.monotonic()
        for i in range(self.count):
            self._open(i)
            time.sleep(max(0.0, began + self.spread * (i + 1) / self.count - time.monotonic()))
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for key, _events in self._selector.select(timeout=0.2):
                conn = key.fileobj
                assert isinstance(conn, socket.socket)
                try:
                    closed = conn.recv(1) == b""
                except BlockingIOError:
                    closed = False
                except OSError:
                    closed = True
                if closed:  # the server gave up on it: open another in its place
                    self._selector.unregister(conn)
                    conn.close()
                    self.reopened += 1
                    self._open(key.data)

    def open_now(self) -> int:
        return len(self._selector.get_map())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        for key in list(self._selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        self._selector.close()


def parse_wrk(output: str) -> tuple[dict[int, float], float, str]:
    """({50: ms, 90: ms, 99: ms}, requests/s, error summary) from ``wrk --latency``."""
    percentiles = {
        int(q): float(v) * UNITS[unit]
        for q, v, unit in re.findall(r"^\s+(\d+)%\s+([\d.]+)(us|ms|s)\s*$", output, re.M)
    }
    rate = re.search(r"^Requests/sec:\s+([\d.]+)", output, re.M)
    errors = []
    if m := re.search(r"Socket errors: (.*)", output):
        errors.append(m.group(1).strip())
    if m := re.search(r"Non-2xx or 3xx responses: (\d+)", output):
        errors.append(f"{m.group(1)} non-2xx")
    if not percentiles or rate is None:
        raise RuntimeError(f"cannot read wrk's output:\n{output}")
    done = re.search(r"^\s*(\d+) requests in", output, re.M)
    if done is not None and int(done.group(1)) == 0:
        errors.insert(0, "no request answered")
        percentiles = dict.fromkeys(percentiles, float("inf"))
    return percentiles, float(rate.group(1)), "; ".join(errors) or "none"


def source_tree(rev: str, work: Path) -> Path:
    """The exporter's and gpuquota's code as of ``rev`` (generated gRPC stubs from this tree)."""
    linked = subprocess.run(["git", "-C", str(ROOT), "ls-tree", rev, "gpuquota/exporter"],
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    if not linked:
        # before the one gpuquota.* package its modules import each other by other names, and
        # this tree's editable install would answer for gpuquota.*: it would bench this tree
        raise SystemExit(
            f"python -m bench.scrape: error: {rev} predates the gpuquota.* package; run that "
            "revision's own bench.scrape in a checkout of it"
        )
    tree = work / f"src-{re.sub(r'[^A-Za-z0-9]', '_', rev)}"
    tree.mkdir()
    for package in ("exporter", "gpuquota"):
        listed = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "-r", "--name-only", rev,
                                 package], capture_output=True, text=True, check=True)  # fmt: skip
        for name in listed.stdout.split():
            target = tree / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{name}"],
                                   capture_output=True, check=True)  # fmt: skip
            target.write_bytes(shown.stdout)
    for stub in (ROOT / "exporter" / "kubeletapi").glob("*_pb2*.py*"):
        shutil.copy(stub, tree / "exporter" / "kubeletapi" / stub.name)
    return tree


def bench(args: argparse.Namespace, wrk: str, work: Path, source: str | None) -> list[Run]:
    work.mkdir(exist_ok=True)
    node = SimNode.create(work / "node.state", args.shape)
    env = {**os.environ, **node.env()}
    label = "this tree"
    if source:
        env["PYTHONPATH"] = str(source_tree(source, work))  # before the editable install
        short = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", source],
                               capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
        label = f"`{source}` ({short})"
    port = free_port()
    argv = [sys.executable, "-m", "gpuquota.exporter.cli", f"--listen=127.0.0.1:{port}",
            f"--interval={args.interval}", "--pod-resources-socket="]  # fmt: skip
    log = (work / "exporter.log").open("wb")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=work)
    runs = []
    try:
        wait_ready(port, proc)
        url = f"http://127.0.0.1:{port}/metrics"
        command = [wrk, "-t1", f"-c{args.connections}", f"-d{args.duration}s", "--latency", url]
        for held in [0, args.held] * args.repeat:  # interleaved: a noisy moment hits both
            holder = Holder(port, held) if held else None
            if holder is not None:
                holder.start()
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=120)
            finally:
                reopened = holder.reopened if holder is not None else 0
                if holder is not None:
                    holder.stop()
            percentiles, rate, errors = parse_wrk(done.stdout)
            runs.append(
                Run(label, held, percentiles[50], percentiles[90], percentiles[99], rate, errors,
                    reopened, " ".join(["wrk", *command[1:-1], "http://127.0.0.1:PORT/metrics"]))
            )  # fmt: skip
            print(f"{label} held={held}: p50 {percentiles[50]:.2f} ms, p99 "
                  f"{percentiles[99]:.2f} ms, {rate:.0f} req/s, errors {errors}, "
                  f"reopened {reopened}", flush=True)  # fmt: skip
            time.sleep(1.0)
    finally:
        stop_process(proc)
        log.close()
        node.close()
    return runs


def _ms(value: float) -> str:
    return "-" if value == float("inf") else f"{value:.2f} ms"


def _range(low: float, high: float) -> str:
    return "-" if high == float("inf") and low == high else f"{_ms(low)} - {_ms(high)}"


def summarize(runs: list[Run]) -> list[tuple[str, int, dict[str, float], str, int, int]]:
    """Per (server, held): medians of p50/p90/p99/req/s plus the p99 range, the errors seen,
    the connections the server closed, and how many runs."""
    out = []
    for label, held in dict.fromkeys((r.label, r.held) for r in runs):
        mine = [r for r in runs if (r.label, r.held) == (label, held)]
        values = {
            "p50": statistics.median(r.p50_ms for r in mine),
            "p90": statistics.median(r.p90_ms for r in mine),
            "p99": statistics.median(r.p99_ms for r in mine),
            "p99_min": min(r.p99_ms for r in mine),
            "p99_max": max(r.p99_ms for r in mine),
            "rate": statistics.median(r.requests_per_s for r in mine),
        }
        errors = "; ".join(dict.fromkeys(r.errors for r in mine if r.errors != "none")) or "none"
        out.append((label, held, values, errors, sum(r.reopened for r in mine), len(mine)))
    return out


def markdown(runs: list[Run], args: argparse.Namespace) -> str:
    summary = summarize(runs)
    worst = max(v["p99"] for label, _h, v, *_ in summary if label == "this tree")
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    rows = "\n".join(
        f"| {label} | {held:,} | {_ms(v['p50'])} | {_ms(v['p90'])} | {_ms(v['p99'])} "
        f"| {_range(v['p99_min'], v['p99_max'])} | {v['rate']:,.0f} | {errors} "
        f"| {reopened:,} |"
        for label, held, v, errors, reopened, _n in summary
    )
    return f"""Scrape latency of gpu-exporter's HTTP endpoint measured with Debian's `wrk` (C), on
the NVML stand-in `{args.shape}` (8 GPUs) collecting every {args.interval} while wrk scrapes.

- Command: `.venv/bin/python -m bench.scrape{f" --compare {args.compare}" if args.compare else ""}` runs `{runs[0].command}` against this tree
  (about {2 * args.repeat * (args.duration + 2) + 10} s per server), alone and while {args.held:,} other
  connections are held open (half idle, half with half a request header sent, opened over
  10 s; every one the server closes at its 10 s header deadline is reopened at once, so all
  are held for the whole run).
- wrk: one thread, {args.connections} keep-alive connections, as many requests as they can
  make, so the numbers are under load, not at Prometheus' usual one scrape per interval.
  Each condition ran {args.repeat} times ({args.duration} s each), interleaved; the table
  gives the medians over the runs and the range of p99.
- Machine: 2 CPUs shared by wrk and the exporter; load average {load} at the end.

| server | held connections | p50 | p90 | p99 | p99 range | requests/s | errors | held connections closed by the server (reopened) |
|---|---:|---:|---:|---:|---:|---:|---|---:|
{rows}

Target: p99 under 5 ms with {args.connections} concurrent scrapers at 8 GPUs, also with
{args.held:,} held connections: {"met" if worst < 5 else "missed"} (median p99
{worst:.2f} ms in the worse condition for this tree)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scrape", description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument(
        "--shape", default="h100x8", help="NVML stand-in node (default %(default)s)"
    )
    parser.add_argument(
        "--interval", default="1s", help="collection interval (default %(default)s)"
    )
    parser.add_argument(
        "--duration", type=int, default=10, help="seconds per wrk run (default %(default)s)"
    )
    parser.add_argument(
        "--connections", type=int, default=10, help="wrk connections (default %(default)s)"
    )
    parser.add_argument(
        "--held", type=int, default=1000, help="connections held open (default %(default)s)"
    )
    parser.add_argument(
        "--source", metavar="REV", help="run the exporter code of this git revision"
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs per condition (default %(default)s)"
    )
    parser.add_argument(
        "--compare",
        metavar="REV",
        help="also run the code of this git revision (e.g. main) and put it beside",
    )
    parser.add_argument("--no-write", action="store_true", help="do not update docs/benchmarks.md")
    args = parser.parse_args(argv)  # fmt: skip
    wrk = shutil.which("wrk")
    if wrk is None:
        print(
            f"bench.scrape: error: wrk is not installed; run: sudo {WRK_INSTALL}", file=sys.stderr
        )
        return 1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 2 * args.held + 1024  # ours, and the exporter's (it inherits the limit)
    if soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            print(f"bench.scrape: error: the fd limit {hard} is below {wanted}; lower --held",
                  file=sys.stderr)  # fmt: skip
            return 1
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    with tempfile.TemporaryDirectory(prefix="bench-scrape-") as tmp:
        runs = bench(args, wrk, Path(tmp), args.source)
        ours = list(runs)
        if args.compare:
            runs += bench(args, wrk, Path(tmp) / "compare", args.compare)
    if not args.no_write and not args.source:
        write_section("scrape", markdown(runs, args))
    p99 = max(v["p99"] for _label, _h, v, *_ in summarize(ours))
    print(f"p99_ms={p99:.2f} held={args.held} connections={args.connections}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
