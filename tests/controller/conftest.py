"""Harness of the controller tests: the API server stand-in, a store of either kind, and the
controller as a real subprocess (`gpuquota controller`) whose results are read from the store.

PostgreSQL is shared with other test areas: this session works in its own uniquely named
schema (search_path in the URL) and drops it at the end. Its outages are simulated with a TCP
proxy between the controller and the server; SQLite's with an exclusive lock on the file.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from sqlalchemy import create_engine, text

from gpuquota.kube.client import Kube
from gpuquota.quota.accounting.rules.config import DEFAULT_CONFIG
from gpuquota.quota.controller.loop import accounts_pod
from gpuquota.quota.store import db
from gpuquota.sim import harness
from gpuquota.sim.apiserver import ApiServer, Driver
from gpuquota.sim.harness import free_port, wait_for
from gpuquota.sim.workload import Workload
from tests.conftest import PgSchemas

ROOT = Path(__file__).resolve().parents[2]


class TcpProxy:
    """Forwards 127.0.0.1:<port> to a target; cut() drops every connection and refuses new
    ones until restore() (same port)."""

    def __init__(self, target_host: str, target_port: int):
        self.target = (target_host, target_port)
        self._listener: socket.socket | None = None
        self.port = 0
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._open()

    def _open(self) -> None:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(64)
        self.port = s.getsockname()[1]
        self._listener = s
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        if self._listener is not None:
            # shutdown wakes the thread blocked in accept(); close() alone may not
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            conns, self._conns = self._conns, set()
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def restore(self) -> None:
        if self._listener is None:
            self._open()

    def close(self) -> None:
        self.cut()


class Outage:
    """Makes the store unusable for a while: a cut proxy (PostgreSQL) or a held lock (SQLite)."""

    def __init__(self, backend: str, url: str, proxy: TcpProxy | None):
        self.backend, self.url, self.proxy = backend, url, proxy
        self._conn: object = None

    def begin(self) -> None:
        if self.proxy is not None:
            self.proxy.cut()
        else:
            import sqlite3

            path = urlsplit(self.url.split("?")[0].replace("sqlite:///", "file:///")).path
            conn = sqlite3.connect(path, timeout=5, isolation_level=None)
            conn.execute("BEGIN EXCLUSIVE")
            self._conn = conn

    def end(self) -> None:
        if self.proxy is not None:
            self.proxy.restore()
        elif self._conn is not None:
            self._conn.execute("ROLLBACK")  # type: ignore[attr-defined]
            self._conn.close()  # type: ignore[attr-defined]
            self._conn = None


@pytest.fixture(scope="session")
def pg_base(pg_schemas: PgSchemas) -> str:
    """A migrated schema on the shared server for this session (dropped with the session)."""
    url = pg_schemas.new("gq_ctl")
    db.upgrade(url)
    return url


class Store:
    """Where one test's controller writes: its URL (through the proxy for PostgreSQL), the
    direct URL the test reads with, a unique cluster name, and an outage switch."""

    def __init__(self, backend: str, url: str, direct: str, proxy: TcpProxy | None):
        self.backend, self.url, self.direct, self.proxy = backend, url, direct, proxy
        self.cluster = f"c-{uuid.uuid4().hex[:10]}"
        self.outage = Outage(backend, url, proxy)
        self.engine = create_engine(direct)

    def _select(self, sql: str) -> list[dict]:
        """The rows of ``sql`` (with ``:c`` the cluster) as dicts."""
        with self.engine.connect() as c:
            return [dict(r) for r in c.execute(text(sql), {"c": self.cluster}).mappings()]

    def heartbeat(self) -> tuple[str, int, dict[str, str]] | None:
        rows = self._select(
            "SELECT holder, at, resource_versions FROM heartbeats WHERE cluster = :c"
        )
        if not rows:
            return None
        row = rows[0]
        rvs = row["resource_versions"]
        rvs = rvs if isinstance(rvs, dict) else json.loads(rvs)
        return str(row["holder"]), int(row["at"]), rvs

    def allocations(self) -> list[dict]:
        return self._select(
            "SELECT pod_uid, namespace, resource_name, raw_units, physical_gpus, started_at,"
            " ended_at, end_reason, estimated FROM allocations WHERE cluster = :c"
        )

    def gaps(self) -> list[tuple[str, int, int, str]]:
        """(kind, started_at, ended_at, reason) of the stored gaps, oldest first."""
        rows = self._select(
            "SELECT kind, started_at, ended_at, reason FROM gaps WHERE cluster = :c"
            " ORDER BY started_at, kind"
        )
        return [
            (str(r["kind"]), int(r["started_at"]), int(r["ended_at"]), str(r["reason"]))
            for r in rows
        ]

    def totals(self, until: int) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], float]]:
        raw: dict[tuple[str, str], int] = {}
        phys: dict[tuple[str, str], float] = {}
        for r in self.allocations():
            end = until if r["ended_at"] is None else min(r["ended_at"], until)
            secs = max(0, end - r["started_at"])
            key = (r["namespace"], r["resource_name"])
            raw[key] = raw.get(key, 0) + r["raw_units"] * secs
            phys[key] = phys.get(key, 0.0) + r["physical_gpus"] * secs
        return ({k: v for k, v in raw.items() if v}, {k: v for k, v in phys.items() if v})


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'quota.db'}?timeout=0.5"
        db.upgrade(url)
        s = Store("sqlite", url, url, None)
    else:
        base = str(request.getfixturevalue("pg_base"))
        parts = urlsplit(base.replace("postgresql+psycopg", "http"))
        proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
        url = base.replace(f"{parts.hostname}:{parts.port or 5432}", f"127.0.0.1:{proxy.port}")
        if f":{parts.port}" not in base:  # no explicit port in the URL
            url = base.replace(f"@{parts.hostname}/", f"@127.0.0.1:{proxy.port}/")
        s = Store("postgresql", url, base, proxy)
    yield s
    s.outage.end()
    if s.proxy is not None:
        s.proxy.close()
    s.engine.dispose()


@pytest.fixture
def apiserver() -> Iterator[ApiServer]:
    # the real server's defaults: bookmarks rare (never within these short watches)
    with ApiServer() as api:
        yield api


# Leader election with short timings: a standby takes over within seconds
FAST_LEASE = (
    "--lease-name",
    "gpuquota",
    "--lease-namespace",
    "kube-system",
    "--lease-duration",
    "3",
    "--renew-deadline",
    "2",
    "--retry-period",
    "1",
)


class ControllerProcess:
    """`gpuquota controller` as a subprocess, with its log in a file."""

    def __init__(self, api: ApiServer, store: Store, *extra: str, identity: str = "ctl-a"):
        self.dir = Path(tempfile.mkdtemp(dir="/tmp", prefix="gqctl"))
        self.kubeconfig = api.write_kubeconfig(self.dir / "kubeconfig")
        self.metrics_port = free_port()
        self.identity = identity
        self.log_path = self.dir / "controller.log"
        self.args = [
            sys.executable,
            "-m",
            "gpuquota.quota.cli",
            "controller",
            "--kubeconfig",
            str(self.kubeconfig),
            "--db",
            store.url,
            "--cluster",
            store.cluster,
            "--identity",
            identity,
            "--flush-interval",
            "0.3",
            "--read-timeout",
            "1.5",
            "--watch-timeout",
            "2",
            "--startup-timeout",
            "10",
            "--metrics-port",
            str(self.metrics_port),
            "--metrics-address",
            "127.0.0.1",
            *extra,
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ControllerProcess:
        log = self.log_path.open("ab")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            self.args, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env
        )
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(15)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> str:
        import urllib.request

        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5
        ) as r:
            return str(r.read().decode())


@pytest.fixture
def controllers() -> Iterator[list[ControllerProcess]]:
    started: list[ControllerProcess] = []
    yield started
    for c in started:
        c.kill()


# every kind the controller watches: the stand-in serves resource.k8s.io/v1, so DRA's too
WATCHED = len(Kube.KINDS) + len(Kube.DRA_KINDS)


def _applies(obj: dict) -> bool:
    return obj.get("kind") != "Pod" or accounts_pod(obj, DEFAULT_CONFIG)


def kind_caught_up(store: Store, api: ApiServer, kind: str) -> bool:
    """The stored heartbeat names a version of ``kind`` after which the stand-in wrote nothing
    the controller applies (versions are opaque: only the stand-in compares its own)."""
    hb = store.heartbeat()
    return hb is not None and harness.caught_up(api, hb[2], [kind], _applies)


def caught_up(store: Store, api: ApiServer) -> bool:
    """Every watched kind caught up (kind_caught_up)."""
    hb = store.heartbeat()
    return (
        hb is not None and len(hb[2]) == WATCHED and harness.caught_up(api, hb[2], hb[2], _applies)
    )


def claim_totals(store: Store, until: int) -> dict[tuple[str, str, str], tuple[int, Fraction]]:
    """Per (namespace, claim, device class): raw device-seconds and physical GPU-seconds of
    the claim rows (their pieces are disjoint: they add up to each claim's charged time)."""
    with store.engine.connect() as c:
        rows = c.execute(
            text(
                "SELECT namespace, claim_name, resource_name, raw_units, physical_gpus,"
                " started_at, ended_at FROM claim_allocations WHERE cluster = :c"
            ),
            {"c": store.cluster},
        ).mappings()
        out: dict[tuple[str, str, str], tuple[int, Fraction]] = {}
        for r in rows:
            end = until if r["ended_at"] is None else min(r["ended_at"], until)
            secs = max(0, end - r["started_at"])
            if secs:
                key = (r["namespace"], r["claim_name"], r["resource_name"])
                raw, phys = out.get(key, (0, Fraction(0)))
                physical = Fraction(r["physical_gpus"]).limit_denominator(1000)
                out[key] = (raw + r["raw_units"] * secs, phys + physical * secs)
        return out


def assert_dra_exact(store: Store, wl: Workload) -> None:
    want: dict[tuple[str, str, str], tuple[int, Fraction]] = {}
    for iv in wl.truth.dra_intervals:
        key = (iv.namespace, iv.claim_name, iv.device_class)
        raw, phys = want.get(key, (0, Fraction(0)))
        secs = iv.seconds(wl.end)
        want[key] = (raw + iv.units * secs, phys + iv.physical * secs)
    assert claim_totals(store, wl.end) == want
    assert len(want) >= 5


def assert_exact(store: Store, wl: Workload) -> None:
    raw, phys = store.totals(wl.end)
    assert raw == wl.truth.gpu_seconds()
    want = wl.truth.physical_seconds()
    assert raw.keys() == want.keys()
    for k, v in want.items():
        assert phys[k] == pytest.approx(v, rel=1e-9, abs=1e-6), k


# -- helpers of the controller tests (test modules share them through here)


def start(api, store, controllers, *extra, identity="ctl-a"):
    c = ControllerProcess(api, store, *extra, identity=identity).start()
    controllers.append(c)
    return c


def ready(store):
    # the start-up only: a controller that imports, connects and lists on a loaded machine (the
    # suite's parallel workers, other work) may need more than 20 s; the tests time what follows
    wait_for(store.heartbeat, 60, "the controller's first heartbeat")


def drive_through_cut_and_stall(
    api: ApiServer, store: Store, wl: Workload
) -> tuple[Driver, list[int]]:
    """Drives ``wl`` to the third of five marks (sixths of its span): every watch cut after the
    first, every watch stalled (seen by the client's last-resort read timeout, --watch-timeout
    plus 2 s, only) after the second, the
    store caught up after each. The driver and the marks, for the test to go on with."""
    marks = [wl.start + (wl.end - wl.start) * i // 6 for i in range(1, 6)]
    driver = Driver(api, wl)
    driver.run(until=marks[0])
    api.cut_watches()
    driver.run(until=marks[1])
    wait_for(lambda: caught_up(store, api), 20, "catch-up after the cut")
    wait_for(lambda: api.active_watches == WATCHED, 10, "the watches to reconnect")
    api.stall_watches()
    driver.run(until=marks[2])
    wait_for(lambda: caught_up(store, api), 20, "catch-up after the stall")
    return driver, marks


def metric(text: str, name: str, **labels: str) -> float:
    total, found = 0.0, False
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
            found = True
    assert found, f"no {name} {labels}"
    return total
