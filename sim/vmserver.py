"""A real VictoriaMetrics single-node server (Debian's ``victoria-metrics`` package) for tests
and benchmarks: the other time-series store the usage ledger and the fleet history read
through the Prometheus HTTP API.

``serving`` starts one on a free loopback port with its data under a given folder and stops it
on exit (its query cache off, so that a benchmark measures the queries); ``import_text`` sends
it samples with their own timestamps in the Prometheus text format (``name{labels} value
t_ms`` lines) and flushes them, so that they are searchable at once.
"""

from __future__ import annotations

import http.client
import shutil
import subprocess
import urllib.request
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gpuquota.sim.harness import free_port, stop_process, wait_for


def binary() -> str:
    found = shutil.which("victoria-metrics")
    if not found:
        raise RuntimeError("victoria-metrics is not installed: apt-get install -y victoria-metrics")
    return found


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    url: str
    port: int


@contextmanager
def serving(data: Path) -> Iterator[Served]:
    """VictoriaMetrics storing under ``data``, ready (its /health answers) until exit."""
    port = free_port()
    data.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [
            binary(),
            f"-storageDataPath={data}",
            f"-httpListenAddr=127.0.0.1:{port}",
            "-retentionPeriod=100y",
            "-search.disableCache",
            "-search.latencyOffset=0s",
            "-loggerLevel=ERROR",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    served = Served(proc, f"http://127.0.0.1:{port}", port)

    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"victoria-metrics exited: {proc.communicate()[1].decode()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{served.url}/health", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    try:
        wait_for(ready, timeout=60, what="victoria-metrics /health", interval=0.1)
        yield served
    finally:
        stop_process(proc, timeout=15)


def import_text(served: Served, chunks: Iterable[bytes]) -> None:
    """POST ``chunks`` (Prometheus text lines with millisecond timestamps) to
    /api/v1/import/prometheus in one streamed request, then flush them to searchable parts.
    RuntimeError naming the answer when VictoriaMetrics refuses them."""
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=600)
    try:
        conn.request("POST", "/api/v1/import/prometheus", body=iter(chunks), encode_chunked=True)
        answer = conn.getresponse()
        body = answer.read()
        if answer.status // 100 != 2:
            raise RuntimeError(f"victoria-metrics import: HTTP {answer.status}: {body[:500]!r}")
        conn.request("GET", "/internal/force_flush")
        flushed = conn.getresponse()
        flushed.read()
    finally:
        conn.close()
