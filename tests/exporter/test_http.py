"""The HTTP endpoint in-process: routes, readiness, concurrency, TLS and basic auth."""

from __future__ import annotations

import base64
import gzip
import http.client
import os
import ssl
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import bcrypt
import pytest

from gpuquota.exporter.collect.nvml import NvmlApi
from gpuquota.exporter.expose.render import Renderer
from gpuquota.exporter.expose.server import ExporterServer
from gpuquota.exporter.expose.webconfig import ReloadingWebConfig, load
from gpuquota.sim.nvml.control import SimNode
from tests.exporter.scrape import get

NvmlOn = Callable[[Any], tuple[SimNode, NvmlApi]]


def test_routes(serve) -> None:
    node, _collector, server = serve()
    status, body, response = get(server, "/metrics")
    assert status == 200
    assert response.getheader("Content-Type", "").startswith("text/plain; version=0.0.4")
    assert f'uuid="{node.uuid(1)}"'.encode() in body
    assert get(server, "/healthz")[:2] == (200, b"ok\n")
    assert get(server, "/readyz")[:2] == (200, b"ready\n")
    assert get(server, "/nope")[0] == 404
    assert b"/metrics" in get(server, "/")[1]


def test_extra_routes(serve) -> None:
    _node, _collector, server = serve()
    server.add_route("/health", lambda: (200, "application/json", b'{"ok": true}'))
    status, body, response = get(server, "/health")
    assert (status, body) == (200, b'{"ok": true}')
    assert response.getheader("Content-Type") == "application/json"
    server.add_route("/boom", lambda: 1 / 0)  # type: ignore[arg-type, return-value]
    assert get(server, "/boom")[0] == 500
    with pytest.raises(ValueError, match="must start with"):
        server.add_route("health", lambda: (200, "text/plain", b""))


def test_scrapes_follow_new_snapshots(serve) -> None:
    node, _collector, server = serve()
    node.set(0, power_watts=33.0)
    deadline = time.monotonic() + 10
    while (
        b'gpu_power_watts{gpu="0",' + f'uuid="{node.uuid(0)}"}} 33'.encode()
        not in get(server, "/metrics")[1]
    ):
        assert time.monotonic() < deadline, "new value never scraped"
        time.sleep(0.05)


def test_not_ready_when_snapshots_go_stale_and_unhealthy_when_stopped(serve) -> None:
    _node, collector, server = serve(interval=0.1)
    collector.stop()
    assert get(server, "/healthz")[0] == 503
    time.sleep(0.4)  # more than 3 intervals
    status, body, _ = get(server, "/readyz")
    assert status == 503 and b"old" in body
    assert get(server, "/metrics")[0] == 200  # still serves the last snapshot


def test_concurrent_scrapes_share_one_render(serve) -> None:
    _node, collector, server = serve("h100x8", interval=5.0)
    with ThreadPoolExecutor(16) as pool:
        bodies = list(pool.map(lambda _i: get(server, "/metrics")[1], range(64)))
    assert len(set(bodies)) == 1 and bodies[0]
    snapshot = collector.latest()
    assert snapshot is not None
    assert server.source.renderer.exposition(snapshot) is server.source.renderer.exposition(
        snapshot
    )


def test_slow_client_does_not_block_others(serve) -> None:
    _node, _collector, server = serve()
    host, port = server.address
    import socket

    stalled = socket.create_connection((host, port))  # connects, never sends a request
    try:
        # Served while the stalled connection is still open (a blocked server would time out).
        assert get(server, "/metrics")[0] == 200
        stalled.settimeout(0.01)
        with pytest.raises(TimeoutError):
            stalled.recv(1)  # ... and the stalled one is still waiting, not closed
    finally:
        stalled.close()


def _auth(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def test_tls_and_basic_auth(serve, tls_files: dict[str, Path], tmp_path: Path) -> None:
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    config_file = tmp_path / "web.yml"
    config_file.write_text(
        f"tls_server_config:\n  cert_file: {tls_files['server_crt']}\n"
        f"  key_file: {tls_files['server_key']}\n"
        f"basic_auth_users:\n  prom: '{hashed}'\n"
    )
    _node, _collector, server = serve(web_config=load(config_file))
    context = ssl.create_default_context(cafile=str(tls_files["ca_crt"]))
    assert server.scheme == "https"

    status, _body, response = get(server, "/metrics", context=context)
    assert status == 401
    assert response.getheader("WWW-Authenticate", "").startswith("Basic")
    assert get(server, "/metrics", _auth("prom", "bad"), context=context)[0] == 401
    status, body, _ = get(server, "/metrics", _auth("prom", "pw"), context=context)
    assert status == 200 and b"gpu_info" in body
    # Probes need no credentials.
    assert get(server, "/healthz", context=context)[0] == 200
    assert get(server, "/readyz", context=context)[0] == 200
    # Plain HTTP to the TLS port gets nothing.
    host, port = server.address
    plain = http.client.HTTPConnection(host, port, timeout=5)
    with pytest.raises((http.client.HTTPException, ConnectionError, OSError)):
        plain.request("GET", "/metrics")
        plain.getresponse().read()
    plain.close()


def test_client_certificates(serve, tls_files: dict[str, Path], tmp_path: Path) -> None:
    config_file = tmp_path / "web.yml"
    config_file.write_text(
        f"tls_server_config:\n  cert_file: {tls_files['server_crt']}\n"
        f"  key_file: {tls_files['server_key']}\n"
        "  client_auth_type: RequireAndVerifyClientCert\n"
        f"  client_ca_file: {tls_files['ca_crt']}\n"
    )
    _node, _collector, server = serve(web_config=load(config_file))
    without = ssl.create_default_context(cafile=str(tls_files["ca_crt"]))
    with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException, OSError)):
        get(server, "/metrics", context=without)
    with_cert = ssl.create_default_context(cafile=str(tls_files["ca_crt"]))
    with_cert.load_cert_chain(tls_files["client_crt"], tls_files["client_key"])
    assert get(server, "/metrics", context=with_cert)[0] == 200


def test_port_in_use_fails_at_construction(serve) -> None:
    _node, collector, server = serve()
    host, port = server.address
    with pytest.raises(OSError):
        ExporterServer(collector, Renderer(), host=host, port=port)


def test_scrape_does_not_wait_for_a_slow_collection(serve) -> None:
    _node, collector, server = serve()
    gate, stuck = threading.Event(), threading.Event()

    def block(_snapshot: object) -> None:
        stuck.set()
        gate.wait(30)

    collector.subscribe(block)
    try:
        assert stuck.wait(5)  # the collect thread is now stuck in a subscriber
        for _ in range(3):
            assert get(server, "/metrics")[0] == 200
        assert stuck.is_set() and not gate.is_set()
    finally:
        gate.set()


def test_gzip_when_asked(serve) -> None:
    _node, _collector, server = serve(interval=5.0)
    status, zipped, response = get(server, "/metrics", {"Accept-Encoding": "gzip"})
    assert status == 200 and response.getheader("Content-Encoding") == "gzip"
    _status, plain, response = get(server, "/metrics", {"Accept-Encoding": "identity"})
    assert response.getheader("Content-Encoding") is None
    assert gzip.decompress(zipped) == plain and len(zipped) < len(plain)


def test_web_config_changes_apply_without_restart(serve, tmp_path: Path) -> None:
    old = bcrypt.hashpw(b"old", bcrypt.gensalt(rounds=4)).decode()
    new = bcrypt.hashpw(b"new", bcrypt.gensalt(rounds=4)).decode()
    config_file = tmp_path / "web.yml"
    config_file.write_text(f"basic_auth_users:\n  prom: '{old}'\n")
    _node, _collector, server = serve(web_config=ReloadingWebConfig(config_file, check_every=0))
    assert get(server, "/metrics", _auth("prom", "old"))[0] == 200
    stamp = config_file.stat().st_mtime_ns + 2_000_000_000
    config_file.write_text(f"basic_auth_users:\n  prom: '{new}'\n")
    os.utime(config_file, ns=(stamp, stamp))
    assert get(server, "/metrics", _auth("prom", "old"))[0] == 401
    assert get(server, "/metrics", _auth("prom", "new"))[0] == 200
