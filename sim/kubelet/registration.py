"""A kubelet stand-in for device plugins: the Registration server and the kubelet's device manager.

It does what a real 1.36 kubelet's device manager does (../shared/kubelet.md), over real gRPC on
unix sockets:

* serves ``Registration.Register`` on ``<plugin dir>/kubelet.sock`` and checks the request (API
  version, endpoint, resource name) as the kubelet does. The plugin folder is its own setting,
  ``/var/lib/kubelet/device-plugins`` by default, and is never derived from ``root_dir``: the
  real kubelet's folder is a constant whatever ``--root-dir`` says, while its pod-resources
  socket follows ``--root-dir`` (``<root_dir>/pod-resources/kubelet.sock``, served here when
  ``root_dir`` is given, from the allocations below);
* after a registration, connects back to ``<dir>/<endpoint>``, asks for the plugin options
  and keeps a ListAndWatch stream open, recording every device list it receives (with the
  time it arrived); a stream that ends marks all the resource's devices Unhealthy;
* a second registration for a resource (another endpoint, or the same again) becomes the
  resource's plugin, and the replaced one's stream is **not** closed: its lists still count,
  and when it ends the kubelet disconnects whichever plugin is current for the resource then
  and marks its devices Unhealthy (the 1.36 kubelet's ``runClient``/``disconnectClient`` in
  pkg/kubelet/cm/devicemanager/plugin/v1beta1/handler.go look the client up by resource name).
  A plugin that replaces an older one (a surge rollout) must register again when the old
  one's exit drops it;
* admits pods (:meth:`KubeletStandIn.admit`): picks healthy free devices (asking
  GetPreferredAllocation when the registration offered it), calls Allocate and checkpoints the
  answer in ``kubelet_internal_checkpoint`` (sim/kubelet/checkpoint.py). A container that
  starts again gets the checkpointed answer (:meth:`KubeletStandIn.container_options`), also
  after a plugin or kubelet restart: a bad answer sticks until the pod is deleted;
* publishes the Node's capacity (healthy + unhealthy) and allocatable (healthy) only at its
  node status sync, every ``node_status_sync_s`` (10 s like the kubelet's default; a resource
  whose plugin went away keeps its capacity for ``endpoint_grace_s``, then reads 0);
* keeps each running container's ``allocatedResourcesStatus`` (KEP-4680: per resource, per
  device ID, Healthy / Unhealthy / Unknown) up to date from ListAndWatch at once, and writes it
  into the pod's status on the apiserver stand-in when given one;
* ``restart()`` behaves like a kubelet restart: kubelet.sock is removed and recreated, the
  plugin sockets in the folder are wiped (not the checkpoint), and the allocations are read
  back from the checkpoint.

Run it alone with ``python -m gpuquota.sim.kubelet.registration --dir /tmp/dp`` (prints each update).
"""

from __future__ import annotations

import argparse
import copy
import logging
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from gpuquota.exporter.deviceplugin.devices import resource_name_problem
from gpuquota.exporter.kubeletapi import deviceplugin_v1beta1_pb2 as pb
from gpuquota.exporter.kubeletapi import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from gpuquota.sim.kubelet import checkpoint
from gpuquota.sim.kubelet.podresources import Assignment, PodResourcesServer

if TYPE_CHECKING:
    from gpuquota.sim.apiserver import ApiServer

log = logging.getLogger(__name__)

KUBELET_SOCKET = "kubelet.sock"
SUPPORTED_VERSIONS = ("v1beta1",)
# a constant in the kubelet (pluginapi.DevicePluginPath), whatever --root-dir says
DEFAULT_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_ROOT_DIR = Path("/var/lib/kubelet")
NODE_STATUS_SYNC_S = 10.0  # the kubelet's nodeStatusUpdateFrequency default
ENDPOINT_GRACE_S = 300.0  # endpointStopGracePeriod: a gone plugin's resource is kept this long
HEALTHY, UNHEALTHY, UNKNOWN = "Healthy", "Unhealthy", "Unknown"


@dataclass(frozen=True, slots=True)
class Update:
    at: float  # time.time() when the list arrived
    devices: dict[str, str]  # device ID -> "Healthy" / "Unhealthy"
    numa: dict[str, tuple[int, ...]] = field(default_factory=dict)  # device ID -> NUMA nodes


class PluginClient:
    """The kubelet's connection to one registered plugin. ``on_update`` hears every list, and
    None when the stream ends without the kubelet closing it (the plugin went away)."""

    def __init__(
        self,
        plugin_dir: Path,
        request: pb.RegisterRequest,
        on_update: Callable[[PluginClient, Update | None], None] | None = None,
    ) -> None:
        self.resource = request.resource_name
        self.endpoint = request.endpoint
        self.registered_options = request.options
        self.socket_path = plugin_dir / request.endpoint
        self.channel = grpc.insecure_channel(f"unix:{self.socket_path}")
        self.stub = pb_grpc.DevicePluginStub(self.channel)
        self.options: pb.DevicePluginOptions | None = None
        self.updates: list[Update] = []
        self.allocate_calls = 0
        self._on_update = on_update
        self._closing = False
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
                # the device manager takes the list first, so that whoever waited for this
                # update (wait_for) finds the node's capacity already counting it
                if self._on_update is not None:
                    self._on_update(self, update)
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
            if self._on_update is not None and not self._closing:
                self._on_update(self, None)

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
        self.allocate_calls += 1
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
        self._closing = True
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


class AdmissionError(Exception):
    """The kubelet refuses the pod (its status: Failed, reason UnexpectedAdmissionError)."""


@dataclass(slots=True)
class Pod:
    namespace: str
    name: str
    uid: str
    containers: dict[str, dict[str, int]]  # container -> resource -> devices requested


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """What the last node status sync published (resource -> count)."""

    at: float
    capacity: dict[str, int]
    allocatable: dict[str, int]


class KubeletStandIn:
    """Registration server on ``<plugin_dir>/kubelet.sock``, one PluginClient per resource, and
    the device manager's allocations, checkpoint, node status and pod resource health."""

    def __init__(
        self,
        plugin_dir: Path = DEFAULT_PLUGIN_DIR,
        *,
        root_dir: Path | None = None,
        node_status_sync_s: float = NODE_STATUS_SYNC_S,
        endpoint_grace_s: float = ENDPOINT_GRACE_S,
        api: ApiServer | None = None,
        node_name: str = "node-a",
    ) -> None:
        self.plugin_dir = plugin_dir
        self.socket_path = plugin_dir / KUBELET_SOCKET
        self.checkpoint_path = plugin_dir / checkpoint.CHECKPOINT_FILE
        self.root_dir = root_dir
        self.pod_resources_socket = (
            root_dir / "pod-resources" / KUBELET_SOCKET if root_dir is not None else None
        )
        self.node_status_sync_s = node_status_sync_s
        self.endpoint_grace_s = endpoint_grace_s
        self.api = api
        self.node_name = node_name
        self.registrations: list[tuple[float, pb.RegisterRequest]] = []
        self.plugins: dict[str, PluginClient] = {}
        self._replaced: list[PluginClient] = []  # replaced plugins whose streams still run
        # (time, endpoint) of each current plugin dropped because a replaced one's stream ended
        self.disconnects: list[tuple[float, str]] = []
        self.node_status = NodeStatus(0.0, {}, {})
        self._cond = threading.Condition()
        self._server: grpc.Server | None = None
        self._pod_resources: PodResourcesServer | None = None
        # the device manager's state, under _cond
        self._health: dict[str, dict[str, str]] = {}  # resource -> device ID -> health
        self._numa: dict[str, dict[str, tuple[int, ...]]] = {}  # resource -> ID -> NUMA nodes
        self._stopped_at: dict[str, float] = {}  # resource -> when its plugin went away
        self._entries: dict[tuple[str, str, str], checkpoint.PodDeviceEntry] = {}
        self._pods: dict[str, Pod] = {}  # uid -> pod
        self._pod_status: dict[str, list[dict[str, Any]]] = {}  # uid -> containerStatuses
        self._sync_stop = threading.Event()
        self._sync_thread: threading.Thread | None = None

    # -- the kubelet's side of Register ----------------------------------------------------

    @staticmethod
    def check(request: pb.RegisterRequest) -> str | None:
        if request.version not in SUPPORTED_VERSIONS:
            return f"unsupported device plugin API version {request.version!r}"
        if not request.endpoint or "/" in request.endpoint:
            return f"invalid endpoint {request.endpoint!r}: a file name in the device plugin folder"
        problem = resource_name_problem(request.resource_name)
        if problem:
            return f"invalid extended resource name {request.resource_name!r}: {problem}"
        return None

    def accept(self, request: pb.RegisterRequest) -> None:
        registered = pb.RegisterRequest()
        registered.CopyFrom(request)
        with self._cond:
            old = self.plugins.get(request.resource_name)
            self.registrations.append((time.time(), registered))
            self.plugins[request.resource_name] = PluginClient(
                self.plugin_dir, registered, self._on_update
            )
            self._stopped_at.pop(request.resource_name, None)
            if old is not None:  # replaced, not closed: its stream runs until the plugin ends it
                self._replaced.append(old)
            self._cond.notify_all()

    def _on_update(self, plugin: PluginClient, update: Update | None) -> None:
        """The device manager's callback: a new list replaces the resource's devices; a stream
        that ended marks them all Unhealthy (the kubelet's PluginDisconnected)."""
        dropped = None
        with self._cond:
            current = self.plugins.get(plugin.resource)
            if update is not None:  # a replaced plugin's lists count too (one resource, one list)
                self._health[plugin.resource] = dict(update.devices)
                self._numa[plugin.resource] = dict(update.numa)
            elif current is not None:
                # the stream of the current plugin, or of a replaced one, ended: the kubelet
                # disconnects the plugin current for the resource either way
                devices = self._health.get(plugin.resource, {})
                self._health[plugin.resource] = dict.fromkeys(devices, UNHEALTHY)
                self._stopped_at[plugin.resource] = time.monotonic()
                if current is not plugin:
                    dropped = self.plugins.pop(plugin.resource)
                    self.disconnects.append((time.time(), dropped.endpoint))
            if plugin in self._replaced and update is None:
                self._replaced.remove(plugin)
            self._write_checkpoint()
            self._cond.notify_all()
        if dropped is not None:
            threading.Thread(target=dropped.close, daemon=True).start()
        self._publish_pods()

    # -- allocation -----------------------------------------------------------------------

    def admit(
        self,
        namespace: str,
        name: str,
        containers: Mapping[str, Mapping[str, int]],
        uid: str | None = None,
    ) -> dict[str, dict[str, pb.ContainerAllocateResponse]]:
        """Admit a pod: for each container and resource, reuse the checkpointed devices or pick
        free healthy ones and call Allocate; returns container -> resource -> the answer."""
        if uid is None and self.api is not None:
            found = self.api.get("pods", name, namespace)
            uid = found["metadata"]["uid"] if found else None
        pod = Pod(
            namespace,
            name,
            uid or str(uuidlib.uuid4()),
            {c: dict(r) for c, r in containers.items()},
        )
        answers: dict[str, dict[str, pb.ContainerAllocateResponse]] = {}
        self._update_allocated_devices(admitting=pod.uid)
        try:
            for container, wanted in pod.containers.items():
                for resource, count in wanted.items():
                    answer = self._allocate(pod, container, resource, count)
                    answers.setdefault(container, {})[resource] = answer
        except AdmissionError:
            with self._cond:  # the kubelet releases what this pod got before the refusal
                for key in [k for k in self._entries if k[0] == pod.uid]:
                    del self._entries[key]
                self._write_checkpoint()
            raise
        with self._cond:
            self._pods[pod.uid] = pod
        self._publish_pods()
        return answers

    def _allocate(
        self, pod: Pod, container: str, resource: str, count: int
    ) -> pb.ContainerAllocateResponse:
        key = (pod.uid, container, resource)
        with self._cond:
            entry = self._entries.get(key)
            if entry is not None:  # allocated before (a restart): the checkpointed answer
                return _decode(entry.alloc_resp)
            plugin = self.plugins.get(resource)
            if plugin is None or resource in self._stopped_at:
                raise AdmissionError(f"no device plugin registered for {resource}")
            health = self._health.get(resource, {})
            in_use = {
                i for e in self._entries.values() if e.resource == resource for i in e.device_ids
            }
            free = [i for i, h in health.items() if h == HEALTHY and i not in in_use]
        if len(free) < count:
            raise AdmissionError(
                f"requested number of devices unavailable for {resource}. "
                f"Requested: {count}, Available: {len(free)}"
            )
        chosen = sorted(free)[:count]
        if plugin.registered_options.get_preferred_allocation_available:
            try:
                preferred = plugin.preferred(free, [], count)
            except grpc.RpcError as exc:
                raise AdmissionError(f"GetPreferredAllocation for {resource}: {exc}") from exc
            if len(set(preferred)) == count and set(preferred) <= set(free):
                chosen = preferred
        try:
            response = plugin.allocate(chosen)
        except grpc.RpcError as exc:
            raise AdmissionError(f"Allocate for {resource} failed: {exc.details()}") from exc
        answer = response.container_responses[0]
        with self._cond:
            numa = self._numa.get(resource, {})
            self._entries[key] = checkpoint.PodDeviceEntry(
                pod.uid,
                container,
                resource,
                tuple(chosen),
                answer.SerializeToString(),
                tuple((i, numa[i]) for i in chosen if numa.get(i)),
            )
            self._write_checkpoint()
        return answer

    def container_options(
        self, uid: str, container: str
    ) -> dict[str, pb.ContainerAllocateResponse]:
        """What a (re)starting container gets: the checkpointed answers, no Allocate call."""
        with self._cond:
            return {
                e.resource: _decode(e.alloc_resp)
                for (pod_uid, name, _), e in self._entries.items()
                if (pod_uid, name) == (uid, container)
            }

    def remove_pod(self, namespace: str, name: str) -> None:
        """The pod is deleted: no longer active, so pod-resources stops listing it. Its devices
        are freed, and its checkpoint entries dropped, only at the next allocation, as the
        kubelet's device manager does (``UpdateAllocatedDevices`` prunes inactive pods in
        memory before allocating; the file is rewritten only by an allocation or a plugin's
        device update): until then the checkpoint still names the deleted pod's UID."""
        with self._cond:
            uids = {
                uid for uid, p in self._pods.items() if (p.namespace, p.name) == (namespace, name)
            }
            for uid in uids:
                self._pods.pop(uid, None)
                self._pod_status.pop(uid, None)
        self._publish_pods()

    def _update_allocated_devices(self, admitting: str) -> None:
        """The device manager's UpdateAllocatedDevices: forget the devices of pods no longer
        active (not the one being admitted), in memory; the next checkpoint write has them
        gone."""
        with self._cond:
            active = {*self._pods, admitting}
            for key in [k for k in self._entries if k[0] not in active]:
                del self._entries[key]

    def pod_uid(self, namespace: str, name: str) -> str | None:
        with self._cond:
            return next(
                (u for u, p in self._pods.items() if (p.namespace, p.name) == (namespace, name)),
                None,
            )

    def allocated(self, namespace: str, name: str) -> dict[str, dict[str, tuple[str, ...]]]:
        """container -> resource -> device IDs of a pod (what pod-resources List answers)."""
        uid = self.pod_uid(namespace, name)
        with self._cond:
            out: dict[str, dict[str, tuple[str, ...]]] = {}
            for (pod_uid, container, resource), e in self._entries.items():
                if pod_uid == uid:
                    out.setdefault(container, {})[resource] = e.device_ids
            return out

    def _write_checkpoint(self) -> None:
        """Under _cond: the entries and each resource's devices, as the kubelet writes them."""
        registered = {r: sorted(d) for r, d in self._health.items()}
        checkpoint.write(self.checkpoint_path, list(self._entries.values()), registered)

    def _read_checkpoint(self) -> None:
        try:
            entries, registered = checkpoint.read(self.checkpoint_path)
        except checkpoint.CorruptCheckpointError as exc:
            log.error("Continue after failing to read checkpoint file: %s", exc)
            entries, registered = [], {}
        with self._cond:
            self._entries = {(e.pod_uid, e.container, e.resource): e for e in entries}
            # registered resources come back with no devices until their plugin lists them
            self._health = {r: {} for r in registered}
            self._stopped_at = dict.fromkeys(registered, time.monotonic())

    # -- pod status (KEP-4680) and pod-resources -------------------------------------------

    def resource_health(self, namespace: str, name: str) -> dict[str, dict[str, str]]:
        """container -> device ID -> health, as allocatedResourcesStatus says now."""
        uid = self.pod_uid(namespace, name)
        with self._cond:
            statuses = copy.deepcopy(self._pod_status.get(uid or "", []))
        return {
            s["name"]: {
                r["resourceID"]: r["health"]
                for group in s.get("allocatedResourcesStatus", [])
                for r in group["resources"]
            }
            for s in statuses
        }

    def _container_statuses(self, pod: Pod) -> list[dict[str, Any]]:
        """Under _cond."""
        statuses = []
        for container in pod.containers:
            groups = []
            for (uid, name, resource), e in sorted(self._entries.items()):
                if (uid, name) != (pod.uid, container):
                    continue
                health = self._health.get(resource, {})
                groups.append(
                    {
                        "name": resource,
                        "resources": [
                            {"resourceID": i, "health": health.get(i, UNKNOWN)}
                            for i in e.device_ids
                        ],
                    }
                )
            status: dict[str, Any] = {"name": container, "ready": True, "started": True}
            if groups:
                status["allocatedResourcesStatus"] = groups
            statuses.append(status)
        return statuses

    def _publish_pods(self) -> None:
        """Pod statuses whose resource health changed go out at once (the status manager),
        and the pod-resources server answers the allocations as they are now."""
        changed: list[tuple[Pod, list[dict[str, Any]]]] = []
        with self._cond:
            for uid, pod in self._pods.items():
                statuses = self._container_statuses(pod)
                if statuses != self._pod_status.get(uid):
                    self._pod_status[uid] = statuses
                    changed.append((pod, statuses))
            # every admitted pod and each of its containers, in spec order, devices or not:
            # what the kubelet's List answers (it has no UIDs: those are in the checkpoint)
            assignments = []
            for uid, p in self._pods.items():
                for container in p.containers:
                    held = [
                        Assignment(p.namespace, p.name, container, resource, e.device_ids)
                        for (pod_uid, name, resource), e in self._entries.items()
                        if (pod_uid, name) == (uid, container)
                    ]
                    assignments += held or [Assignment(p.namespace, p.name, container, "", ())]
            allocatable = {r: sorted(d) for r, d in self._health.items()}
        if self._pod_resources is not None:
            self._pod_resources.set_assignments(assignments)
            for resource, ids in allocatable.items():
                self._pod_resources.set_allocatable(resource, ids)
        if self.api is not None:
            for pod, statuses in changed:
                self._patch_pod_status(pod, statuses)

    def _patch_pod_status(self, pod: Pod, statuses: list[dict[str, Any]]) -> None:
        from gpuquota.sim.apiserver import RESOURCES, ApiError

        assert self.api is not None
        current = self.api.get("pods", pod.name, pod.namespace)
        if current is None or current["metadata"]["uid"] != pod.uid:
            return
        old = {
            s.get("name"): s for s in (current.get("status") or {}).get("containerStatuses") or []
        }
        merged = []
        for status in statuses:
            entry = dict(old.get(status["name"], {}))
            entry.pop("allocatedResourcesStatus", None)
            entry.update(status)
            merged.append(entry)
        body = {"status": {"phase": "Running", "containerStatuses": merged}}
        try:
            self.api.patch(
                RESOURCES["pods"], pod.namespace, pod.name, body, "application/merge-patch+json"
            )
        except ApiError as exc:
            log.info("pod status of %s/%s not written: %s", pod.namespace, pod.name, exc)

    # -- node status ------------------------------------------------------------------------

    def sync_node_status(self) -> NodeStatus:
        """One node status sync: capacity and allocatable as the device manager counts them
        now (GetCapacity), published to ``node_status`` and the apiserver's Node."""
        now = time.monotonic()
        capacity: dict[str, int] = {}
        allocatable: dict[str, int] = {}
        with self._cond:
            for resource, devices in list(self._health.items()):
                stopped = self._stopped_at.get(resource)
                if stopped is not None and now - stopped >= self.endpoint_grace_s:
                    del self._health[resource]
                    del self._stopped_at[resource]
                    capacity[resource] = allocatable[resource] = 0  # removed: reads 0
                    continue
                capacity[resource] = len(devices)
                allocatable[resource] = sum(h == HEALTHY for h in devices.values())
            for resource in self.node_status.capacity:
                capacity.setdefault(resource, 0)
                allocatable.setdefault(resource, 0)
            self.node_status = NodeStatus(time.time(), capacity, allocatable)
            self._cond.notify_all()
        if self.api is not None:
            self._patch_node_status(capacity, allocatable)
        return self.node_status

    def _patch_node_status(self, capacity: dict[str, int], allocatable: dict[str, int]) -> None:
        from gpuquota.sim.apiserver import RESOURCES, ApiError

        assert self.api is not None
        body = {
            "status": {
                "capacity": {r: str(n) for r, n in capacity.items()},
                "allocatable": {r: str(n) for r, n in allocatable.items()},
            }
        }
        try:
            self.api.patch(
                RESOURCES["nodes"], "", self.node_name, body, "application/merge-patch+json"
            )
        except ApiError as exc:
            log.info("node status not written: %s", exc)

    def wait_for_node_status(
        self, predicate: Callable[[NodeStatus], bool], timeout: float = 5.0
    ) -> NodeStatus | None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(self.node_status):
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            return self.node_status

    def _sync_loop(self) -> None:
        while not self._sync_stop.wait(self.node_status_sync_s):
            try:
                self.sync_node_status()
            except Exception:  # keep syncing whatever one round hit
                log.exception("node status sync failed")

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._read_checkpoint()
        self.socket_path.unlink(missing_ok=True)
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="kubelet")
        )
        pb_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        if server.add_insecure_port(f"unix:{self.socket_path}") == 0:
            raise OSError(f"cannot listen on {self.socket_path}")
        server.start()
        self._server = server
        if self.pod_resources_socket is not None:
            self._pod_resources = PodResourcesServer(self.pod_resources_socket).start()
            self._publish_pods()
        self._sync_stop.clear()
        self._sync_thread = threading.Thread(
            target=self._sync_loop, name="kubelet-node-status", daemon=True
        )
        self._sync_thread.start()

    def stop(self) -> None:
        self._sync_stop.set()
        if self._sync_thread is not None:
            self._sync_thread.join(timeout=5)
            self._sync_thread = None
        server, self._server = self._server, None
        if server is not None:
            server.stop(0).wait()
        if self._pod_resources is not None:
            self._pod_resources.stop()
            self._pod_resources = None
        with self._cond:
            plugins = list(self.plugins.values()) + self._replaced
            self.plugins.clear()
            self._replaced = []
        for plugin in plugins:
            plugin.close()
        self.socket_path.unlink(missing_ok=True)

    def restart(self, wipe_plugin_sockets: bool = True) -> None:
        """Like a kubelet restart: drop connections, remove kubelet.sock (and, as the kubelet's
        device manager does at start, every other socket in the folder), read the checkpoint
        back, then serve again. Running pods keep their devices."""
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


def _decode(raw: bytes) -> pb.ContainerAllocateResponse:
    answer = pb.ContainerAllocateResponse()
    answer.ParseFromString(raw)
    return answer


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--dir", type=Path, required=True, help="device plugin folder (holds kubelet.sock)"
    )
    parser.add_argument(
        "--root-dir",
        type=Path,
        help="serve pod-resources on <root-dir>/pod-resources/kubelet.sock (not --dir's parent)",
    )
    args = parser.parse_args(argv)
    if not args.dir.is_dir():
        parser.error(f"--dir {args.dir} is not a folder")
    logging.basicConfig(level=logging.INFO)
    kubelet = KubeletStandIn(args.dir, root_dir=args.root_dir)
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
