"""What answers a scrape: the latest snapshot, the health verdict of the moment, the bytes.

``ScrapeSource`` owns the join the HTTP server must not make: it reads the collect loop's
latest snapshot, the verdict source and the publishers' state source (exporter/health/
publishing.py), asks the Renderer for the bytes (cached per snapshot identity, verdict
generation, publishers' state and encoding) and decides where a render runs: in its ``render``
worker thread when a scrape finds no bytes (concurrent scrapes of one snapshot share that one
render; the event loop never renders), or ahead in the collect thread, in the encodings
scraped since the previous snapshot, so a steady scraper finds its bytes ready while an
unscraped exporter renders nothing. It also answers the probes (/healthz, /readyz) from the
same loop. exporter/expose/server.py only carries its answers over HTTP.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from gpuquota.exporter.expose.render import CONTENT_TYPE, Renderer
from gpuquota.exporter.health.publishing import PublisherStatus
from gpuquota.exporter.health.verdict import NodeHealth
from gpuquota.exporter.snapshot import NodeSnapshot

log = logging.getLogger(__name__)

# A route answers (status, content type, body).
Response = tuple[int, str, bytes]
RenderKey = tuple[int, int | None, bool]  # id(snapshot), verdict generation, gzipped

READY_AFTER_INTERVALS = 3  # /readyz fails when the newest snapshot is older than this
LIVENESS_INTERVALS = 10  # default: /healthz fails after this many intervals without progress
LIVENESS_MIN_S = 10.0  # ... but never sooner than this (a short interval is no reason to die)


class Snapshots(Protocol):
    """What the collect loop (exporter/collect/loop.py) offers a scrape."""

    @property
    def interval(self) -> float: ...
    def latest(self) -> NodeSnapshot | None: ...
    def subscribe(self, callback: Callable[[NodeSnapshot], None]) -> None: ...
    def is_alive(self) -> bool: ...


def default_liveness_timeout(interval: float) -> float:
    return max(LIVENESS_INTERVALS * interval, LIVENESS_MIN_S)


def text(status: int, body: str) -> Response:
    return status, "text/plain; charset=utf-8", body.encode()


class ScrapeSource:
    """The answers to /metrics, /healthz and /readyz, from the latest snapshot and verdict."""

    def __init__(
        self,
        snapshots: Snapshots,
        renderer: Renderer,
        *,
        liveness_timeout: float | None = None,
    ) -> None:
        self.snapshots = snapshots
        self.renderer = renderer
        self.liveness_timeout = (
            liveness_timeout
            if liveness_timeout is not None
            else default_liveness_timeout(snapshots.interval)
        )
        # The health verdict rendered beside the latest snapshot (None: no health checking).
        self._verdict_source: Callable[[], NodeHealth | None] | None = None
        # The publishers' own state, read on every scrape (None: no source, no such rows).
        self._publisher_source: Callable[[], PublisherStatus] | None = None
        self._created = time.time()
        # The encodings (gzipped or not) scraped since the last snapshot: rendered ahead next.
        self._wanted: set[bool] = set()
        # One render thread: the event loop only hands bytes over. Renders in flight, by key,
        # are touched only on the event loop: concurrent scrapes await the same one.
        self._render_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="render")
        # Keyed by the snapshot's id (snapshots are unhashable) with the snapshot kept beside it.
        self._rendering: dict[RenderKey, tuple[NodeSnapshot, Future[bytes]]] = {}
        snapshots.subscribe(self._render_ahead)

    def set_verdict_source(self, source: Callable[[], NodeHealth | None]) -> None:
        """``source()`` gives the health verdict of this moment on every scrape."""
        self._verdict_source = source

    def set_publisher_source(self, source: Callable[[], PublisherStatus]) -> None:
        """``source()`` gives the verdict's publishers' own state on every scrape."""
        self._publisher_source = source

    def _publishers(self) -> PublisherStatus | None:
        return self._publisher_source() if self._publisher_source is not None else None

    def close(self) -> None:
        self._render_pool.shutdown(wait=False, cancel_futures=True)

    def _verdict(self) -> NodeHealth | None:
        return self._verdict_source() if self._verdict_source is not None else None

    # --- /metrics ----------------------------------------------------------------------------
    def metrics(self, *, gzipped: bool = False) -> Response:
        """/metrics: the latest snapshot and the health verdict of this moment, rendered in
        the calling thread (the server itself scrapes through ``scrape``)."""
        snapshot = self.snapshots.latest()
        if snapshot is None:
            return text(503, "no collection yet\n")
        return (
            200,
            CONTENT_TYPE,
            self.renderer.exposition(
                snapshot, self._verdict(), gzipped=gzipped, publishers=self._publishers()
            ),
        )

    async def scrape(self, gzipped: bool) -> Response:
        """/metrics on the event loop: the cached bytes, or a render in the render thread
        shared by every scrape of the same snapshot, verdict and encoding."""
        snapshot = self.snapshots.latest()
        if snapshot is None:
            return text(503, "no collection yet\n")
        self._wanted.add(gzipped)
        verdict = self._verdict()
        publishers = self._publishers()
        body = self.renderer.peek(snapshot, verdict, gzipped=gzipped, publishers=publishers)
        if body is None:
            # a render of this snapshot and verdict already under way is shared even when the
            # publishers' state changed meanwhile: it is the state of a moment before
            key = (id(snapshot), verdict.generation if verdict is not None else None, gzipped)
            inflight = self._rendering.get(key)
            if inflight is not None and inflight[0] is snapshot:
                pending = inflight[1]
            else:
                pending = self._render_pool.submit(
                    self.renderer.exposition,
                    snapshot,
                    verdict,
                    gzipped=gzipped,
                    publishers=publishers,
                )
                self._rendering[key] = (snapshot, pending)
                loop = asyncio.get_running_loop()
                pending.add_done_callback(lambda _done: self._forget(loop, key))
            try:
                body = await asyncio.wrap_future(pending)
            except Exception:
                log.exception("rendering /metrics failed")
                return text(500, "internal error\n")
        return 200, CONTENT_TYPE, body

    def _forget(self, loop: asyncio.AbstractEventLoop, key: RenderKey) -> None:
        """A render finished (in the render thread): drop it from the map on the loop."""
        if not loop.is_closed():
            loop.call_soon_threadsafe(self._rendering.pop, key, None)

    def _render_ahead(self, snapshot: NodeSnapshot) -> None:
        """Collect loop subscriber (collect thread): render the new snapshot in the encodings
        scraped since the previous one, so a steady scraper finds its bytes ready."""
        wanted, self._wanted = self._wanted, set()
        if not wanted:
            return
        verdict, publishers = self._verdict(), self._publishers()
        for gzipped in sorted(wanted):
            self.renderer.exposition(snapshot, verdict, gzipped=gzipped, publishers=publishers)

    # --- probes ------------------------------------------------------------------------------
    def healthz(self) -> Response:
        if not self.snapshots.is_alive():
            return text(503, "collector thread is not running\n")
        snapshot = self.snapshots.latest()
        since = snapshot.collected_at if snapshot is not None else self._created
        stalled = time.time() - since
        if stalled > self.liveness_timeout:
            return text(
                503,
                f"collector made no progress for {stalled:.1f}s "
                f"(limit {self.liveness_timeout:.1f}s): an NVML call may hang\n",
            )
        return text(200, "ok\n")

    def readyz(self) -> Response:
        snapshot = self.snapshots.latest()
        if snapshot is None:
            return text(503, "no collection yet\n")
        age = time.time() - snapshot.collected_at
        limit = READY_AFTER_INTERVALS * self.snapshots.interval
        if age > limit:
            return text(503, f"newest snapshot is {age:.1f}s old (limit {limit:.1f}s)\n")
        # a device plugin not registered yet is not ready: a surge rollout removes the agent
        # it replaces only once this one is ready, and the GPUs must be served meanwhile
        publishers = self._publishers()
        if publishers is not None and publishers.device_plugin:
            missing = sorted(r for r, ok in publishers.device_plugin.items() if not ok)
            if missing:
                return text(503, f"device plugin not registered with the kubelet: {', '.join(missing)}\n")  # fmt: skip
        return text(200, "ready\n")
