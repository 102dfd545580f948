"""The exporter's HTTP endpoint: /metrics, /healthz, /readyz and routes other parts add.

A ThreadingHTTPServer: every connection gets its own thread (TLS handshakes included), and a
scrape only renders the collector's latest snapshot (cached per snapshot by the Renderer), so
concurrent scrapes never wait on NVML or on each other, and the collector never waits on them.

TLS and basic auth come from an exporter-toolkit web config (exporter/webconfig.py). Basic
auth guards every route except /healthz and /readyz, which kubelet probes call without
credentials and which reveal nothing but "up".
"""

from __future__ import annotations

import logging
import queue
import socket
import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from exporter.collect import Collector
from exporter.health.verdict import NodeHealth
from exporter.render import CONTENT_TYPE, Renderer
from exporter.webconfig import ReloadingWebConfig, WebConfig

log = logging.getLogger(__name__)

# A route answers (status, content type, body).
Response = tuple[int, str, bytes]
Route = Callable[[], Response]

UNAUTHENTICATED = frozenset({"/healthz", "/readyz"})
READY_AFTER_INTERVALS = 3  # /readyz fails when the newest snapshot is older than this
HANDSHAKE_TIMEOUT_S = 10.0


def _accepts_gzip(headers: Any) -> bool:
    encodings = str(headers.get("Accept-Encoding", "")).lower()
    return any(part.split(";")[0].strip() == "gzip" for part in encodings.split(","))


def _text(status: int, body: str) -> Response:
    return status, "text/plain; charset=utf-8", body.encode()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default listen backlog is 5: a burst of concurrent scrapers overflows it
    # and the kernel drops their SYNs, which costs each one a 1 s retransmit.
    request_queue_size = 128
    block_on_close = False
    allow_reuse_address = True
    ssl_context: ssl.SSLContext | None = None
    exporter: ExporterServer

    def finish_request(self, request: Any, client_address: Any) -> None:
        # The TLS handshake runs here, in the connection's own thread, so one slow client
        # cannot hold up accept() for everybody else.
        if self.ssl_context is not None:
            config = self.exporter.web_config  # the current one: certificates may rotate
            context = config.ssl_context if config and config.ssl_context else self.ssl_context
            request.settimeout(HANDSHAKE_TIMEOUT_S)
            try:
                request = context.wrap_socket(request, server_side=True)
            except (ssl.SSLError, OSError) as exc:
                log.debug("TLS handshake with %s failed: %s", client_address, exc)
                request.close()
                return
        super().finish_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection from %s ended with an error", client_address, exc_info=True)

    # Connections are served by reusable daemon worker threads instead of a new thread each:
    # starting a thread costs about as much CPU as serving a cached scrape. A worker is
    # started only when none is idle, up to MAX_WORKERS; beyond that connections wait.
    MAX_WORKERS = 64
    _jobs: queue.SimpleQueue[tuple[Any, Any] | None] | None = None

    def process_request(self, request: Any, client_address: Any) -> None:
        if self._jobs is None:
            self._jobs = queue.SimpleQueue()
            self._idle = threading.Semaphore(0)
            self._workers = 0
        self._jobs.put((request, client_address))
        if not self._idle.acquire(blocking=False) and self._workers < self.MAX_WORKERS:
            self._workers += 1  # only the accept thread runs this: no lock needed
            threading.Thread(target=self._work, name="http-worker", daemon=True).start()

    def _work(self) -> None:
        assert self._jobs is not None
        while (job := self._jobs.get()) is not None:
            self.process_request_thread(*job)  # finish_request, then shutdown_request
            self._idle.release()

    def server_close(self) -> None:
        super().server_close()
        if self._jobs is not None:
            for _ in range(self._workers):
                self._jobs.put(None)


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; without TCP_NODELAY, Nagle's algorithm and the
    # client's delayed ACK add ~40 ms to every keep-alive scrape.
    disable_nagle_algorithm = True
    timeout = 30  # seconds a connection may sit idle before its thread gives up

    def do_GET(self) -> None:
        exporter = self.server.exporter
        path = self.path.split("?", 1)[0]
        config = exporter.web_config
        if (
            config is not None
            and path not in UNAUTHENTICATED
            and not config.authorized(self.headers.get("Authorization"))
        ):
            self._send(
                *_text(401, "Unauthorized\n"), {"WWW-Authenticate": 'Basic realm="gpu-exporter"'}
            )
            return
        route = exporter.routes.get(path)
        if path == "/metrics" and route == exporter.metrics and _accepts_gzip(self.headers):
            status, content_type, body = exporter.metrics(gzipped=True)
            self._send(
                status, content_type, body, {"Content-Encoding": "gzip"} if status == 200 else None
            )
            return
        if route is None:
            self._send(*_text(404, f"{path} not found\n"))
            return
        try:
            status, content_type, body = route()
        except Exception:
            log.exception("route %s failed", path)
            status, content_type, body = _text(500, "internal error\n")
        self._send(status, content_type, body)

    def _send(
        self, status: int, content_type: str, body: bytes, extra: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        config = self.server.exporter.web_config
        for name, value in {**(config.headers if config else {}), **(extra or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)


class ExporterServer:
    """Serves the collector's snapshots; ``add_route`` lets other parts add endpoints."""

    def __init__(
        self,
        collector: Collector,
        renderer: Renderer,
        *,
        host: str = "",
        port: int = 9400,
        web_config: WebConfig | ReloadingWebConfig | None = None,
    ) -> None:
        self.collector = collector
        self.renderer = renderer
        self._web_config = web_config
        self.routes: dict[str, Route] = {
            "/": self._index,
            "/metrics": self.metrics,
            "/healthz": self._healthz,
            "/readyz": self._readyz,
        }
        # The health verdict rendered beside the latest snapshot (None: no health checking).
        self._verdict_source: Callable[[], NodeHealth | None] | None = None
        # Binding here (not in start) makes "port in use" an error at construction.
        server_class = _Server6 if ":" in host else _Server
        self._server = server_class((host, port), _Handler)
        self._server.exporter = self
        initial = self.web_config
        self._server.ssl_context = initial.ssl_context if initial else None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def web_config(self) -> WebConfig | None:
        """The web config in force now (a reloading one is re-read when its files change)."""
        source = self._web_config
        return source.current() if isinstance(source, ReloadingWebConfig) else source

    @property
    def scheme(self) -> str:
        return "https" if self._server.ssl_context is not None else "http"

    def add_route(self, path: str, route: Route) -> None:
        """Serve ``route()`` at ``path`` (GET). Must be called before ``start()``."""
        if not path.startswith("/"):
            raise ValueError(f"route path must start with '/': {path!r}")
        self.routes[path] = route

    def set_verdict_source(self, source: Callable[[], NodeHealth | None]) -> None:
        """``source()`` gives the health verdict of this moment on every scrape."""
        self._verdict_source = source

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, name="http"
        )
        self._thread.daemon = True
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    # --- routes ------------------------------------------------------------------------------
    def metrics(self, *, gzipped: bool = False) -> Response:
        """/metrics: the latest snapshot and the health verdict of this moment, rendered."""
        snapshot = self.collector.latest()
        if snapshot is None:
            return _text(503, "no collection yet\n")
        verdict = self._verdict_source() if self._verdict_source is not None else None
        return 200, CONTENT_TYPE, self.renderer.exposition(snapshot, verdict, gzipped=gzipped)

    def _healthz(self) -> Response:
        if self.collector.is_alive():
            return _text(200, "ok\n")
        return _text(503, "collector thread is not running\n")

    def _readyz(self) -> Response:
        snapshot = self.collector.latest()
        if snapshot is None:
            return _text(503, "no collection yet\n")
        age = time.time() - snapshot.collected_at
        limit = READY_AFTER_INTERVALS * self.collector.interval
        if age > limit:
            return _text(503, f"newest snapshot is {age:.1f}s old (limit {limit:.1f}s)\n")
        return _text(200, "ready\n")

    def _index(self) -> Response:
        links = "".join(f'<li><a href="{p}">{p}</a></li>' for p in sorted(self.routes) if p != "/")
        page = f"<html><head><title>gpu-exporter</title></head><body><h1>gpu-exporter</h1><ul>{links}</ul></body></html>"
        return 200, "text/html; charset=utf-8", page.encode()
