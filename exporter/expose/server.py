"""The exporter's HTTP endpoint: /metrics, /healthz, /readyz and routes other parts add.

aiohttp's low-level server on one asyncio event loop in its own thread. A connection costs a
few kilobytes and no thread, so a thousand idle or slow clients cannot take a scrape's place;
two deadlines close them: a request's headers must arrive within ``header_timeout`` of its
first byte (or of the connection's opening), and a connection idle between requests longer
than ``idle_timeout`` is closed. TLS handshakes run on the loop too, bounded by
``HANDSHAKE_TIMEOUT_S``. At most ``max_connections`` are open: beyond that the oldest one not
serving a request makes room, so file descriptors never run out.

Transport only: what /metrics, /healthz and /readyz answer comes from the ScrapeSource
(exporter/expose/scrape.py: the latest snapshot, the verdict of the moment, the cached bytes
and the render thread); the server hands a scrape's bytes over and never renders, reads NVML
or joins a verdict itself.

TLS and basic auth come from an exporter-toolkit web config (exporter/expose/webconfig.py); the
certificate in force is the current one on every handshake, so rotated certificates apply
without a restart. Basic auth guards every route except /healthz and /readyz, which kubelet
probes call without credentials and which reveal nothing but "up"; its checks are timed and
throttled as exporter/expose/authguard.py says.

The probes (the scrape source's): /healthz (liveness) fails when the collect thread died or
has published no snapshot for ``liveness_timeout`` seconds (an NVML call that hangs), so the
kubelet restarts the pod; /readyz fails when the newest snapshot is older than
READY_AFTER_INTERVALS intervals.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import threading
from collections.abc import Callable
from typing import Any

# aiohttp's low-level server only: neither ``aiohttp.web`` (application, routing and
# middleware layers) nor aiohttp's client, which its package ``__init__`` would import
from gpuquota.exporter.expose.aiohttp_lowlevel import (
    BaseRequest,
    RequestHandler,
    Server,
    StreamResponse,
)
from gpuquota.exporter.expose.aiohttp_lowlevel import Response as WebResponse
from gpuquota.exporter.expose.authguard import AuthGuard, Verdict
from gpuquota.exporter.expose.render import Renderer
from gpuquota.exporter.expose.scrape import (
    READY_AFTER_INTERVALS,
    Response,
    ScrapeSource,
    Snapshots,
    default_liveness_timeout,
)
from gpuquota.exporter.expose.scrape import text as _text
from gpuquota.exporter.expose.webconfig import ReloadingWebConfig, WebConfig

log = logging.getLogger(__name__)

Route = Callable[[], Response]  # answers (status, content type, body)
__all__ = ["READY_AFTER_INTERVALS", "ExporterServer", "Route", "default_liveness_timeout"]

UNAUTHENTICATED = frozenset({"/healthz", "/readyz"})
HANDSHAKE_TIMEOUT_S = 10.0
HEADER_TIMEOUT_S = 10.0  # from a request's first byte (or the connection's start) to its headers
IDLE_TIMEOUT_S = 120.0  # longer than any sensible scrape interval, so keep-alive is kept
LISTEN_BACKLOG = 1024  # a burst of scrapers must not overflow the kernel's accept queue
MAX_CONNECTIONS = 4096  # open at once; the oldest idle one makes room for a new one
SERVER_HEADER = "gpu-exporter"  # no interpreter or library versions


def _accepts_gzip(header: str) -> bool:
    return any(part.split(";")[0].strip() == "gzip" for part in header.lower().split(","))


class _Connection(RequestHandler):
    """aiohttp's connection protocol plus the header-read deadline it lacks (it has only the
    idle one: ``keepalive_timeout``, counted from the connection's start and each response)."""

    def __init__(self, manager: Server, *, header_timeout: float, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._header_timeout = header_timeout
        self._header_deadline: asyncio.TimerHandle | None = None
        self._handling = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if data and self._header_deadline is None and not self._handling:
            self._arm()  # the first byte of a new request on a kept-alive connection
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def request_started(self) -> None:
        self._handling = True
        self._disarm()

    def request_finished(self) -> None:
        self._handling = False

    @property
    def idle(self) -> bool:
        """Not serving a request (waiting for one, or for the rest of its headers)."""
        return not self._handling

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> StreamResponse:
        # aiohttp's own answers (400 for a malformed request ...) name its and Python's version
        response = super().handle_error(request, status, exc, message)
        response.headers["Server"] = SERVER_HEADER
        return response

    def log_exception(self, *args: Any, **kw: Any) -> None:
        # a malformed request is the client's problem: one debug line, no traceback
        exc = kw.get("exc_info")
        log.debug("bad request: %s", " ".join(str(exc).split()) if exc else args)

    def _arm(self) -> None:
        self._disarm()
        self._header_deadline = self._loop.call_later(self._header_timeout, self._expired)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _expired(self) -> None:
        self._header_deadline = None
        if not self._handling:
            log.debug("closing a connection whose request headers took too long")
            self.force_close()


class _WebServer(Server):
    """Makes ``_Connection``s and keeps at most ``max_connections`` open: past that, the
    oldest connection not in the middle of a request is closed for the new one, so no number
    of held connections can use up the process's file descriptors and lock scrapers out."""

    def __init__(
        self, handler: Any, *, header_timeout: float, max_connections: int, **kwargs: Any
    ) -> None:
        super().__init__(handler, **kwargs)
        self._header_timeout = header_timeout
        self._max_connections = max_connections
        self._open = 0  # connections not yet lost (aiohttp's own map keeps closing ones a while)
        self.evicted = 0

    def __call__(self) -> RequestHandler:
        return _Connection(
            self, loop=self._loop, header_timeout=self._header_timeout, **self._kwargs
        )

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        self._open += 1
        if self._open <= self._max_connections:
            return
        for oldest in self._connections:  # insertion order: the oldest first
            if (
                oldest is not handler
                and isinstance(oldest, _Connection)
                and oldest.idle
                and oldest.transport is not None  # not closing already
            ):
                oldest.force_close()
                self.evicted += 1
                return

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        self._open -= 1
        super().connection_lost(handler, exc)


class ExporterServer:
    """Serves the collector's snapshots; ``add_route`` lets other parts add endpoints."""

    def __init__(
        self,
        snapshots: Snapshots,
        renderer: Renderer,
        *,
        host: str = "",
        port: int = 9400,
        web_config: WebConfig | ReloadingWebConfig | None = None,
        liveness_timeout: float | None = None,
        header_timeout: float = HEADER_TIMEOUT_S,
        idle_timeout: float = IDLE_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        # everything a scrape answers comes from here; the server only carries the bytes
        self.source = ScrapeSource(snapshots, renderer, liveness_timeout=liveness_timeout)
        self._web_config = web_config
        self.header_timeout = header_timeout
        self.idle_timeout = idle_timeout
        self.max_connections = max_connections
        self.routes: dict[str, Route] = {
            "/": self._index,
            "/metrics": self.source.metrics,
            "/healthz": self.source.healthz,
            "/readyz": self.source.readyz,
        }
        self._guard = AuthGuard()
        # Binding here (not in start) makes "port in use" an error at construction.
        self._socket = _listen(host, port)
        initial = self.web_config
        self._ssl_context = _rotating_context(self) if initial and initial.ssl_context else None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._web_server: _WebServer | None = None
        self._listener: asyncio.Server | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._socket.getsockname()[:2]
        return str(host), int(port)

    @property
    def web_config(self) -> WebConfig | None:
        """The web config in force now (a reloading one is re-read when its files change)."""
        source = self._web_config
        return source.current() if isinstance(source, ReloadingWebConfig) else source

    @property
    def scheme(self) -> str:
        return "https" if self._ssl_context is not None else "http"

    def add_route(self, path: str, route: Route) -> None:
        """Serve ``route()`` at ``path`` (GET and HEAD). Must be called before ``start()``."""
        if not path.startswith("/"):
            raise ValueError(f"route path must start with '/': {path!r}")
        self.routes[path] = route

    def start(self) -> None:
        """Serve from a thread of its own; returns once the socket accepts connections."""
        loop = asyncio.new_event_loop()
        started = threading.Event()
        failed: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._open())
            except BaseException as exc:
                failed.append(exc)
                started.set()
                loop.close()
                return
            started.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self._close())
                loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=run, name="http", daemon=True)
        self._thread.start()
        started.wait()
        if failed:
            self._thread.join()
            self._thread = None
            raise failed[0]

    def stop(self) -> None:
        if self._thread is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            self._thread = None
        else:
            self._socket.close()
        self._guard.close()
        self.source.close()

    async def _open(self) -> None:
        self._web_server = _WebServer(
            self._handle,
            header_timeout=self.header_timeout,
            max_connections=self.max_connections,
            keepalive_timeout=self.idle_timeout,
            access_log=None,
            handler_cancellation=True,
        )
        self._listener = await asyncio.get_running_loop().create_server(
            self._web_server,
            sock=self._socket,
            ssl=self._ssl_context,
            ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S if self._ssl_context else None,
            backlog=LISTEN_BACKLOG,
        )

    async def _close(self) -> None:
        if self._listener is not None:
            self._listener.close()
        if self._web_server is not None:
            # a scraper's kept-alive connection waiting for its next request has nothing to
            # finish: closed now, not after the grace that in-flight scrapes get (it held
            # every stop for the whole second)
            for connection in list(self._web_server.connections):
                if isinstance(connection, _Connection) and connection.idle:
                    connection.force_close()
            await self._web_server.shutdown(1.0)
        if self._listener is not None:
            await self._listener.wait_closed()

    # --- requests ----------------------------------------------------------------------------
    async def _handle(self, request: BaseRequest) -> StreamResponse:
        connection = request.protocol
        if isinstance(connection, _Connection):
            connection.request_started()
        try:
            return await self._respond(request)
        finally:
            if isinstance(connection, _Connection):
                connection.request_finished()

    async def _respond(self, request: BaseRequest) -> StreamResponse:
        if request.method not in ("GET", "HEAD"):
            return self._response(
                *_text(405, f"{request.method} not allowed\n"), {"Allow": "GET, HEAD"}
            )
        path = request.path
        config = self.web_config
        if config is not None and config.users and path not in UNAUTHENTICATED:
            address = request.remote or ""
            verdict = await self._guard.check(config, request.headers.get("Authorization"), address)
            if verdict is Verdict.DENIED:
                return self._response(
                    *_text(401, "Unauthorized\n"),
                    {"WWW-Authenticate": 'Basic realm="gpu-exporter"'},
                )
            if verdict is Verdict.THROTTLED:
                return self._response(
                    *_text(429, "too many failed authentication attempts; try again later\n"),
                    {"Retry-After": str(self._guard.retry_after(address))},
                )
        route = self.routes.get(path)
        if route is None:
            return self._response(*_text(404, f"{path} not found\n"))
        if route == self.source.metrics:
            gzipped = _accepts_gzip(request.headers.get("Accept-Encoding", ""))
            status, content_type, body = await self.source.scrape(gzipped)
            extra = {"Content-Encoding": "gzip"} if status == 200 and gzipped else None
            return self._response(status, content_type, body, extra)
        try:
            status, content_type, body = route()
        except Exception:
            log.exception("route %s failed", path)
            status, content_type, body = _text(500, "internal error\n")
        return self._response(status, content_type, body)

    def _response(
        self, status: int, content_type: str, body: bytes, extra: dict[str, str] | None = None
    ) -> WebResponse:
        config = self.web_config
        headers = {
            **(config.headers if config else {}),
            "Content-Type": content_type,
            "Server": SERVER_HEADER,
            **(extra or {}),
        }
        return WebResponse(status=status, body=body, headers=headers)

    # --- routes ------------------------------------------------------------------------------
    def _index(self) -> Response:
        links = "".join(f'<li><a href="{p}">{p}</a></li>' for p in sorted(self.routes) if p != "/")
        page = f"<html><head><title>gpu-exporter</title></head><body><h1>gpu-exporter</h1><ul>{links}</ul></body></html>"
        return 200, "text/html; charset=utf-8", page.encode()


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def _rotating_context(server: ExporterServer) -> ssl.SSLContext:
    """The listening socket's TLS context: on every ClientHello it hands the handshake to the
    web config's current context, so a reloaded certificate applies to new connections."""
    config = server.web_config
    assert config is not None and config.ssl_context is not None
    first = config.ssl_context

    def pick(ssl_object: ssl.SSLObject, _name: str | None, _context: ssl.SSLContext) -> None:
        current = server.web_config
        if current is not None and current.ssl_context is not None:
            ssl_object.context = current.ssl_context

    first.sni_callback = pick  # also called without SNI (then with name None)
    return first
