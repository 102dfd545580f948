"""A kubelet pod-resources v1 server stand-in on a unix socket.

It speaks the real gRPC API (``v1.PodResourcesLister``: List, GetAllocatableResources, Get)
from exporter/kubeletapi/podresources_v1.proto, so the exporter's client runs unchanged
against it. Tests and the demo decide which containers hold which devices (whole GPUs,
time-sliced replicas ``UUID::N``, MIG devices) and can make the server fail or stall.

DRA allocations (a container's ResourceClaims) are answered as ``dynamic_resources``, exactly
as a kubelet with DRA does: claim name and namespace, and per device the driver, pool, device
name and CDI device ids (:class:`ClaimAssignment`, :meth:`PodResourcesServer.assign_claim`).

Given a ``checkpoint`` path, it also writes the kubelet device manager's checkpoint
(sim/kubelet/checkpoint.py) for the assignments that carry a pod ``uid``, whenever they change:
how a node ties the UIDs to the names List gives (the full kubelet stand-in,
sim/kubelet/registration.py, writes it from its own allocations instead).

Run it on its own: ``python -m gpuquota.sim.kubelet.podresources --socket PATH --assignments FILE``
where FILE is a JSON list of ``{"namespace", "pod", "container", "resource", "device_ids"}``
(and optionally ``"uid"``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from gpuquota.exporter.kubeletapi import podresources_v1_pb2 as pb
from gpuquota.exporter.kubeletapi import podresources_v1_pb2_grpc as pb_grpc
from gpuquota.sim.kubelet import checkpoint

GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True, slots=True)
class Assignment:
    """Devices of one resource that the kubelet gave to one container. With ``resource`` ""
    and no ids: a container that holds no device, listed all the same (the kubelet's List
    names every container of every active pod)."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]
    uid: str = ""  # the pod's UID: what the device checkpoint keys it by (List has none)

    @classmethod
    def from_json(cls, raw: Any) -> Assignment:
        if not isinstance(raw, dict):
            raise ValueError(f"assignment must be a JSON object, got {raw!r}")
        missing = {"namespace", "pod", "container", "resource", "device_ids"} - raw.keys()
        if missing:
            raise ValueError(f"assignment {raw!r} lacks {sorted(missing)}")
        ids = raw["device_ids"]
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise ValueError(f"device_ids must be a list of strings in {raw!r}")
        return cls(
            str(raw["namespace"]),
            str(raw["pod"]),
            str(raw["container"]),
            str(raw["resource"]),
            tuple(ids),
            str(raw.get("uid") or ""),
        )


@dataclass(frozen=True, slots=True)
class ClaimAssignment:
    """One ResourceClaim's devices as a container sees them through pod-resources.

    ``devices`` are ``(driver, pool, device)`` triplets; CDI ids follow the NVIDIA driver's
    ``k8s.gpu.nvidia.com/device=<device>`` form unless given.
    """

    namespace: str
    pod: str
    container: str
    claim_name: str
    claim_namespace: str
    devices: tuple[tuple[str, str, str], ...]
    cdi_devices: tuple[str, ...] = ()

    def message(self) -> pb.DynamicResource:
        return pb.DynamicResource(
            claim_name=self.claim_name,
            claim_namespace=self.claim_namespace,
            claim_resources=[
                pb.ClaimResource(
                    cdi_devices=[
                        pb.CDIDevice(name=n)
                        for n in (self.cdi_devices or (f"k8s.{driver}/device={device}",))
                    ],
                    driver_name=driver,
                    pool_name=pool,
                    device_name=device,
                )
                for driver, pool, device in self.devices
            ],
        )


def time_sliced(
    gpu_uuids: Sequence[str], pods_per_gpu: int, namespace: str = "default"
) -> list[Assignment]:
    """Every GPU shared by ``pods_per_gpu`` pods, each holding one replica ``UUID::N``."""
    return [
        Assignment(namespace, f"shared-{g}-{r}", "main", GPU_RESOURCE, (f"{uuid}::{r}",))
        for g, uuid in enumerate(gpu_uuids)
        for r in range(pods_per_gpu)
    ]


def one_pod_each(
    device_uuids: Sequence[str], resource: str, namespace: str = "default"
) -> list[Assignment]:
    """One single-container pod per device (whole GPUs or MIG devices)."""
    return [
        Assignment(namespace, f"pod-{i}", "main", resource, (uuid,))
        for i, uuid in enumerate(device_uuids)
    ]


def node_assignments(
    gpu_uuids: Sequence[str],
    mig_uuids: Sequence[str] = (),
    *,
    shared_gpus: int = 1,
    replicas: int = 3,
    mig_resource: str = "nvidia.com/mig-1g.5gb",
) -> list[Assignment]:
    """A plausible node for the demo: the first ``shared_gpus`` whole GPUs time-sliced among
    ``replicas`` inference pods each, the other whole GPUs one training pod each, and every
    MIG device one research pod each. Pass only GPUs without MIG as ``gpu_uuids``."""
    shared, whole = gpu_uuids[:shared_gpus], gpu_uuids[shared_gpus:]
    return [
        *[
            Assignment("inference", f"infer-{g}-{r}", "server", GPU_RESOURCE, (f"{uuid}::{r}",))
            for g, uuid in enumerate(shared)
            for r in range(replicas)
        ],
        *[
            Assignment("training", f"train-{i}", "trainer", GPU_RESOURCE, (uuid,))
            for i, uuid in enumerate(whole)
        ],
        *[
            Assignment("research", f"notebook-{i}", "jupyter", mig_resource, (uuid,))
            for i, uuid in enumerate(mig_uuids)
        ],
    ]


class _Lister(pb_grpc.PodResourcesListerServicer):
    def __init__(self, owner: PodResourcesServer) -> None:
        self._owner = owner

    def List(  # noqa: N802
        self, request: pb.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> pb.ListPodResourcesResponse:
        self._owner.before_call(context)
        return pb.ListPodResourcesResponse(pod_resources=self._owner.pod_resources())

    def GetAllocatableResources(  # noqa: N802
        self, request: pb.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> pb.AllocatableResourcesResponse:
        self._owner.before_call(context)
        return pb.AllocatableResourcesResponse(devices=self._owner.allocatable_devices())

    def Get(  # noqa: N802
        self, request: pb.GetPodResourcesRequest, context: grpc.ServicerContext
    ) -> pb.GetPodResourcesResponse:
        self._owner.before_call(context)
        for pod in self._owner.pod_resources():
            if pod.name == request.pod_name and pod.namespace == request.pod_namespace:
                return pb.GetPodResourcesResponse(pod_resources=pod)
        context.set_code(grpc.StatusCode.NOT_FOUND)
        context.set_details(f"pod {request.pod_namespace}/{request.pod_name} not found")
        return pb.GetPodResourcesResponse()


class PodResourcesServer:
    """The stand-in server. Use as a context manager or call start()/stop()."""

    def __init__(
        self,
        socket_path: Path,
        assignments: Iterable[Assignment] = (),
        *,
        checkpoint: Path | None = None,
    ) -> None:
        self.socket_path = socket_path
        self.checkpoint = checkpoint
        self._lock = threading.Lock()
        self._assignments: list[Assignment] = list(assignments)
        self._claims: list[ClaimAssignment] = []
        self._allocatable: dict[str, list[str]] = {}
        self._fail_code: grpc.StatusCode | None = None
        self._fail_remaining = 0
        self._delay = 0.0
        self.calls = 0
        self._server: grpc.Server | None = None

    # -- what tests and the demo control -----------------------------------------------------

    def set_assignments(self, assignments: Iterable[Assignment]) -> None:
        with self._lock:
            self._assignments = list(assignments)
            self._write_checkpoint()

    def assign(
        self,
        namespace: str,
        pod: str,
        container: str,
        resource: str,
        *device_ids: str,
        uid: str = "",
    ) -> None:
        with self._lock:
            self._assignments.append(
                Assignment(namespace, pod, container, resource, device_ids, uid)
            )
            self._write_checkpoint()

    def _write_checkpoint(self) -> None:
        """Under _lock: the device manager's checkpoint for the assignments with a UID."""
        if self.checkpoint is None:
            return
        held = [a for a in self._assignments if a.uid and a.resource]
        entries = [
            checkpoint.PodDeviceEntry(a.uid, a.container, a.resource, a.device_ids, b"")
            for a in held
        ]
        registered: dict[str, list[str]] = {}
        for a in held:
            registered.setdefault(a.resource, []).extend(a.device_ids)
        checkpoint.write(self.checkpoint, entries, registered)

    def assign_claim(self, claim: ClaimAssignment) -> None:
        """A container holds a DRA claim's devices (several pods may share one claim)."""
        with self._lock:
            self._claims.append(claim)

    def set_claims(self, claims: Iterable[ClaimAssignment]) -> None:
        with self._lock:
            self._claims = list(claims)

    def remove_pod(self, namespace: str, pod: str) -> None:
        with self._lock:
            self._assignments = [
                a for a in self._assignments if (a.namespace, a.pod) != (namespace, pod)
            ]
            self._claims = [c for c in self._claims if (c.namespace, c.pod) != (namespace, pod)]
            self._write_checkpoint()

    def set_allocatable(self, resource: str, device_ids: Sequence[str]) -> None:
        with self._lock:
            self._allocatable[resource] = list(device_ids)

    def fail(self, code: grpc.StatusCode | None, times: int = -1) -> None:
        """Answer the next ``times`` calls (-1: every call) with ``code``; None heals."""
        with self._lock:
            self._fail_code = code
            self._fail_remaining = times if code is not None else 0

    def stall(self, seconds: float) -> None:
        """Sleep this long before answering (to run past a client's deadline)."""
        self._delay = seconds

    # -- server plumbing -----------------------------------------------------------------

    def before_call(self, context: grpc.ServicerContext) -> None:
        with self._lock:
            self.calls += 1
            code = self._fail_code
            if code is not None and self._fail_remaining != 0:
                if self._fail_remaining > 0:
                    self._fail_remaining -= 1
            else:
                code = None
        if self._delay:
            time.sleep(self._delay)
        if code is not None:
            context.abort(code, "injected failure (sim kubelet)")

    def pod_resources(self) -> list[pb.PodResources]:
        with self._lock:
            assignments = list(self._assignments)
            claims = list(self._claims)
        pods: dict[tuple[str, str], dict[str, pb.ContainerResources]] = {}
        for a in assignments:
            containers = pods.setdefault((a.namespace, a.pod), {})
            container = containers.setdefault(a.container, pb.ContainerResources(name=a.container))
            if a.resource:
                container.devices.append(
                    pb.ContainerDevices(resource_name=a.resource, device_ids=a.device_ids)
                )
        for c in claims:
            containers = pods.setdefault((c.namespace, c.pod), {})
            container = containers.setdefault(c.container, pb.ContainerResources(name=c.container))
            container.dynamic_resources.append(c.message())
        return [
            pb.PodResources(name=name, namespace=namespace, containers=list(containers.values()))
            for (namespace, name), containers in pods.items()
        ]

    def allocatable_devices(self) -> list[pb.ContainerDevices]:
        with self._lock:
            return [
                pb.ContainerDevices(resource_name=r, device_ids=ids)
                for r, ids in self._allocatable.items()
            ]

    def start(self) -> PodResourcesServer:
        with self._lock:
            self._write_checkpoint()
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_PodResourcesListerServicer_to_server(_Lister(self), server)
        if server.add_insecure_port(f"unix://{self.socket_path.absolute()}") == 0:
            raise OSError(f"cannot listen on unix socket {self.socket_path}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        """Stop serving and remove the socket (as a kubelet going away does)."""
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None
        self.socket_path.unlink(missing_ok=True)

    def __enter__(self) -> PodResourcesServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def load_assignments(path: Path) -> list[Assignment]:
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise SystemExit(f"cannot read assignments from {path}: {err}") from err
    if not isinstance(raw, list):
        raise SystemExit(f"{path}: expected a JSON list of assignments")
    try:
        return [Assignment.from_json(item) for item in raw]
    except ValueError as err:
        raise SystemExit(f"{path}: {err}") from err


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", type=Path, required=True, help="unix socket to serve on")
    parser.add_argument("--assignments", type=Path, help="JSON list of device assignments")
    args = parser.parse_args(argv)
    assignments = load_assignments(args.assignments) if args.assignments else []
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    with PodResourcesServer(args.socket, assignments):
        print(f"pod-resources stand-in on {args.socket} (pid {os.getpid()})", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            done.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
