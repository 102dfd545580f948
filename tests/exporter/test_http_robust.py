"""The HTTP endpoint against slow, idle and hostile clients: held connections, deadlines,
HEAD, no version banners, liveness of a stuck collector, and basic auth that cannot be timed
or flooded."""

from __future__ import annotations

import base64
import http.client
import resource
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import bcrypt
import pytest

from gpuquota.exporter.expose import authguard
from gpuquota.exporter.expose.render import Renderer
from gpuquota.exporter.expose.server import ExporterServer
from gpuquota.exporter.expose.webconfig import bcrypt_cost, load
from gpuquota.exporter.health.publishing import PublisherStatus
from gpuquota.exporter.health.verdict import NodeHealth
from gpuquota.exporter.snapshot import NodeSnapshot
from tests.exporter.scrape import get

HELD = 1000


@pytest.fixture
def many_fds() -> Iterator[None]:
    """Both ends of HELD connections live in this process: raise the soft fd limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 3 * HELD + 1024
    if soft < wanted:
        new = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        assert new >= 2 * HELD + 256, f"the hard fd limit {hard} is too low for this test"
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _hold(server: ExporterServer, count: int) -> list[socket.socket]:
    """``count`` connections: half idle, half with half a request header sent."""
    held = []
    for i in range(count):
        conn = socket.create_connection(server.address, timeout=5)
        if i % 2:
            conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: slow\r\nX-Partial: ")
        held.append(conn)
    return held


def _closed_by_server(conn: socket.socket, within: float) -> bool:
    conn.settimeout(within)
    try:
        return conn.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_a_thousand_slow_or_idle_connections_leave_scrapes_unaffected(serve, many_fds) -> None:
    _node, _collector, server = serve("h100x8")
    held = _hold(server, HELD)
    try:
        # every scrape answered (each with a 5 s timeout) while all of them are still open
        with ThreadPoolExecutor(10) as pool:
            statuses = list(pool.map(lambda _: get(server, "/metrics")[0], range(100)))
        assert statuses == [200] * 100
        assert not _closed_by_server(held[0], 0.01) and not _closed_by_server(held[1], 0.01)
    finally:
        for conn in held:
            conn.close()


def test_half_sent_headers_and_idle_connections_are_closed_at_their_deadlines(
    serve, nvml_on
) -> None:
    _node, collector, default = serve()
    server = ExporterServer(
        collector, default.source.renderer, host="127.0.0.1", port=0, header_timeout=0.3,
        idle_timeout=1.0,
    )  # fmt: skip
    server.start()
    try:
        partial, idle = _hold(server, 2)[::-1]
        assert _closed_by_server(partial, 3.0), "half a header was kept past the deadline"
        assert _closed_by_server(idle, 3.0), "an idle connection was kept past the deadline"
        # a kept-alive connection that starts its next request and stalls is closed too
        conn = socket.create_connection(server.address, timeout=5)
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b"200 OK" in conn.recv(4096)
        conn.sendall(b"GET /metrics HTTP/1.1\r\n")
        assert _closed_by_server(conn, 3.0)
        conn.close()
        assert get(server, "/metrics")[0] == 200
    finally:
        server.stop()


def test_head_is_answered_like_get_without_a_body(serve) -> None:
    _node, _collector, server = serve(interval=5.0)
    conn = http.client.HTTPConnection(*server.address, timeout=5)
    conn.request("HEAD", "/metrics")
    response = conn.getresponse()
    assert response.status == 200 and response.read() == b""
    length = int(response.getheader("Content-Length", "0"))
    conn.close()
    assert length == len(get(server, "/metrics")[1]) > 0
    conn = http.client.HTTPConnection(*server.address, timeout=5)
    conn.request("POST", "/metrics", body=b"x")
    response = conn.getresponse()
    assert response.status == 405 and response.getheader("Allow") == "GET, HEAD"
    conn.close()


def test_no_interpreter_or_library_version_in_any_answer(serve) -> None:
    _node, _collector, server = serve()
    for path in ("/metrics", "/healthz", "/nope"):
        _status, _body, response = get(server, path)
        assert response.getheader("Server") == "gpu-exporter", path
    with socket.create_connection(server.address, timeout=5) as conn:  # a malformed request
        conn.sendall(b"GET /metrics HTTP/1.1\r\nHost x\r\n\r\n")
        answer = conn.recv(4096)
    assert answer.startswith(b"HTTP/1.") and answer.split(b" ")[1] == b"400"
    assert b"Python" not in answer and b"aiohttp" not in answer
    assert b"\r\nServer: gpu-exporter\r\n" in answer


def test_liveness_fails_when_the_collector_makes_no_progress(serve) -> None:
    _node, collector, default = serve(interval=0.1)
    server = ExporterServer(
        collector, default.source.renderer, host="127.0.0.1", port=0, liveness_timeout=0.5
    )
    server.start()
    gate, stuck = threading.Event(), threading.Event()

    def hang(_snapshot: object) -> None:  # as an NVML call that never returns would
        stuck.set()
        gate.wait(30)

    try:
        assert get(server, "/healthz")[0] == 200
        collector.subscribe(hang)
        assert stuck.wait(5)
        deadline = time.monotonic() + 10
        while (answer := get(server, "/healthz"))[0] == 200:
            assert time.monotonic() < deadline, "/healthz stayed 200 with a hung collector"
            time.sleep(0.1)
        assert answer[0] == 503 and b"no progress" in answer[1]
        assert collector.is_alive()  # the thread is there, just stuck
    finally:
        gate.set()
        server.stop()


# --- basic auth ------------------------------------------------------------------------------


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def _get_from(server: ExporterServer, source: str, headers: dict[str, str]) -> int:
    conn = http.client.HTTPConnection(*server.address, timeout=10, source_address=(source, 0))
    try:
        conn.request("GET", "/metrics", headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


@pytest.fixture
def checked_costs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The bcrypt cost of every hash a password is checked against from now on."""
    costs: list[int] = []
    original = bcrypt.checkpw

    def counting(password: bytes, hashed: bytes) -> bool:
        costs.append(bcrypt_cost(hashed))
        return original(password, hashed)

    monkeypatch.setattr(bcrypt, "checkpw", counting)
    return costs


def test_unknown_users_cost_what_known_users_cost(tmp_path: Path, checked_costs) -> None:
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=6)).decode()
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users:\n  prom: '{hashed}'\n")
    config = load(path)
    checked_costs.clear()
    header = _basic("prom", "wrong")["Authorization"]
    assert not config.authorized(header)
    assert not config.authorized(_basic("nobody", "wrong")["Authorization"])
    assert checked_costs == [6, 6]  # one check each, of the same cost
    # the verdict is remembered: no second bcrypt for the same credential, never its text
    assert not config.authorized(header)
    assert checked_costs == [6, 6]
    assert all(b"wrong" not in key and b"prom" not in key for key in config._verdicts)


def test_a_flood_of_wrong_passwords_is_throttled_per_address(
    serve, tmp_path: Path, checked_costs
) -> None:
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users:\n  prom: '{hashed}'\n")
    _node, _collector, server = serve(web_config=load(path))
    good = _basic("prom", "pw")
    assert _get_from(server, "127.0.0.1", good) == 200
    checked_costs.clear()

    flood: list[int] = []
    with ThreadPoolExecutor(8) as pool:
        attempts = [pool.submit(_get_from, server, "127.0.0.2", _basic("prom", f"guess{i}"))
                    for i in range(200)]  # fmt: skip
        scrapes = [pool.submit(_get_from, server, "127.0.0.1", good) for _ in range(20)]
        flood = [a.result() for a in attempts]
        assert [s.result() for s in scrapes] == [200] * 20  # the good scraper never waits out
    assert set(flood) == {401, 429}
    assert flood.count(401) <= authguard.FAILURE_BURST + 5  # a few refills during the flood
    # bcrypt ran only for the attempts let through, never for the good scraper (remembered)
    assert len(checked_costs) == flood.count(401)
    # another address is not throttled by the first one's failures
    assert _get_from(server, "127.0.0.3", _basic("prom", "bad")) == 401


def test_throttled_answers_say_when_to_retry(serve, tmp_path: Path) -> None:
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users:\n  prom: '{hashed}'\n")
    _node, _collector, server = serve(web_config=load(path))
    for _ in range(authguard.FAILURE_BURST):
        assert get(server, "/metrics", _basic("prom", "bad"))[0] == 401
    status, _body, response = get(server, "/metrics", _basic("prom", "bad"))
    assert status == 429 and int(response.getheader("Retry-After", "0")) >= 1
    assert get(server, "/healthz")[0] == 200  # probes need no credentials, are never throttled


class _RecordingRenderer(Renderer):
    """The real renderer, noting each render: the snapshot (kept, so ids never repeat), the
    verdict's generation and the thread it ran in."""

    def __init__(self) -> None:
        super().__init__()
        self.renders: list[tuple[NodeSnapshot, int | None, str]] = []

    def render(
        self,
        snapshot: NodeSnapshot,
        verdict: NodeHealth | None = None,
        *,
        publishers: PublisherStatus | None = None,
    ) -> bytes:
        generation = verdict.generation if verdict is not None else None
        self.renders.append((snapshot, generation, threading.current_thread().name))
        return super().render(snapshot, verdict, publishers=publishers)


def test_snapshots_render_once_when_scraped_and_never_on_the_event_loop(serve) -> None:
    _node, collector, server = serve(interval=0.1)
    recording = server.source.renderer = _RecordingRenderer()
    first = collector.latest()
    time.sleep(0.5)  # about five collections
    assert collector.latest() is not first
    assert recording.renders == []  # nobody scraped: nothing rendered

    def scrape(i: int) -> tuple[int, int]:
        headers = {"Accept-Encoding": "gzip"} if i % 2 else {}
        status, body, _ = get(server, "/metrics", headers)
        return status, len(body)

    with ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(scrape, range(200)))
    assert {status for status, _ in answers} == {200}
    plain = max(size for (_, size), i in zip(answers, range(200), strict=True) if i % 2 == 0)
    zipped = max(size for (_, size), i in zip(answers, range(200), strict=True) if i % 2)
    assert zipped < plain
    assert recording.renders  # the scrapes were served from renders ...
    assert "http" not in {thread for _, _, thread in recording.renders}  # ... none on the loop
    keys = [(id(snapshot), generation) for snapshot, generation, _ in recording.renders]
    assert len(keys) == len(set(keys))  # and no snapshot rendered twice


def test_a_rotated_certificate_is_served_to_new_connections(
    serve, tls_files: dict[str, Path], tmp_path: Path
) -> None:
    import os
    import ssl

    from gpuquota.exporter.expose.webconfig import ReloadingWebConfig

    config_file = tmp_path / "web.yml"

    def use(name: str) -> None:
        stamp = time.time_ns() + 2_000_000_000 * (name == "client")
        config_file.write_text(
            f"tls_server_config:\n  cert_file: {tls_files[name + '_crt']}\n"
            f"  key_file: {tls_files[name + '_key']}\n"
        )
        os.utime(config_file, ns=(stamp, stamp))

    def served_name() -> str:
        context = ssl.create_default_context(cafile=str(tls_files["ca_crt"]))
        with (
            socket.create_connection(server.address, timeout=5) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as conn,
        ):
            subject = dict(pair[0] for pair in conn.getpeercert()["subject"])
            return str(subject["commonName"])

    use("server")
    _node, _collector, server = serve(web_config=ReloadingWebConfig(config_file, check_every=0))
    assert served_name() == "server"
    use("client")  # a certificate for the same names, issued anew
    assert served_name() == "client"


def test_beyond_the_connection_limit_the_oldest_idle_connection_makes_room(serve) -> None:
    _node, collector, default = serve()
    server = ExporterServer(
        collector, default.source.renderer, host="127.0.0.1", port=0, max_connections=20
    )
    server.start()
    try:
        held = _hold(server, 30)
        time.sleep(0.3)  # the server handles the accepts
        assert get(server, "/metrics")[0] == 200  # a scraper still gets in
        closed = [i for i, conn in enumerate(held) if _closed_by_server(conn, 0.2)]
        assert closed and closed == list(range(len(closed)))  # the oldest ones
        assert len(held) - len(closed) <= 20
        for conn in held:
            conn.close()
    finally:
        server.stop()
