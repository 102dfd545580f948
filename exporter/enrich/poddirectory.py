"""The pods on this node by UID, from the node alone: no API server call for pods.

Each time the pod-resources watcher (exporter/enrich/podresources.py) gets a List answer, it
hands it to :meth:`PodDirectory.update`, which reads the kubelet's device checkpoint
(exporter/enrich/devicecheckpoint.py) and joins the two, and the DRA claims' reservations,
into names (exporter/enrich/podnames.py). Names are thus as fresh as the attribution itself
(one pod-resources interval), and a pod that is gone from List is gone from here.

A UID it cannot name asks the watcher for an early answer, once per UID (a pod started since
the last answer is named within a moment, not a whole interval, so its series do not begin
under ``pod_uid`` alone; a pod the node can never name costs one extra List).

A checkpoint that cannot be read names no device-plugin pod until it can (said once, counted
in ``errors_total``): a stale name is worse than a UID.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from gpuquota.exporter.enrich.devicecheckpoint import (
    DEFAULT_CHECKPOINT,
    CheckpointEntry,
    CheckpointError,
    read_checkpoint,
)
from gpuquota.exporter.enrich.podnames import PodName, PodNames, ReservedFor, node_pod_names
from gpuquota.exporter.kubeletapi import podresources_v1_pb2 as pb

log = logging.getLogger(__name__)
MAX_ASKED = 4096


class Claims(Protocol):
    """The DRA claim reader's side (exporter/enrich/claimreader.py)."""

    def reserved_for(self, namespace: str, name: str) -> list[tuple[str, str]] | None: ...
    def reread(self, namespace: str, name: str) -> None: ...


class PodDirectory:
    """UID <-> (namespace, pod) of this node's pods, as of the latest pod-resources answer."""

    def __init__(self, checkpoint: Path | None = DEFAULT_CHECKPOINT) -> None:
        self.checkpoint = checkpoint  # None: device-plugin pods are not named
        self.claims: Claims | None = None  # set when DRA attribution is on
        self.wake: Callable[[], None] | None = None  # asks the watcher for an early answer
        self._asked: set[str] = set()  # UIDs that asked already
        self._lock = threading.Lock()
        self._names = PodNames()
        self.errors_total = 0
        self._logged = False

    def update(self, response: pb.ListPodResourcesResponse) -> None:
        entries = self._entries()
        claims = self.claims
        reserved: ReservedFor | None = claims.reserved_for if claims is not None else None
        names = node_pod_names(response, entries, reserved)
        if claims is not None:
            for namespace, name in names.stale_claims:
                claims.reread(namespace, name)  # a pod that joined a shared claim since
        with self._lock:
            self._names = names

    def _entries(self) -> tuple[CheckpointEntry, ...]:
        if self.checkpoint is None:
            return ()
        try:
            entries = read_checkpoint(self.checkpoint)
        except (OSError, CheckpointError) as exc:
            self.errors_total += 1
            if not self._logged:
                log.warning(
                    "cannot read the kubelet's device checkpoint (%s): pods holding "
                    "device-plugin GPUs are published by pod_uid only until it can be read",
                    exc,
                )
                self._logged = True
            return ()
        if self._logged:
            log.info("the kubelet's device checkpoint %s is readable again", self.checkpoint)
            self._logged = False
        return entries

    def lookup(self, uid: str) -> PodName | None:
        with self._lock:
            found = self._names.by_uid.get(uid)
            ask = found is None and uid not in self._asked and self.wake is not None
            if ask:
                if len(self._asked) > MAX_ASKED:  # bounded: a UID may ask once more
                    self._asked.clear()
                self._asked.add(uid)
        if ask and self.wake is not None:
            self.wake()
        return found

    def uid_of(self, namespace: str, pod: str) -> str | None:
        """The UID of the pod of that name on this node (None: the node cannot tell)."""
        with self._lock:
            return self._names.uids.get((namespace, pod))
