"""A real Prometheus server (Debian's package) started by a test, scraping our programs.

The exporter's and the dashboards' tests read what Prometheus stored through its HTTP API."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpuquota.sim.harness import stop_process, wait_for
from tests.exporter.procs import free_port


class Prometheus:
    def __init__(self, proc: subprocess.Popen[bytes], port: int) -> None:
        self.proc = proc
        self.url = f"http://127.0.0.1:{port}"

    def api(self, path: str, **params: str) -> Any:
        """The ``data`` of a successful /api/v1 answer."""
        url = f"{self.url}/api/v1/{path}?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=5) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        return list(self.api("query", query=promql)["result"])

    def wait_for(self, promql: str, check: Callable[[list[dict[str, Any]]], bool]) -> list:
        deadline = time.monotonic() + 20
        result: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            result = self.query(promql)
            if check(result):
                return result
            time.sleep(0.2)
        raise AssertionError(f"{promql}: never satisfied; last result {result}")


def binary() -> str:
    found = shutil.which("prometheus")
    assert found, "prometheus is not installed: apt-get install -y prometheus (make test does)"
    return found


@contextmanager
def running(work: Path, jobs: Mapping[str, Sequence[int]]) -> Iterator[Prometheus]:
    """Prometheus scraping 127.0.0.1:<port> for each job's ports every second, until exit."""
    lines = ["global:", "  scrape_interval: 1s", "  scrape_timeout: 1s", "scrape_configs:"]
    for job, ports in jobs.items():
        targets = ", ".join(f"'127.0.0.1:{port}'" for port in ports)
        lines += [f"  - job_name: {job}", "    static_configs:", f"      - targets: [{targets}]"]
    config = work / "prometheus.yml"
    config.write_text("\n".join(lines) + "\n")
    with _serve(config, work / "tsdb") as server:
        yield server


def create_blocks(openmetrics: str, tsdb: Path, work: Path) -> None:
    """Write samples with their own timestamps into TSDB blocks under ``tsdb`` (promtool
    tsdb create-blocks-from openmetrics): Prometheus then serves them as if it had scraped
    them. ``openmetrics`` must end with ``# EOF``; blocks may overlap earlier ones."""
    source = work / f"samples-{time.monotonic_ns()}.om"
    source.write_text(openmetrics)
    tsdb.mkdir(parents=True, exist_ok=True)
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed: apt-get install -y prometheus (make test does)"
    done = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(tsdb)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, f"promtool: {done.stdout[-2000:]}{done.stderr[-2000:]}"


@contextmanager
def serving(tsdb: Path, work: Path) -> Iterator[Prometheus]:
    """Prometheus serving the blocks under ``tsdb`` (see create_blocks), scraping nothing."""
    config = work / "prometheus-blocks.yml"
    config.write_text("global:\n  scrape_interval: 15s\nscrape_configs: []\n")
    with _serve(config, tsdb, "--storage.tsdb.retention.time=100y") as server:
        yield server


@contextmanager
def _serve(config: Path, tsdb: Path, *extra: str) -> Iterator[Prometheus]:
    port = free_port()
    proc = subprocess.Popen(
        [
            binary(),
            f"--config.file={config}",
            f"--storage.tsdb.path={tsdb}",
            f"--web.listen-address=127.0.0.1:{port}",
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    server = Prometheus(proc, port)

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"prometheus exited: {proc.communicate()[1].decode()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    try:
        wait_for(ready, timeout=30, what="prometheus /-/ready", interval=0.1)
        yield server
    finally:
        stop_process(proc, timeout=15)
