"""Helpers the report tests share: the refusal check, a closed port, a canned Prometheus
HTTP API, and usage ledger rows written directly (issue #19's contract, section 2)."""

from __future__ import annotations

import json
import socket
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sqlalchemy import insert, select, update

from gpuquota.quota.store.models import (
    Cluster,
    Heartbeat,
    LedgerProgress,
    UsageDevice,
    UsageSeries,
    UsageWindow,
)
from tests.report.conftest import Store, ts

OCT = ts("2026-10-01T00:00:00")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def assert_refused(result: Any, *needles: str, status: int = 2) -> None:
    """One line on stderr, nothing on stdout, exit ``status`` (2: bad input, 1: the
    environment did not answer)."""
    assert result.rc == status
    assert result.out == ""
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    assert lines[0].startswith("gpuquota report: error: ")
    for needle in needles:
        assert needle in lines[0]


class Canned:
    """A local HTTP server answering /api/v1/query with a fixed status and body."""

    def __init__(self) -> None:
        self.status = 200
        self.body: bytes = b""
        self.bodies: dict[str, bytes] = {}  # by PromQL query; else body
        self.requests: list[dict[str, list[str]]] = []
        canned = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                canned.requests.append(
                    urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                )
                query = canned.requests[-1].get("query", [""])[0]
                self.send_response(canned.status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(canned.bodies.get(query, canned.body))

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def vector(values: dict[str, float]) -> bytes:
    result = [
        {"metric": {"namespace": ns}, "value": [OCT + 86400, str(v)]} for ns, v in values.items()
    ]
    return json.dumps(
        {"status": "success", "data": {"resultType": "vector", "result": result}}
    ).encode()


H = 3600
T0 = ts("2026-10-05T10:00:00")
WINDOW = ("--from", "2026-10-05T00:00:00Z", "--to", "2026-10-06T00:00:00Z")
NOW = ("--now", "2026-10-07T00:00:00Z")


def ledger(
    store: Store,
    uid: str,
    windows: list[tuple[int, float, float, float]],
    *,
    namespace: str = "ml",
    name: str = "pod",
    kind: str = "pod",
    device: str = "GPU-0",
    mig_profile: str | None = None,
    node: str = "node-1",
    cluster: str = "c1",
    progress: int | None = None,
) -> None:
    """One ledger series (holder ``uid`` on ``device``) and its windows, each (start, used
    physical GPU-seconds, joules, sampled seconds), one hour long."""
    with store.engine.begin() as conn:
        did = conn.execute(
            select(UsageDevice.id).where(
                UsageDevice.cluster == cluster, UsageDevice.device_uuid == device
            )
        ).scalar()
        if did is None:
            did = conn.execute(
                insert(UsageDevice)
                .values(
                    cluster=cluster,
                    device_uuid=device,
                    node=node,
                    gpu_model="NVIDIA H100 80GB HBM3",
                    mig_profile=mig_profile,
                )
                .returning(UsageDevice.id)
            ).scalar_one()
        elif mig_profile is not None:
            conn.execute(
                update(UsageDevice).where(UsageDevice.id == did).values(mig_profile=mig_profile)
            )
        sid = conn.execute(
            select(UsageSeries.id).where(
                UsageSeries.cluster == cluster,
                UsageSeries.device_id == did,
                UsageSeries.holder_uid == uid,
            )
        ).scalar()
        if sid is None:
            sid = conn.execute(
                insert(UsageSeries)
                .values(
                    cluster=cluster,
                    device_id=did,
                    holder_kind=kind,
                    holder_uid=uid,
                    namespace=namespace,
                    holder_name=name,
                    activity="sm_active",
                )
                .returning(UsageSeries.id)
            ).scalar_one()
        for start, used, joules, sampled in windows:
            conn.execute(
                insert(UsageWindow).values(
                    series_id=sid,
                    window_start=start,
                    window_seconds=H,
                    used_gpu_seconds=used,
                    energy_joules=joules,
                    sampled_seconds=sampled,
                    end_used=None,
                    end_energy=None,
                )
            )
        if progress is not None:
            conn.execute(
                insert(LedgerProgress).values(
                    cluster=cluster, window_seconds=H, ingested_until=progress, updated_at=progress
                )
            )


def uid(store: Store) -> str:
    """The pod UID of the allocation ``store.alloc`` wrote last."""
    return f"uid-{store._seq}"


def known(store: Store, begins: int, ends: int, cluster: str = "c1") -> None:
    """The cluster's data covers [begins, ends) (its clusters row and its heartbeat)."""
    with store.engine.begin() as conn:
        conn.execute(insert(Cluster).values(name=cluster, created_at=begins))
        conn.execute(
            insert(Heartbeat).values(
                cluster=cluster, holder="replay", at=ends, resource_versions={}
            )
        )


def doc_of(
    report: Any, store: Store, *argv: str, now: str = "2026-11-22T00:00:00Z"
) -> dict[str, Any]:
    """The report's JSON for ``argv`` at ``now``; asserts it exited 0."""
    result = report(*argv, "--json", "--now", now, db=store)
    assert result.rc == 0, result.err
    doc: dict[str, Any] = json.loads(result.out)
    return doc
