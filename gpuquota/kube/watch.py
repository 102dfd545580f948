"""One list+watch loop per kind, in its own thread, feeding a queue its consumer drains.

Both programs use it: the controller for every kind it accounts, the exporter for its node's
ResourceSlices (exporter/enrich/slicewatcher.py). What the loop counts goes to a :class:`WatchMetrics`
the caller passes in (the controller's Prometheus counters; nothing for the exporter), so this
package imports nothing from either program.

The rules, from what a real kube-apiserver does (docs/architecture.md, "watch"):

- **Silence is normal.** A quiet kind gets no event and no BOOKMARK for minutes. A dead
  connection is found by TCP keepalive (gpuquota/kube/client.py) and by the server ending each
  watch at ``timeoutSeconds``, after which the loop watches again from its last
  resourceVersion. The client read timeout is only a last resort, above ``timeoutSeconds``.
- **A resourceVersion is opaque**: stored, sent back, never compared. One the server never
  handed out ("Too large resource version", e.g. stored before an etcd restore) is treated
  like 410 Gone: relist. A real server answers a watch from such a version with silence until
  ``timeoutSeconds``, so a resumed watch that ended without a single line is proven only once
  the server says it reached the version (``Kube.reached``: a consistent list, then a list
  NotOlderThan it, and where that says "too large", one at exactly it).
- **Current means proven.** A kind is *current* once a list of it completed, or, when resuming
  from a stored version after a restart, once the resumed watch ended cleanly at its (short,
  :attr:`Timeouts.proof`) ``timeoutSeconds`` without 410 Gone: the server then replayed
  everything since the stored version. An event of the replay proves only that the version is
  still served, not that the replay is complete. Until then, and from a 410 until the relist
  that follows it is queued, the kind is not current.
- **Ignored objects move the version too.** The consumer stores the kind's version with its
  heartbeat; events of objects it ignores (pods without GPUs) reach it as BOOKMARKs carrying
  only their version, so a restart does not replay them.
- **Gaps are facts.** A relist that follows a 410 (or a first list after a restart) cannot
  know what came and went in between: its :class:`Resync` carries ``gap_from``, the last time
  the kind was known current, and the consumer records the span.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from urllib3.exceptions import HTTPError, ReadTimeoutError

from gpuquota.kube.backoff import Backoff
from gpuquota.kube.client import ApiStatusError, Kube, Obj
from gpuquota.kube.messages import Event, Listed, Message, Resync, put

log = logging.getLogger(__name__)


class WatchMetrics(Protocol):
    """What a loop reports; the controller counts it, the exporter need not."""

    def event(self, kind: str, event_type: str) -> None:
        """A watch event dropped on arrival (the consumer counts those it applies)."""

    def ignored(self, kind: str) -> None:
        """An object dropped on arrival because the consumer ignores it."""

    def restart(self, kind: str, reason: str) -> None:
        """A watch request ended: ``timeout`` (the server's), ``stalled`` (the client's last
        resort read timeout), ``error``."""

    def relist(self, kind: str) -> None:
        """A full list after the first one (410 Gone)."""


class NoMetrics:
    """A :class:`WatchMetrics` that counts nothing."""

    def event(self, kind: str, event_type: str) -> None:
        pass

    def ignored(self, kind: str) -> None:
        pass

    def restart(self, kind: str, reason: str) -> None:
        pass

    def relist(self, kind: str) -> None:
        pass


class GoneError(Exception):
    """The watch's resourceVersion cannot be resumed from: relist. Its text says why (410
    Gone: compacted; or a version the server has not reached)."""


def _wall() -> int:
    return int(time.time())


class WatchLoop(threading.Thread):
    """List (or resume) then watch ``kind``, forever, handing messages to ``out``.

    ``resume_from``: a stored resourceVersion to resume from (after a restart); ``known_at``:
    when the consumer last knew the cluster (its heartbeat), where a gap after a restart
    starts. ``keep`` drops objects the consumer ignores (pods without GPUs) on arrival.
    """

    def __init__(
        self,
        kind: str,
        kube: Kube,
        out: queue.Queue[Message],
        stop: threading.Event,
        metrics: WatchMetrics | None = None,
        resume_from: str | None = None,
        keep: Callable[[Obj], bool] | None = None,
        known_at: int | None = None,
        clock: Callable[[], int] = _wall,
    ):
        super().__init__(name=f"watch-{kind}", daemon=True)
        self.kind, self.kube, self.out, self.stop_event = kind, kube, out, stop
        self.metrics: WatchMetrics = metrics or NoMetrics()
        self.resume_from = resume_from
        self.keep = keep  # objects the accounting ignores (pods without GPUs) stop here
        self.known_at = known_at
        self.clock = clock
        # a pod's requests never change: decide once per UID, not on every event
        self._kept: dict[str, bool] = {}
        self.started = threading.Event()  # listed, or resuming: the next kind may start
        self.current = threading.Event()  # proven current (see the module docstring)
        # a watch request is open, or about to be opened after a list or a clean end; False
        # from a failed request until the next one is accepted
        self.open = False
        self.version: str | None = None
        self.last_error: str | None = None
        self.backoff = Backoff()
        self._resuming = False  # watching from a stored version not yet proven
        # the last time the kind was known current: where a gap found by a 410 starts
        self.confirmed_at: int | None = None
        self._unsent: str | None = None  # the version of ignored events not yet sent on
        self._version_sent_at = 0

    @property
    def healthy(self) -> bool:
        """Current, and its watch open: what lets the consumer say it knows the present."""
        return self.current.is_set() and self.open

    def _initial(self) -> None:
        """List (or resume): sets self.version."""
        if self.resume_from:
            if self.kind != "Pod":
                # facts of nodes/namespaces/quotas are needed now; vanished ones are closed
                # by the replayed DELETED events, not estimated
                items, _ = self.kube.list(self.kind, self._listed if self.keep else None)
                put(self.out, Listed(self.kind, self.clock(), items), self.stop_event)
            self.version, self.resume_from = self.resume_from, None
            self._resuming = True
            log.info("%s: resuming the watch from stored version %s", self.kind, self.version)
        else:
            if self.started.is_set():
                self.metrics.relist(self.kind)
            # the kind was not followed since: a gap, unless nothing was known before
            gap_from = self.confirmed_at if self.confirmed_at is not None else self.known_at
            self._kept.clear()
            listed_at = self.clock()  # a list is a snapshot of its start
            items, version = self.kube.list(self.kind, self._listed if self.keep else None)
            put(
                self.out,
                Resync(self.kind, listed_at, items, version, gap_from),
                self.stop_event,
            )
            self.version = version
            self._resuming = False
            self._proven(listed_at)
            log.info("%s: listed %d at version %s", self.kind, len(items), version)
        # the watch follows at once: between the list and the server accepting it (queued on
        # a busy server) the kind is current, not down (the exporter's dra_slices_up read 0
        # in that window on a loaded machine)
        self.open = True
        self.started.set()

    def _proven(self, at: int) -> None:
        self.confirmed_at = at
        if not self.current.is_set():
            self.current.set()

    def _keeps(self, etype: str, obj: Obj) -> bool:
        assert self.keep is not None
        uid = (obj.get("metadata") or {}).get("uid")
        if not isinstance(uid, str):
            return self.keep(obj)
        kept = self._kept.get(uid)
        if kept is None:
            kept = self._kept[uid] = self.keep(obj)
        if etype == "DELETED":
            del self._kept[uid]
        return kept

    def _listed(self, obj: Obj) -> bool:
        return self._keeps("ADDED", obj)

    def _gone(self, why: str = "is gone (410)") -> None:
        log.info("%s: version %s %s: relisting", self.kind, self.version, why)
        if self._resuming:
            # never proven since the restart: nothing is known after the stored heartbeat
            self.confirmed_at = None
        self.current.clear()
        self.open = False
        self.version, self.resume_from, self._resuming = None, None, False

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                if self.version is None:
                    self._initial()
                self._watch_once()
                self.metrics.restart(self.kind, "timeout")
            except GoneError as exc:
                self._gone(str(exc) or "is gone (410)")
            except ReadTimeoutError:
                # the server neither sent nor ended the watch at timeoutSeconds: a dead
                # connection keepalive did not catch; watch again from the last version
                self.open = False
                log.warning("%s: watch not ended by the server in time: re-watching", self.kind)
                self.metrics.restart(self.kind, "stalled")
            except _retried_errors() as exc:
                self.open = False
                if isinstance(exc, (ApiStatusError, *_official_errors())):
                    if "too large resource version" in str(exc).lower():
                        self._gone("is one the server has not reached")
                    elif getattr(exc, "status", None) == 410:
                        self._gone()
                self.last_error = _describe(exc)
                delay = self.backoff.next()
                log.warning("%s: %s; retrying in %.1fs", self.kind, self.last_error, delay)
                self.metrics.restart(self.kind, "error")
                self.stop_event.wait(delay)

    def _ignored_version(self, now: int, version: Any) -> None:
        """An ignored object's version still moves the kind's: the consumer stores it (a
        restart resumes from there instead of replaying, or getting 410 Gone for, events it
        ignores). Sent as a BOOKMARK at most once a second, the rest with the next one, the
        next kept event or the watch's end, so ignoring stays cheap."""
        if not version:
            return
        self._unsent = str(version)
        if now - self._version_sent_at >= 1:
            self._send_version(now)

    def _send_version(self, now: int) -> None:
        if self._unsent is None:
            return
        marker = {"kind": self.kind, "metadata": {"resourceVersion": self._unsent}}
        put(self.out, Event(self.kind, now, "BOOKMARK", marker), self.stop_event)
        self._unsent, self._version_sent_at = None, now

    def _opened(self) -> None:
        # accepted, which proves nothing yet: a 410 comes as the stream's first line
        self.open = True
        self.backoff.reset()

    def _watch_once(self) -> None:
        assert self.version is not None
        # a resumed watch asks for a short timeoutSeconds: ending cleanly proves it current
        proving = self._resuming
        timeouts = self.kube.timeouts
        timeout = min(timeouts.proof, timeouts.watch) if proving else None
        delivered = False
        for event in self.kube.watch(self.kind, self.version, self._opened, timeout):
            if self.stop_event.is_set():
                return
            delivered = True
            etype = event.get("type")
            obj: Any = event.get("object")
            if etype == "ERROR":
                if isinstance(obj, dict) and _too_large(obj):
                    raise GoneError("is one the server has not reached")
                if isinstance(obj, dict) and obj.get("code") == 410:
                    raise GoneError()
                raise ValueError(
                    f"watch error: {obj.get('message') if isinstance(obj, dict) else obj}"
                )
            if not isinstance(obj, dict):
                continue
            version = (obj.get("metadata") or {}).get("resourceVersion")
            if version:
                self.version = str(version)
            now = self.clock()
            # a resumed watch's events are its replay: one proves the stored version is still
            # served, not that the replay is complete (a heartbeat written then, before the
            # rest is applied, would close a pod deleted later in the replay after its end);
            # only the watch's clean end proves it (below)
            if not self._resuming:
                self._proven(now)
            if etype != "BOOKMARK" and self.keep is not None and not self._keeps(str(etype), obj):
                self.metrics.event(self.kind, str(etype))
                self.metrics.ignored(self.kind)
                self._ignored_version(now, version)
                continue
            self._unsent = None
            put(self.out, Event(self.kind, now, str(etype), obj), self.stop_event)
        if self.stop_event.is_set():
            return
        self._send_version(self.clock())
        # the server ended the watch (timeoutSeconds): everything up to now was delivered,
        # unless it said nothing at all because the stored version is one it has not handed
        # out (an etcd restore): a real server answers that with silence, not an error
        if self._resuming and not delivered and not self.kube.reached(self.kind, self.version):
            log.warning(
                "%s: the server has not reached the stored version %s (restored?): relisting",
                self.kind,
                self.version,
            )
            raise GoneError("is one the server has not reached")
        if self._resuming:
            self._resuming = False
            log.info("%s: the resumed watch is current (ended without 410)", self.kind)
        self._proven(self.clock())


def _too_large(status: Obj) -> bool:
    """A version the server never handed out (stored from before an etcd restore, or from
    another server): like 410 Gone, only a relist recovers."""
    return "too large resource version" in str(status.get("message", "")).lower()


def _retried_errors() -> tuple[type[BaseException], ...]:
    """What a watch loop retries after: transport errors, error statuses, bad answers."""
    return (HTTPError, ApiStatusError, OSError, ValueError, *_official_errors())


def _official_errors() -> tuple[type[BaseException], ...]:
    """The official client's ApiException where that client is in use (the controller): it is
    imported only there, and where it is not loaded nothing can raise it (gpu-exporter talks
    through gpuquota.kube.rest and never loads it)."""
    module = sys.modules.get("kubernetes.client.exceptions")
    official: tuple[type[BaseException], ...] = (module.ApiException,) if module is not None else ()
    return official


def _describe(exc: BaseException) -> str:
    if isinstance(exc, _official_errors()):
        return f"API server answered {getattr(exc, 'status', '?')} {getattr(exc, 'reason', '')}"
    reason = getattr(exc, "reason", None)
    text = str(reason or exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]
