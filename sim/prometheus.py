"""A real Prometheus server (Debian's package) scraping our programs, for the demo and tests.

The usage ledger (issue 19) reads the node agents' counters back through Prometheus' HTTP API,
so the demo and the end-to-end tests run the real thing: `prometheus` from the Debian package
(``make test`` and ``make demo`` install it), scraping 127.0.0.1 ports every second.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from gpuquota.sim.harness import stop_process, wait_for


class PrometheusMissingError(RuntimeError):
    pass


def binary() -> str:
    found = shutil.which("prometheus")
    if not found:
        raise PrometheusMissingError(
            "prometheus is not installed: apt-get install -y prometheus (tools/debian-packages, "
            "which make demo and make test run, does it as root)"
        )
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def config_text(jobs: Mapping[str, Sequence[int]], scrape_interval: str = "1s") -> str:
    """A scrape configuration: each job scrapes 127.0.0.1:<port> for each of its ports."""
    lines = [
        "global:",
        f"  scrape_interval: {scrape_interval}",
        f"  scrape_timeout: {scrape_interval}",
        "scrape_configs:",
    ]
    for job, ports in jobs.items():
        targets = ", ".join(f"'127.0.0.1:{port}'" for port in ports)
        lines += [f"  - job_name: {job}", "    static_configs:", f"      - targets: [{targets}]"]
    return "\n".join(lines) + "\n"


@contextmanager
def running(
    work: Path,
    jobs: Mapping[str, Sequence[int]],
    *,
    tsdb: Path | None = None,
    extra_args: Sequence[str] = (),
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """Prometheus scraping each job's ports every second, until exit: (process, base URL)."""
    work.mkdir(parents=True, exist_ok=True)
    config = work / "prometheus.yml"
    config.write_text(config_text(jobs))
    port = _free_port()
    log = (work / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            binary(),
            f"--config.file={config}",
            f"--storage.tsdb.path={tsdb or work / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            *extra_args,
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if proc.poll() is not None:
            tail = (work / "prometheus.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"prometheus exited ({proc.returncode}): {tail}")
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    try:
        wait_for(ready, timeout=30, what="prometheus /-/ready", interval=0.1)
        yield proc, url
    finally:
        stop_process(proc, timeout=15)
        log.close()
