"""A kubelet stand-in for device plugins: the Registration server and the kubelet's client side.

It does what the kubelet's device manager does, over real gRPC on unix sockets:

* serves ``Registration.Register`` on ``<dir>/kubelet.sock`` and checks the request (API
  version, endpoint, resource name) as the kubelet does;
* after a registration, connects back to ``<dir>/<endpoint>``, asks for the plugin options
  and keeps a ListAndWatch stream open, recording every device list it receives (with the
  time it arrived);
* offers Allocate and GetPreferredAllocation calls the way the kubelet makes them;
* ``restart()`` behaves like a kubelet restart: kubelet.sock is removed and recreated and the
  plugin sockets in the folder are wiped, so plugins must notice and come back.

Run it alone with ``python -m gpuquota.sim.kubelet.registration --dir /tmp/dp`` (prints each update).
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from gpuquota.exporter.kubeletapi import deviceplugin_v1beta1_pb2 as pb
from gpuquota.exporter.kubeletapi import deviceplugin_v1beta1_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

KUBELET_SOCKET = "kubelet.sock"
SUPPORTED_VERSIONS = ("v1beta1",)


@dataclass(frozen=True, slots=True)
class Update:
    at: float  # time.time() when the list arrived
    devices: dict[str, str]  # device ID -> "Healthy" / "Unhealthy"
    numa: dict[str, tuple[int, ...]] = field(default_factory=dict)  # device ID -> NUMA nodes


class PluginClient:
    """The kubelet's connection to one registered plugin."""

    def __init__(self, plugin_dir: Path, request: pb.RegisterRequest) -> None:
        self.resource = request.resource_name
        self.endpoint = request.endpoint
        self.socket_path = plugin_dir / request.endpoint
        self.channel = grpc.insecure_channel(f"unix:{self.socket_path}")
        self.stub = pb_grpc.DevicePluginStub(self.channel)
        self.options: pb.DevicePluginOptions | None = None
        self.updates: list[Update] = []
        self._cond = threading.Condition()
        self._stream: Any = None  # the ListAndWatch call, cancellable
        self._thread = threading.Thread(
            target=self._watch, name=f"kubelet-law-{self.resource}", daemon=True
        )
        self._thread.start()

    def _watch(self) -> None:
        try:
            self.options = self.stub.GetDevicePluginOptions(pb.Empty(), timeout=5)
            stream = self.stub.ListAndWatch(pb.Empty())
            self._stream = stream
            for response in stream:
                update = Update(
                    time.time(),
                    {d.ID: d.health for d in response.devices},
                    {d.ID: tuple(n.ID for n in d.topology.nodes) for d in response.devices},
                )
                with self._cond:
                    self.updates.append(update)
                    self._cond.notify_all()
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                log.info("ListAndWatch for %s ended: %s", self.resource, exc.code())
        except ValueError:  # close() ran before the stream opened: grpc's "Channel closed!"
            log.info("ListAndWatch for %s closed before it started", self.resource)
        finally:
            with self._cond:
                self._cond.notify_all()

    def devices(self) -> dict[str, str]:
        with self._cond:
            return dict(self.updates[-1].devices) if self.updates else {}

    def wait_for(
        self, predicate: Callable[[dict[str, str]], bool], timeout: float = 5.0, start: int = 0
    ) -> Update | None:
        """The first update numbered ``start`` or later (already received or arriving within
        ``timeout``) whose device list satisfies ``predicate``."""
        deadline = time.monotonic() + timeout
        seen = start
        with self._cond:
            while True:
                for update in self.updates[seen:]:
                    if predicate(update.devices):
                        return update
                seen = max(seen, len(self.updates))
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)

    def count(self) -> int:
        with self._cond:
            return len(self.updates)

    def allocate(self, *containers: Sequence[str], timeout: float = 5.0) -> pb.AllocateResponse:
        request = pb.AllocateRequest(
            container_requests=[
                pb.ContainerAllocateRequest(devices_ids=list(ids)) for ids in containers
            ]
        )
        response: pb.AllocateResponse = self.stub.Allocate(request, timeout=timeout)
        return response

    def preferred(
        self, available: Sequence[str], must_include: Sequence[str], size: int, timeout: float = 5.0
    ) -> list[str]:
        request = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available),
                    must_include_deviceIDs=list(must_include),
                    allocation_size=size,
                )
            ]
        )
        response: pb.PreferredAllocationResponse = self.stub.GetPreferredAllocation(
            request, timeout=timeout
        )
        return list(response.container_responses[0].deviceIDs)

    def close(self) -> None:
        if self._stream is not None:
            self._stream.cancel()
        self.channel.close()
        self._thread.join(timeout=5)


class _Registration(pb_grpc.RegistrationServicer):
    def __init__(self, kubelet: KubeletStandIn) -> None:
        self._kubelet = kubelet

    def Register(  # noqa: N802 (gRPC method name)
        self, request: pb.RegisterRequest, context: grpc.ServicerContext
    ) -> pb.Empty:
        problem = self._kubelet.check(request)
        if problem:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        self._kubelet.accept(request)
        return pb.Empty()


class KubeletStandIn:
    """Registration server on ``<plugin_dir>/kubelet.sock`` plus one PluginClient per resource."""

    def __init__(self, plugin_dir: Path) -> None:
        self.plugin_dir = plugin_dir
        self.socket_path = plugin_dir / KUBELET_SOCKET
        self.registrations: list[tuple[float, pb.RegisterRequest]] = []
        self.plugins: dict[str, PluginClient] = {}
        self._cond = threading.Condition()
        self._server: grpc.Server | None = None

    # -- the kubelet's side of Register ----------------------------------------------------

    @staticmethod
    def check(request: pb.RegisterRequest) -> str | None:
        if request.version not in SUPPORTED_VERSIONS:
            return f"unsupported device plugin API version {request.version!r}"
        if not request.endpoint or "/" in request.endpoint:
            return f"invalid endpoint {request.endpoint!r}: a file name in the device plugin folder"
        domain, _, name = request.resource_name.partition("/")
        if not domain or not name or "." not in domain:
            return f"invalid extended resource name {request.resource_name!r}"
        return None

    def accept(self, request: pb.RegisterRequest) -> None:
        registered = pb.RegisterRequest()
        registered.CopyFrom(request)
        with self._cond:
            old = self.plugins.pop(request.resource_name, None)
            self.registrations.append((time.time(), registered))
            self.plugins[request.resource_name] = PluginClient(self.plugin_dir, registered)
            self._cond.notify_all()
        if old is not None:  # a re-registration replaces the previous connection
            threading.Thread(target=old.close, daemon=True).start()

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self.socket_path.unlink(missing_ok=True)
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="kubelet")
        )
        pb_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        if server.add_insecure_port(f"unix:{self.socket_path}") == 0:
            raise OSError(f"cannot listen on {self.socket_path}")
        server.start()
        self._server = server

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop(0).wait()
        with self._cond:
            plugins = list(self.plugins.values())
            self.plugins.clear()
        for plugin in plugins:
            plugin.close()
        self.socket_path.unlink(missing_ok=True)

    def restart(self, wipe_plugin_sockets: bool = True) -> None:
        """Like a kubelet restart: drop connections, remove kubelet.sock (and, as the kubelet's
        device manager does at start, every other socket in the folder), then serve again."""
        self.stop()
        if wipe_plugin_sockets:
            for path in self.plugin_dir.iterdir():
                if path.is_socket():
                    path.unlink(missing_ok=True)
        self.start()

    def wait_for_plugin(
        self, resource: str, timeout: float = 5.0, after: float = 0.0
    ) -> PluginClient | None:
        """The client for ``resource`` once it has (re)registered after time ``after``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                plugin = self.plugins.get(resource)
                if plugin is not None and any(
                    t >= after and r.resource_name == resource for t, r in self.registrations
                ):
                    return plugin
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--dir", type=Path, required=True, help="device plugin folder (holds kubelet.sock)"
    )
    args = parser.parse_args(argv)
    if not args.dir.is_dir():
        parser.error(f"--dir {args.dir} is not a folder")
    logging.basicConfig(level=logging.INFO)
    kubelet = KubeletStandIn(args.dir)
    kubelet.start()
    print(f"kubelet stand-in listening on {kubelet.socket_path}", flush=True)
    printed: dict[str, int] = {}
    try:
        while True:
            time.sleep(0.2)
            for resource, plugin in list(kubelet.plugins.items()):
                for update in plugin.updates[printed.get(resource, 0) :]:
                    print(f"{resource}: {update.devices}", flush=True)
                printed[resource] = len(plugin.updates)
    except KeyboardInterrupt:
        pass
    finally:
        kubelet.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
