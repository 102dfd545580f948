"""Reads the ResourceClaims this node's containers name, in a thread: the I/O of the
adminAccess rule (exporter/enrich/admin_access.py).

The exporter reads each claim once (``get`` on resourceclaims, namespaced: no cluster-wide
watch from every node) and keeps which of its allocated devices are ``adminAccess``, so the
DRA join (exporter/enrich/dra.py) can leave them out, its UID (the usage counters) and the pods
it is reserved for (name and UID: how the node names a DRA pod's processes,
exporter/enrich/podnames.py). A claim a listed pod names but whose reservation lacks that pod
(a pod that joined a shared claim since) is read again, at most every ``reread_s``. A claim not read yet is attributed as
usual until the read returns (one pod-resources interval at most). Without RBAC for
resourceclaims the exporter says so once and attributes every claim.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterable
from typing import Any

from gpuquota.exporter.enrich.admin_access import (
    ClaimKey,
    Device,
    admin_devices,
    claim_path,
    reserved_pods,
)

log = logging.getLogger(__name__)


class AdminAccessClaims:
    """Reads claims in the background; ``devices(key)`` answers from what was read."""

    def __init__(self, kube: Any, version: str = "v1", reread_s: float = 10.0) -> None:
        self.kube = kube
        self.version = version
        self.reread_s = reread_s
        self._reserved: dict[ClaimKey, tuple[tuple[str, str], ...]] = {}
        self._read_at: dict[ClaimKey, float] = {}
        self._lock = threading.Lock()
        self._known: dict[ClaimKey, frozenset[Device]] = {}
        self._queued: set[ClaimKey] = set()
        self._uids: dict[ClaimKey, str] = {}  # metadata.uid, for the usage counters
        self._queue: queue.Queue[ClaimKey | None] = queue.Queue()
        self.enabled = True  # False once the API said 401/403: every claim counts then
        self._thread = threading.Thread(target=self._run, name="dra-claims", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)

    def devices(self, namespace: str, name: str) -> frozenset[Device]:
        """The claim's adminAccess devices as far as known (none until it has been read)."""
        key = (namespace, name)
        with self._lock:
            known = self._known.get(key)
            if known is None and self.enabled and key not in self._queued:
                self._queued.add(key)
                self._queue.put(key)
        return known or frozenset()

    def uid_of(self, namespace: str, name: str) -> str | None:
        """The claim's UID once it has been read (exporter/enrich/ledger.py)."""
        with self._lock:
            return self._uids.get((namespace, name))

    def reserved_for(self, namespace: str, name: str) -> list[tuple[str, str]] | None:
        """(pod name, pod UID) of the pods the claim is reserved for; None: not read yet."""
        with self._lock:
            found = self._reserved.get((namespace, name))
        return None if found is None else list(found)

    def reread(self, namespace: str, name: str) -> None:
        """Read the claim again (its reservation changed), at most every ``reread_s``."""
        key = (namespace, name)
        with self._lock:
            recent = time.monotonic() - self._read_at.get(key, float("-inf")) < self.reread_s
            if recent or not self.enabled or key in self._queued:
                return
            self._queued.add(key)
        self._queue.put(key)

    def keep_only(self, keys: Iterable[ClaimKey]) -> None:
        """Forget claims no container names any more (a claim recreated under the same
        name is read again)."""
        wanted = set(keys)
        with self._lock:
            for key in [k for k in self._known if k not in wanted]:
                del self._known[key]
                self._uids.pop(key, None)
                self._reserved.pop(key, None)
                self._read_at.pop(key, None)

    def _run(self) -> None:
        from gpuquota.kube.client import ApiStatusError

        while True:
            key = self._queue.get()
            if key is None:
                return
            namespace, name = key
            uid = ""
            reserved: tuple[tuple[str, str], ...] = ()
            try:
                claim = self.kube.call("GET", claim_path(self.version, namespace, name))
                found = admin_devices(claim)
                uid = str((claim.get("metadata") or {}).get("uid") or "")
                reserved = reserved_pods(claim)
            except ApiStatusError as exc:
                if exc.status in (401, 403):
                    if self.enabled:
                        log.warning(
                            "cannot read ResourceClaims (%s): claims with adminAccess "
                            "(monitoring agents) are attributed like any other; grant get on "
                            "resourceclaims (deploy/components/dra) to leave them out",
                            exc,
                        )
                    self.enabled = False
                found = frozenset()  # 404: gone meanwhile; others: attribute as usual
            except Exception as exc:  # unreachable API server: read again next time
                log.debug("cannot read ResourceClaim %s/%s: %s", namespace, name, exc)
                with self._lock:
                    self._queued.discard(key)
                continue
            with self._lock:
                self._known[key] = found
                self._reserved[key] = reserved
                self._read_at[key] = time.monotonic()
                self._queued.discard(key)
                if uid:
                    self._uids[key] = uid
