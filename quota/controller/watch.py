"""One list+watch loop per kind, in its own thread, feeding a queue the controller drains.

A loop lists (paged, raw JSON), then watches from the list's resourceVersion with bookmarks;
it resumes from the last version it saw when a watch ends, is cut, or stays silent past the
client read timeout (a stalled connection), and relists on 410 Gone. Errors back off
exponentially with jitter. Given a stored version (from the controller's heartbeat), the first
watch resumes from it instead, so events missed while the controller was down are replayed.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError, ReadTimeoutError

from gpuquota.kube.backoff import Backoff
from gpuquota.kube.client import ApiStatusError, Kube, Obj
from gpuquota.kube.messages import Event, Listed, Message, Resync, put
from gpuquota.quota.controller.metrics import ControllerMetrics

log = logging.getLogger(__name__)


class GoneError(Exception):
    pass


class WatchLoop(threading.Thread):
    def __init__(
        self,
        kind: str,
        kube: Kube,
        out: queue.Queue[Message],
        metrics: ControllerMetrics,
        stop: threading.Event,
        resume_from: str | None = None,
        keep: Callable[[Obj], bool] | None = None,
    ):
        super().__init__(name=f"watch-{kind}", daemon=True)
        self.kind, self.kube, self.out, self.metrics, self.stop_event = (
            kind,
            kube,
            out,
            metrics,
            stop,
        )
        self.resume_from = resume_from
        self.keep = keep  # objects the accounting ignores (pods without GPUs) stop here
        # a pod's requests never change: decide once per UID, not on every event
        self._kept: dict[str, bool] = {}
        self.synced = threading.Event()
        self.version: str | None = None
        self.last_activity = 0.0
        self.last_error: str | None = None
        self.healthy = False
        self.backoff = Backoff()

    def _now(self) -> int:
        return int(time.time())

    def _initial(self) -> None:
        """List (or resume): sets self.version."""
        if self.resume_from:
            if self.kind != "Pod":
                # facts of nodes/namespaces/quotas are needed now; vanished ones are closed
                # by the replayed DELETED events, not estimated
                items, _ = self.kube.list(self.kind, self._listed if self.keep else None)
                put(self.out, Listed(self.kind, self._now(), items), self.stop_event)
            self.version, self.resume_from = self.resume_from, None
            log.info("%s: resuming the watch from stored version %s", self.kind, self.version)
        else:
            if self.synced.is_set():
                self.metrics.relists.labels(self.kind).inc()
            self._kept.clear()
            items, version = self.kube.list(self.kind, self._listed if self.keep else None)
            put(
                self.out,
                Resync(self.kind, self._now(), items, version),
                self.stop_event,
            )
            self.version = version
            log.info("%s: listed %d at version %s", self.kind, len(items), version)
        self.healthy = True
        self.last_activity = time.monotonic()
        self.synced.set()

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

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                if self.version is None:
                    self._initial()
                self._watch_once()
                self.metrics.watch_restarts.labels(self.kind, "timeout").inc()
            except GoneError:
                log.info("%s: version %s is gone (410): relisting", self.kind, self.version)
                self.version = None
                self.resume_from = None
            except ReadTimeoutError:
                self.healthy = False
                log.warning("%s: watch silent past the read timeout: restarting it", self.kind)
                self.metrics.watch_restarts.labels(self.kind, "stalled").inc()
            except (HTTPError, ApiException, ApiStatusError, OSError, ValueError) as exc:
                self.healthy = False
                if isinstance(exc, ApiException | ApiStatusError) and exc.status == 410:
                    self.version, self.resume_from = None, None
                self.last_error = _describe(exc)
                delay = self.backoff.next()
                log.warning("%s: %s; retrying in %.1fs", self.kind, self.last_error, delay)
                self.metrics.watch_restarts.labels(self.kind, "error").inc()
                self.stop_event.wait(delay)

    def _watch_once(self) -> None:
        assert self.version is not None
        for event in self.kube.watch(self.kind, self.version):
            if self.stop_event.is_set():
                return
            etype = event.get("type")
            obj: Any = event.get("object")
            if etype == "ERROR":
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
            self.last_activity = time.monotonic()
            self.healthy = True
            self.backoff.reset()
            if etype != "BOOKMARK" and self.keep is not None and not self._keeps(str(etype), obj):
                self.metrics.events.labels(self.kind, str(etype)).inc()
                self.metrics.ignored.labels(self.kind).inc()
                continue
            put(
                self.out,
                Event(self.kind, self._now(), str(etype), obj),
                self.stop_event,
            )


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        return f"API server answered {exc.status} {exc.reason}"
    reason = getattr(exc, "reason", None)
    text = str(reason or exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]
