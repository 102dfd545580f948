"""Keeps one device plugin server per resource name alive and registered with the kubelet.

A background thread checks every ``poll_s`` (default 0.5 s):

* the kubelet's socket was recreated (the kubelet restarted): register every plugin again;
* a plugin's own socket vanished (a restarting kubelet wipes the folder): serve it again
  on a fresh socket, then register it;
* the set of resources changed (MIG reconfigured): start and stop servers to match;
* the kubelet closed a plugin's ListAndWatch stream while it serves (the kubelet drops the
  current plugin of a resource when a replaced one's stream ends: the agent that a surge
  rollout replaces, exiting): register it again at once, not at the next round.

Stopping the manager stops every server and removes their sockets.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import grpc

from gpuquota.exporter.deviceplugin.devices import DEFAULT_PLUGIN_DIR, PluginConfig, plugin_devices
from gpuquota.exporter.deviceplugin.preferred import Topology
from gpuquota.exporter.deviceplugin.server import KUBELET_SOCKET, DevicePluginServer
from gpuquota.exporter.health.board import VerdictBoard

log = logging.getLogger(__name__)


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_ctime_ns)


class DevicePluginManager:
    def __init__(
        self,
        board: VerdictBoard,
        config: PluginConfig,
        plugin_dir: Path = DEFAULT_PLUGIN_DIR,
        topology: Callable[[], Topology] = Topology,
        poll_s: float = 0.5,
    ) -> None:
        self.board = board
        self.config = config
        self.plugin_dir = plugin_dir
        self.topology = topology
        self.poll_s = poll_s
        self.servers: dict[str, DevicePluginServer] = {}
        self._registered: dict[str, tuple[int, int]] = {}  # resource -> kubelet.sock identity
        self._failed: dict[str, tuple[int, int]] = {}  # resource -> identity that refused it
        # (resources served, resource -> kubelet.sock identity registered with), replaced
        # whole after each reconcile: a scrape reads it without the lock, which a registration
        # (a gRPC call to the kubelet) may hold for seconds
        self._view: tuple[tuple[str, ...], dict[str, tuple[int, int]]] = ((), {})
        self._stop = threading.Event()
        self._wake = threading.Event()  # a stream lost: reconcile now
        self._lost: set[str] = set()  # resources whose stream the kubelet closed
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        if not self.plugin_dir.is_dir():
            raise FileNotFoundError(f"device plugin folder {self.plugin_dir} does not exist")
        self.reconcile()
        self._thread = threading.Thread(target=self._run, name="deviceplugin-manager", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            for server in self.servers.values():  # let every stream wind down at once
                server.stopping.set()
            for server in self.servers.values():
                server.stop()
            self.servers.clear()
            self._view = ((), {})

    def _run(self) -> None:
        while True:
            self._wake.wait(self.poll_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.reconcile()
            except Exception:  # keep watching whatever one round hit
                log.exception("device plugin reconcile failed")

    def lost(self, resource: str) -> None:
        """The kubelet closed ``resource``'s stream while it was served: register again."""
        self._lost.add(resource)
        self._wake.set()

    def registrations(self) -> dict[str, bool]:
        """resource -> whether its plugin is registered with the kubelet running now (read at
        scrape time: exporter/health/publishing.py)."""
        kubelet = _identity(self.plugin_dir / KUBELET_SOCKET)
        resources, registered = self._view
        return {
            resource: kubelet is not None and registered.get(resource) == kubelet
            for resource in resources
        }

    def resources(self) -> list[str]:
        return sorted(plugin_devices(self.board.current(), self.config))

    def reconcile(self) -> None:
        """One round of the checks above; safe to call at any time."""
        if not self.board.ready:  # no verdict yet: advertising nothing would be a lie
            return
        with self._lock:
            try:
                self._reconcile()
            finally:
                self._view = (tuple(self.servers), dict(self._registered))

    def _reconcile(self) -> None:
        """reconcile's round, under the lock."""
        wanted = self.resources()
        for resource in [r for r in self.servers if r not in wanted]:
            self.servers.pop(resource).stop()
            self._registered.pop(resource, None)
        for resource in wanted:
            server = self.servers.get(resource)
            if server is None:
                server = DevicePluginServer(
                    resource, self.plugin_dir, self.board, self.config, self.topology, self.lost
                )
                self.servers[resource] = server
            if not server.serving or not server.socket_is_ours():
                if server.serving:
                    log.warning("socket %s was removed; serving again", server.socket_path)
                server.start()
                self._registered.pop(resource, None)
        for resource in list(self._lost):
            self._lost.discard(resource)
            self._registered.pop(resource, None)
        kubelet = _identity(self.plugin_dir / KUBELET_SOCKET)
        if kubelet is None:
            return
        for resource, server in self.servers.items():
            if self._registered.get(resource) == kubelet:
                continue
            try:
                server.register()
            except grpc.RpcError as exc:
                # Retried every round; say it loudly once per kubelet socket, then quietly.
                first = self._failed.get(resource) != kubelet
                self._failed[resource] = kubelet
                log.log(
                    logging.WARNING if first else logging.DEBUG,
                    "cannot register %s with the kubelet (will retry): %s",
                    resource,
                    exc.code(),
                )
                continue
            self._failed.pop(resource, None)
            self._registered[resource] = kubelet
