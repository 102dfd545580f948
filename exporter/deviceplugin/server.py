"""One kubelet device plugin server (API v1beta1) for one resource name, on its own socket.

Two agents may serve one resource on one node for a moment (a surge rollout: the new agent
starts before the old one stops), so the socket's name is the resource's unless a live plugin
already answers there: then a name of this process's own. The kubelet drops the plugin that is
current for a resource whenever a replaced plugin's stream ends (../shared/kubelet.md; the
1.36 kubelet's devicemanager looks the client up by resource name), so a ListAndWatch stream
that the kubelet ends while we still serve is reported (``on_lost``) for a new registration.

The servicer renders the health board's ``NodeHealth`` through exporter/deviceplugin/devices.py
and answers Allocate / GetPreferredAllocation with the pure functions beside it; all that
happens here is gRPC: sockets, streams, status codes.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc

from gpuquota.exporter.deviceplugin.allocate import AllocationError, allocate_container
from gpuquota.exporter.deviceplugin.devices import (
    PluginConfig,
    PluginDevice,
    index_devices,
    plugin_devices,
)
from gpuquota.exporter.deviceplugin.preferred import PreferenceError, Topology, preferred_allocation
from gpuquota.exporter.health.board import VerdictBoard
from gpuquota.exporter.kubeletapi import deviceplugin_v1beta1_pb2 as pb
from gpuquota.exporter.kubeletapi import deviceplugin_v1beta1_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
WAKE_S = 0.5  # how often an idle ListAndWatch stream checks that it should still run


def endpoint_name(resource: str, instance: str = "") -> str:
    """Socket file name for a resource: nvidia.com/mig-1g.10gb -> gpuquota-nvidia.com-mig-1g.10gb.sock
    (with an instance: gpuquota-nvidia.com-mig-1g.10gb@<instance>.sock)."""
    return "gpuquota-" + resource.replace("/", "-") + (f"@{instance}" if instance else "") + ".sock"


def answers(path: Path) -> bool:
    """Whether a process listens on the unix socket at ``path`` (a stale file does not)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def _device(device_id: str, health: str, numa_node: int | None) -> pb.Device:
    """One ListAndWatch entry; the NUMA node (when NVML knows it) feeds the topology manager."""
    if numa_node is None:
        return pb.Device(ID=device_id, health=health)
    nodes = pb.TopologyInfo(nodes=[pb.NUMANode(ID=numa_node)])
    return pb.Device(ID=device_id, health=health, topology=nodes)


class _Servicer(pb_grpc.DevicePluginServicer):
    def __init__(self, plugin: DevicePluginServer) -> None:
        self._plugin = plugin

    def GetDevicePluginOptions(  # noqa: N802 (gRPC method name)
        self, request: pb.Empty, context: grpc.ServicerContext
    ) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=True
        )

    def ListAndWatch(  # noqa: N802 (gRPC method name)
        self, request: pb.Empty, context: grpc.ServicerContext
    ) -> Iterator[pb.ListAndWatchResponse]:
        plugin = self._plugin
        # the kubelet ending the stream while we serve: it dropped this plugin
        context.add_callback(plugin.stream_ended)
        generation = -1
        last: tuple[tuple[str, str, int | None], ...] | None = None
        while context.is_active() and not plugin.stopping.is_set():
            health = plugin.board.wait_for_change(generation, WAKE_S)
            generation = health.generation
            numa = plugin.topology().numa_node
            listed = tuple((d.id, d.health, numa.get(d.gpu_uuid)) for d in plugin.devices())
            if listed != last:
                last = listed
                yield pb.ListAndWatchResponse(devices=[_device(*entry) for entry in listed])

    def GetPreferredAllocation(  # noqa: N802 (gRPC method name)
        self, request: pb.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> pb.PreferredAllocationResponse:
        devices = index_devices(self._plugin.devices())
        gpu_of = {d.id: d.gpu_uuid for d in devices.values()}
        topology = self._plugin.topology()
        if not request.container_requests:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "preferred allocation request has no container requests",
            )
        response = pb.PreferredAllocationResponse()
        for n, creq in enumerate(request.container_requests):
            try:
                ids = preferred_allocation(
                    list(creq.available_deviceIDs),
                    list(creq.must_include_deviceIDs),
                    creq.allocation_size,
                    gpu_of,
                    topology,
                )
            except PreferenceError as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"container request {n}: {exc}")
            response.container_responses.add(deviceIDs=ids)
        return response

    def Allocate(  # noqa: N802 (gRPC method name)
        self, request: pb.AllocateRequest, context: grpc.ServicerContext
    ) -> pb.AllocateResponse:
        plugin = self._plugin
        devices = index_devices(plugin.devices())
        if not request.container_requests:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "allocate request has no container requests"
            )
        response = pb.AllocateResponse()
        for n, creq in enumerate(request.container_requests):
            try:
                alloc = allocate_container(
                    list(creq.devices_ids), devices, plugin.config, plugin.resource
                )
            except AllocationError as exc:
                code = (
                    grpc.StatusCode.FAILED_PRECONDITION
                    if exc.kind == "precondition"
                    else (grpc.StatusCode.INVALID_ARGUMENT)
                )
                log.warning("refused Allocate for %s: %s", plugin.resource, exc.message)
                context.abort(code, f"container request {n}: {exc.message}")
            cresp = response.container_responses.add()
            cresp.envs.update(alloc.envs)
            for node in alloc.device_nodes:
                cresp.devices.add(container_path=node, host_path=node, permissions="rw")
            for name in alloc.cdi_devices:
                cresp.cdi_devices.add(name=name)
        return response

    def PreStartContainer(  # noqa: N802 (gRPC method name)
        self, request: pb.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


class DevicePluginServer:
    """Serves one resource on ``<plugin_dir>/<endpoint>`` and registers it with the kubelet."""

    def __init__(
        self,
        resource: str,
        plugin_dir: Path,
        board: VerdictBoard,
        config: PluginConfig,
        topology: Callable[[], Topology] = Topology,
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        self.resource = resource
        self.plugin_dir = plugin_dir
        self.board = board
        self.config = config
        self.topology = topology
        self.on_lost = on_lost
        self.endpoint = endpoint_name(resource)
        self.socket_path = plugin_dir / self.endpoint
        self.stopping = threading.Event()
        self._server: grpc.Server | None = None
        self._inode: int | None = None  # of the socket file we created

    def devices(self) -> tuple[PluginDevice, ...]:
        return plugin_devices(self.board.current(), self.config).get(self.resource, ())

    def start(self) -> None:
        """(Re)create the socket and serve on it."""
        self.stop()
        self.stopping.clear()
        # the resource's own name, unless another agent (the one a rollout replaces) serves it
        self.endpoint = endpoint_name(self.resource)
        if answers(self.plugin_dir / self.endpoint):
            self.endpoint = endpoint_name(self.resource, str(os.getpid()))
            log.info("another plugin serves %s here: serving beside it", self.resource)
        self.socket_path = self.plugin_dir / self.endpoint
        self.socket_path.unlink(missing_ok=True)
        # Each ListAndWatch stream holds a worker for its lifetime; the kubelet keeps one.
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="deviceplugin")
        )
        pb_grpc.add_DevicePluginServicer_to_server(_Servicer(self), server)
        if server.add_insecure_port(f"unix:{self.socket_path}") == 0:
            raise OSError(f"cannot listen on {self.socket_path}")
        server.start()
        self._server = server
        self._inode = self.socket_path.stat().st_ino
        log.info("device plugin for %s serving on %s", self.resource, self.socket_path)

    def register(self, timeout: float = 5.0) -> None:
        """Tell the kubelet about this plugin; raises grpc.RpcError when the kubelet refuses."""
        kubelet = self.plugin_dir / KUBELET_SOCKET
        with grpc.insecure_channel(f"unix:{kubelet}") as channel:
            pb_grpc.RegistrationStub(channel).Register(
                pb.RegisterRequest(
                    version=API_VERSION,
                    endpoint=self.endpoint,
                    resource_name=self.resource,
                    options=pb.DevicePluginOptions(get_preferred_allocation_available=True),
                ),
                timeout=timeout,
            )
        log.info("registered %s with the kubelet at %s", self.resource, kubelet)

    def stop(self, grace: float = 1.0) -> None:
        """Stop serving and remove the socket (only if it is still ours)."""
        self.stopping.set()
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace).wait()
            if self.socket_is_ours():  # a successor may already serve on the same path
                self.socket_path.unlink(missing_ok=True)
            self._inode = None

    def stream_ended(self) -> None:
        """A ListAndWatch stream ended: if we did not end it, the kubelet dropped us."""
        if not self.stopping.is_set() and self.on_lost is not None:
            log.info("the kubelet closed the ListAndWatch stream of %s", self.resource)
            self.on_lost(self.resource)

    def socket_is_ours(self) -> bool:
        try:
            return self._inode is not None and self.socket_path.stat().st_ino == self._inode
        except FileNotFoundError:
            return False

    @property
    def serving(self) -> bool:
        return self._server is not None
