"""A real Prometheus server (Debian's package) started by a test, scraping our programs.

The exporter's and the dashboards' tests read what Prometheus stored through its HTTP API;
the ledger's tests serve samples written with their own timestamps (create_blocks). The
server itself is gpuquota/sim/promserver.py, which the benchmarks use too."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpuquota.sim import promserver


class Prometheus:
    def __init__(self, proc: subprocess.Popen[bytes], url: str) -> None:
        self.proc = proc
        self.url = url

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


@contextmanager
def running(
    work: Path, jobs: Mapping[str, Sequence[int]], rules: Path | None = None
) -> Iterator[Prometheus]:
    """Prometheus scraping 127.0.0.1:<port> for each job's ports every second, until exit
    (and evaluating ``rules``, a rules file, as often)."""
    with promserver.scraping(work, jobs, rules) as served:
        yield Prometheus(served.proc, served.url)


def create_blocks(openmetrics: str, tsdb: Path, work: Path) -> None:
    """Write samples with their own timestamps into TSDB blocks under ``tsdb`` (promtool
    tsdb create-blocks-from openmetrics): Prometheus then serves them as if it had scraped
    them. ``openmetrics`` must end with ``# EOF``; blocks may overlap earlier ones."""
    source = work / f"samples-{time.monotonic_ns()}.om"
    source.write_text(openmetrics)
    promserver.create_blocks(source, tsdb)


@contextmanager
def serving(tsdb: Path, work: Path) -> Iterator[Prometheus]:
    """Prometheus serving the blocks under ``tsdb`` (see create_blocks), scraping nothing."""
    with promserver.serving_blocks(tsdb, work) as served:
        yield Prometheus(served.proc, served.url)
