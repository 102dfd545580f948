"""A real Prometheus server (Debian's package) for tests, benchmarks and the demo.

``serving`` starts one on a free port with a given configuration and TSDB folder and stops it
on exit; ``create_blocks`` writes samples with their own timestamps (OpenMetrics text) into
TSDB blocks with ``promtool tsdb create-blocks-from openmetrics``, so a Prometheus started on
that folder answers queries about them as if it had scraped them.
"""

from __future__ import annotations

import shutil
import subprocess
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gpuquota.sim.harness import free_port, stop_process, wait_for


def binary(name: str = "prometheus") -> str:
    found = shutil.which(name)
    if not found:
        raise RuntimeError(f"{name} is not installed: apt-get install -y prometheus")
    return found


def create_blocks(source: Path, tsdb: Path) -> None:
    """Blocks under ``tsdb`` from the OpenMetrics file ``source`` (ending with ``# EOF``);
    they may overlap blocks already there. RuntimeError with promtool's output on failure."""
    tsdb.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [binary("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(source), str(tsdb)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"promtool: {done.stdout[-2000:]}{done.stderr[-2000:]}")


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    url: str


@contextmanager
def serving(config: Path, tsdb: Path, *extra: str) -> Iterator[Served]:
    """Prometheus with ``config`` on ``tsdb``, ready (its /-/ready answers) until exit."""
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
    served = Served(proc, f"http://127.0.0.1:{port}")

    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited: {proc.communicate()[1].decode()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{served.url}/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    try:
        wait_for(ready, timeout=60, what="prometheus /-/ready", interval=0.1)
        yield served
    finally:
        stop_process(proc, timeout=15)


@contextmanager
def serving_blocks(tsdb: Path, work: Path) -> Iterator[Served]:
    """Prometheus serving the blocks under ``tsdb`` (see create_blocks), scraping nothing,
    keeping them however old they are."""
    config = work / "prometheus-blocks.yml"
    config.write_text("global:\n  scrape_interval: 15s\nscrape_configs: []\n")
    with serving(config, tsdb, "--storage.tsdb.retention.time=100y") as served:
        yield served


@contextmanager
def scraping(
    work: Path, jobs: Mapping[str, Sequence[int]], rules: Path | None = None
) -> Iterator[Served]:
    """Prometheus scraping 127.0.0.1:<port> for each job's ports every second, until exit;
    with ``rules`` (a rules file) evaluating it every second too."""
    lines = ["global:", "  scrape_interval: 1s", "  scrape_timeout: 1s"]
    if rules is not None:
        lines += ["  evaluation_interval: 1s", "rule_files:", f"  - '{rules}'"]
    lines += ["scrape_configs:"]
    for job, ports in jobs.items():
        targets = ", ".join(f"'127.0.0.1:{port}'" for port in ports)
        lines += [f"  - job_name: {job}", "    static_configs:", f"      - targets: [{targets}]"]
    work.mkdir(parents=True, exist_ok=True)
    config = work / "prometheus.yml"
    config.write_text("\n".join(lines) + "\n")
    with serving(config, work / "tsdb") as served:
        yield served
