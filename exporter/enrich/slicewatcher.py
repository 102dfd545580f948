"""Keeps this node's ResourceSlices (exporter/enrich/slices.py's index) in step with the API.

:class:`SliceWatcher` feeds the index from the API server with the shared list+watch loop
(gpuquota/kube/watch.py: relist on 410 Gone, a quiet watch is normal, back-off),
field-selected to this node (``spec.nodeName=<node>``). Without RBAC access (403) or on a
cluster that does not serve resource.k8s.io/v1 (404) it says so once, keeps trying quietly
every few minutes, and the exporter keeps its device-plugin attribution.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from typing import Any, cast

from gpuquota.exporter.enrich.slices import KIND, KINDS, Obj, SliceIndex, apply_message
from gpuquota.kube.messages import Message

log = logging.getLogger(__name__)


class SliceWatcher:
    """Keeps a :class:`SliceIndex` in step with this node's ResourceSlices, in the background.

    ``kube`` is a gpuquota.kube.client.Kube whose field selector for ResourceSlice names this
    node; the list+watch itself is the shared WatchLoop (gpuquota/kube/watch.py).
    """

    def __init__(
        self,
        kube: Any,
        index: SliceIndex,
        node_name: str,
        retry_s: float = 300.0,
        asked_for: bool = True,
        transient_retry_s: float = 5.0,
    ) -> None:
        self.kube = kube
        # asked for (--dra on): a missing grant is a warning; auto: only information
        self.asked_for = asked_for
        self.index = index
        self.node_name = node_name
        self.retry_s = retry_s  # after a 401/403/404: no grant or no API, rarely fixed soon
        self.transient_retry_s = transient_retry_s  # after an unreachable API server
        self.available: bool | None = None  # None: not known yet; False: no access / API
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: Any = None
        # the watch loop's messages; None (put by stop) only wakes the reader
        self._out: queue.Queue[Message | None] = queue.Queue(maxsize=1000)
        self._failing = False
        self.kind = KIND

    @property
    def up(self) -> bool:
        """True while the slices are listed and the watch on them works."""
        loop = self._loop
        # between the first list and the watch loop's own first list, the list counts
        return bool(self.available and (loop is None or not loop.started.is_set() or loop.healthy))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="dra-slices", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(queue.Full):
            self._out.put_nowait(None)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _probe(self) -> bool:
        """One list: True when the slices can be read; says once why not."""
        from urllib3.exceptions import HTTPError

        from gpuquota.kube.client import ApiStatusError

        try:
            items = self._list_newest()
        except ApiStatusError as exc:
            if exc.status in (401, 403, 404):
                if self.available is not False:
                    why = (
                        "the API server serves no resource.k8s.io ResourceSlices (v1, v1beta2)"
                        if exc.status == 404
                        else "no RBAC access to list resource.k8s.io resourceslices "
                        "(deploy/components/dra grants it)"
                    )
                    (log.warning if self.asked_for else log.info)(
                        "DRA attribution is off: %s (%s); device-plugin attribution continues, "
                        "checking again every %.0fs",
                        why,
                        exc,
                        self.retry_s,
                    )
                self.available = False
                return False
            raise
        except (HTTPError, OSError) as exc:
            self._transient(exc)
            return False
        self.index.replace_all(items)
        self._failing = False
        if self.available is False:
            log.info("ResourceSlices are readable now: DRA attribution on")
        self.available = True
        return True

    def _list_newest(self) -> list[Obj]:
        """List through the newest slice API served; sets ``self.kind``."""
        from gpuquota.kube.client import ApiStatusError

        for kind in KINDS:
            try:
                items, _ = self.kube.list(kind)
            except ApiStatusError as exc:
                if exc.status == 404 and kind != KINDS[-1]:
                    continue  # an older cluster: try the older version
                raise
            if kind != self.kind:
                log.info("following ResourceSlices through %s", kind)
            self.kind = kind
            return list(items)
        raise AssertionError("unreachable")

    def _transient(self, exc: Exception) -> None:
        """An API server that cannot be reached (yet): said once per streak, then retried."""
        (log.debug if self._failing else log.warning)(
            "cannot list ResourceSlices yet (%s); retrying every few seconds", exc
        )
        self._failing = True

    def _run(self) -> None:
        from gpuquota.kube.watch import WatchLoop

        while not self._stop.is_set():
            try:
                if self._probe():
                    break
            except Exception as exc:  # an unexpected answer: keep the exporter running
                self._transient(exc)
            wait = self.retry_s if self.available is False else self.transient_retry_s
            if self._stop.wait(wait):
                return
        log.info(
            "following the ResourceSlices of node %s: %d GPU device(s) from %s",
            self.node_name,
            len(self.index.devices()),
            ", ".join(sorted(self.index.drivers)),
        )
        # a daemon thread, not joined: a quiet watch blocks it in a read for minutes, and it
        # must never hold the exporter's shutdown
        feed = cast("queue.Queue[Message]", self._out)  # the loop puts only messages in
        self._loop = WatchLoop(self.kind, self.kube, feed, self._stop)
        self._loop.start()
        while not self._stop.is_set():
            msg = self._out.get()
            if msg is not None:
                apply_message(self.index, msg)
