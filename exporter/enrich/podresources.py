"""Pod attribution: which pods hold which GPU, from the kubelet pod-resources API v1.

A background thread calls ``List`` on the kubelet's unix socket every few seconds (with a
deadline) and turns the answer into ``dict[device_uuid, tuple[PodRef, ...]]``; the collector's
enricher joins that mapping onto each snapshot, so a scrape never waits on the kubelet.

The join itself is pure and lives in exporter/enrich/pods.py (device ids, replicas, index
strategy, DRA partitions); this module is its I/O. On DRA nodes the same List answer carries
``dynamic_resources``, which exporter/enrich/dra.py resolves through the node's
ResourceSlices. With per-pod usage on, each answer also goes to the node's pod directory
(exporter/enrich/poddirectory.py), which names the pods' UIDs from it and the kubelet's device
checkpoint.

Failure policy: no socket (bare metal, or the kubelet not up yet) means attribution is off,
logged once, and the refresher keeps looking so attribution starts when the socket appears.
A kubelet error keeps the last good mapping for ``max_stale`` seconds (counted in
``errors_total``), then drops it: stale attribution is worse than none.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from gpuquota.exporter.enrich.dra import DraAttribution
from gpuquota.exporter.enrich.poddirectory import PodDirectory
from gpuquota.exporter.enrich.pods import (
    DeviceMap,
    attach_claims,
    attach_pods,
    device_pods,
    ordered_pods,
)
from gpuquota.exporter.kubeletapi import podresources_v1_pb2 as pb
from gpuquota.exporter.kubeletapi import podresources_v1_pb2_grpc as pb_grpc
from gpuquota.exporter.snapshot import ClaimRef, NodeSnapshot, PodAttributionStatus

log = logging.getLogger(__name__)

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
# A node with hundreds of pods can exceed gRPC's default 4 MiB receive limit.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# an early List (asked by the pod directory for a pod UID it cannot name yet) at most this often
EARLY_GAP_S = 0.5


class PodResourcesWatcher:
    """Keeps a fresh device -> pods mapping from the kubelet, refreshed in its own thread."""

    def __init__(
        self,
        socket_path: Path = DEFAULT_SOCKET,
        *,
        interval: float = 5.0,
        timeout: float = 2.0,
        max_stale: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        dra: DraAttribution | None = None,
        directory: PodDirectory | None = None,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"pod-resources refresh interval must be > 0, got {interval}")
        if timeout <= 0:
            raise ValueError(f"pod-resources timeout must be > 0, got {timeout}")
        if max_stale < 0:
            raise ValueError(f"pod-resources max staleness must be >= 0, got {max_stale}")
        self.socket_path = socket_path
        self.interval = interval
        self.timeout = timeout
        self.max_stale = max_stale
        self._clock = clock
        self._lock = threading.Lock()
        self._mapping: DeviceMap = {}
        self._dra = dra
        self.directory = directory
        self._claims: dict[str, tuple[ClaimRef, ...]] = {}
        self._last_success: float | None = None
        self._up = False
        self._socket_present = False
        self._errors = 0
        self._logged_absent = False
        self._logged_error = False
        self._channel: grpc.Channel | None = None
        self._stub: pb_grpc.PodResourcesListerStub | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the refresh loop ---------------------------------------------------------------

    def refresh(self) -> bool:
        """Call List once and update the mapping; True when the kubelet answered."""
        if not self.socket_path.exists():
            self._socket_gone()
            return False
        if not self._socket_present:
            log.info("kubelet pod-resources socket %s found: pod attribution on", self.socket_path)
            self._logged_absent = False
        self._socket_present = True
        try:
            response = self._lister().List(pb.ListPodResourcesRequest(), timeout=self.timeout)
        except grpc.RpcError as err:
            self._failed(f"{err.code().name}: {err.details()}")
            return False
        mapping = device_pods(response)
        claims: dict[str, tuple[ClaimRef, ...]] = {}
        if self._dra is not None:
            resolved = self._dra.resolve(response)
            claims = resolved.claims
            for uuid, refs in resolved.devices.items():
                mapping[uuid] = ordered_pods({*mapping.get(uuid, ()), *refs})
        if self.directory is not None:
            self.directory.update(response)
        with self._lock:
            self._mapping = mapping
            self._claims = claims
            self._last_success = self._clock()
            self._up = True
        if self._logged_error:
            log.info("kubelet pod-resources List works again")
            self._logged_error = False
        return True

    def _lister(self) -> pb_grpc.PodResourcesListerStub:
        if self._stub is None:
            self._channel = grpc.insecure_channel(
                f"unix://{self.socket_path.absolute()}",
                options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)],
            )
            self._stub = pb_grpc.PodResourcesListerStub(self._channel)
        return self._stub

    def _close_channel(self) -> None:
        # A fresh channel after an error reconnects at once instead of waiting out gRPC's
        # reconnect backoff, e.g. when the kubelet restarted and recreated its socket.
        if self._channel is not None:
            self._channel.close()
        self._channel, self._stub = None, None

    def _socket_gone(self) -> None:
        was_present = self._socket_present
        self._socket_present = False
        self._close_channel()
        if was_present:
            self._failed(f"socket {self.socket_path} disappeared")
        elif not self._logged_absent:
            log.warning(
                "no kubelet pod-resources socket at %s: pod attribution is off until it appears",
                self.socket_path,
            )
            self._logged_absent = True
        with self._lock:
            self._up = False

    def _failed(self, reason: str) -> None:
        self._close_channel()
        with self._lock:
            self._errors += 1
            self._up = False
        if not self._logged_error:
            log.warning(
                "kubelet pod-resources List on %s failed (%s): keeping the last mapping for "
                "up to %.0f s",
                self.socket_path,
                reason,
                self.max_stale,
            )
            self._logged_error = True

    def start(self) -> None:
        """Refresh once now (so the first scrape is attributed), then in the background."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._wake.clear()
        self.refresh()
        self._thread = threading.Thread(target=self._run, name="pod-resources", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Ask the kubelet now rather than at the next interval (a process of a pod the
        directory cannot name yet: it started since the last answer)."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            woken = self._wake.wait(self.interval)
            if self._stop.is_set():
                return
            self._wake.clear()
            try:
                self.refresh()
            except Exception:  # keep attributing on the next round whatever went wrong
                log.exception("pod-resources refresh crashed")
                self._failed("unexpected error")
            if woken and self._stop.wait(EARLY_GAP_S):
                return

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout + self.interval)
            self._thread = None
        self._close_channel()

    def __enter__(self) -> PodResourcesWatcher:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what the collector and the renderer read ------------------------------------------

    def mapping(self) -> DeviceMap:
        """The last good mapping, or {} once it is older than ``max_stale`` seconds."""
        with self._lock:
            if self._last_success is None:
                return {}
            if not self._up and self._clock() - self._last_success > self.max_stale:
                return {}
            return self._mapping

    def enrich(self, snapshot: NodeSnapshot) -> NodeSnapshot:
        """CollectLoop enricher: the snapshot with ``pods`` and ``pod_attribution`` filled in
        (and ``claims`` and ``dra`` with DRA attribution on)."""
        mapping = self.mapping()
        enriched = attach_pods(snapshot, mapping)
        if self._dra is None:
            return dataclasses.replace(enriched, pod_attribution=self.status())
        with self._lock:
            claims = self._claims if mapping else {}  # stale together with the mapping
        return dataclasses.replace(
            enriched,
            pod_attribution=self.status(),
            claims=attach_claims(snapshot, claims),
            dra=self._dra.status(),
        )

    def status(self) -> PodAttributionStatus:
        with self._lock:
            socket_present, up, errors = self._socket_present, self._up, self._errors
        return PodAttributionStatus(
            socket_present=socket_present,
            up=up,
            errors_total=errors,
            devices_attributed=len(self.mapping()),
        )
