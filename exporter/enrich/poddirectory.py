"""The pods on this node by UID, listed from the API server in a background thread.

``lister_for_node`` is the one API call (pods by ``spec.nodeName``: what the pod-usage RBAC
overlay grants); ``PodDirectory`` keeps the answer fresh and turns it into names through
exporter/enrich/podnames.py.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from gpuquota.exporter.enrich.podnames import PodName, pod_names

log = logging.getLogger(__name__)

PodLister = Callable[[], Iterable[dict[str, Any]]]  # this node's pods, as the API's JSON


def lister_for_node(kube: Any, node_name: str) -> PodLister:
    """Lists the pods bound to `node_name` through a gpuquota.kube.client.Kube: plain JSON,
    not the official client's generated models (loading those alone costs the agent some
    20 MB: docs/benchmarks.md, "The node agent's memory")."""

    def pods() -> Iterable[dict[str, Any]]:
        answer = kube.call("GET", "/api/v1/pods", [("fieldSelector", f"spec.nodeName={node_name}")])
        return [p for p in answer.get("items") or [] if isinstance(p, dict)]

    return pods


class PodDirectory:
    """The pods on this node by UID, refreshed in the background from the API server.

    A UID that is not on the list (a pod started since the last refresh) asks for an early
    refresh, at most every ``min_refresh`` seconds.
    """

    def __init__(self, lister: PodLister, interval: float = 30.0, min_refresh: float = 5.0):
        self._lister = lister
        self.interval = interval
        self.min_refresh = min_refresh
        self._names: dict[str, PodName] = {}
        self._uids: dict[tuple[str, str], str] = {}  # (namespace, pod) -> UID
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors_total = 0

    def refresh(self) -> bool:
        try:
            names = pod_names(self._lister())
            self._names = names
            self._uids = {(n.namespace, n.pod): uid for uid, n in names.items()}
        except Exception as exc:  # an API failure keeps the last list
            self.errors_total += 1
            log.warning("listing this node's pods for per-pod usage failed: %s", exc)
            return False
        return True

    def lookup(self, uid: str) -> PodName | None:
        found = self._names.get(uid)
        if found is None:
            self._wake.set()
        return found

    def uid_of(self, namespace: str, pod: str) -> str | None:
        """The UID of the pod of that name on this node (None: not listed yet, which asks
        for an early refresh)."""
        found = self._uids.get((namespace, pod))
        if found is None:
            self._wake.set()
        return found

    def start(self) -> None:
        self.refresh()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="pod-directory", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            if self._stop.is_set():
                return
            self._wake.clear()
            self.refresh()
            self._stop.wait(self.min_refresh)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None
