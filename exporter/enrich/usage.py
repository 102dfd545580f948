"""Per-pod GPU usage as a pure join: each GPU process -> its pod, summed per pod and device.

NVML lists the processes on each GPU (framebuffer per process) and their SM and memory
utilisation (exporter/collect/profiling.py). The enricher maps each process to its owner
(``pod``: its cgroup names a pod UID; ``host``: a cgroup with no pod; ``unknown``: a process
/proc does not show us) and sums per owner and device, so time-sliced and MPS GPUs show who
uses what. A pod is always named by its UID (``pod_uid``) and, where the node can tell, by
namespace and name (exporter/enrich/poddirectory.py: the kubelet's pod-resources answer and
device checkpoint, never the API server's pods). Its container is the one of that pod the
attribution (``NodeSnapshot.pods``) puts on the device, or the pod's only container; "" when
several could be. Its inputs are read elsewhere: /proc (exporter/enrich/procfs.py) and the
pod directory, refreshed with each pod-resources answer.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from gpuquota.exporter.enrich.cgroup import CgroupPod
from gpuquota.exporter.enrich.podnames import PodName
from gpuquota.exporter.snapshot import DeviceSnapshot, NodeSnapshot, PodRef, PodUsage

OWNER_POD = "pod"
OWNER_HOST = "host"
OWNER_UNKNOWN = "unknown"


class Processes(Protocol):
    def pod_of(self, pid: int) -> tuple[bool, CgroupPod | None]: ...


class Pods(Protocol):
    def lookup(self, uid: str) -> PodName | None: ...


Owner = tuple[str, str, str, str, str]  # (owner, namespace, pod, container, pod UID)


class PodUsageEnricher:
    """CollectLoop enricher: fills ``NodeSnapshot.pod_usage``."""

    def __init__(self, procs: Processes, directory: Pods) -> None:
        self.procs = procs
        self.directory = directory

    def owner(self, pid: int, holders: tuple[PodRef, ...] = ()) -> Owner:
        """Who one process belongs to; ``holders``: the containers holding its device."""
        visible, cgroup = self.procs.pod_of(pid)
        if not visible:
            return OWNER_UNKNOWN, "", "", "", ""
        if cgroup is None:
            return OWNER_HOST, "", "", "", ""
        uid = cgroup.pod_uid
        name = self.directory.lookup(uid)
        if name is None:
            return OWNER_POD, "", "", "", uid
        on_device = {
            r.container for r in holders if (r.namespace, r.pod) == (name.namespace, name.pod)
        }
        container = next(iter(on_device)) if len(on_device) == 1 else name.only_container
        return OWNER_POD, name.namespace, name.pod, container, uid

    def usage(
        self, device: DeviceSnapshot, holders: tuple[PodRef, ...] = ()
    ) -> tuple[PodUsage, ...]:
        if device.mig is None and device.mig_mode_enabled:
            return ()  # a MIG-enabled GPU's processes are its instances', counted there
        memory: dict[int, int | None] = {}
        for proc in device.processes:  # a pid listed as compute and graphics: one allocation
            prev, used = memory.get(proc.pid), proc.used_memory_bytes
            memory[proc.pid] = used if prev is None else prev if used is None else max(prev, used)
        utilization = {u.pid: u for u in device.process_utilization or ()}
        groups: dict[Owner, list[int]] = {}
        for pid in sorted(set(memory) | set(utilization)):
            groups.setdefault(self.owner(pid, holders), []).append(pid)
        out = []
        for (owner, namespace, pod, container, uid), pids in sorted(groups.items()):
            known = [m for m in (memory.get(p) for p in pids) if m is not None]
            has_util = device.process_utilization is not None
            sm = sum(utilization[p].sm_ratio for p in pids if p in utilization)
            new = [utilization[p] for p in pids if p in utilization]
            # several processes of one pod: at most the whole GPU for the time they cover
            sampled = min(
                sum(u.sm_seconds for u in new), max((u.sampled_seconds for u in new), default=0.0)
            )
            mem = sum(utilization[p].memory_ratio for p in pids if p in utilization)
            out.append(
                PodUsage(
                    owner=owner,
                    namespace=namespace,
                    pod=pod,
                    container=container,
                    processes=sum(1 for p in pids if p in memory),
                    memory_used_bytes=sum(known) if known else None,
                    sm_ratio=min(sm, 1.0) if has_util else None,
                    sm_seconds_sampled=sampled if has_util else None,
                    memory_ratio=min(mem, 1.0) if has_util else None,
                    pod_uid=uid,
                )
            )
        return tuple(out)

    def __call__(self, snapshot: NodeSnapshot) -> NodeSnapshot:
        usage = {}
        for device in snapshot.devices:
            found = self.usage(device, snapshot.pods.get(device.uuid, ()))
            if found:
                usage[device.uuid] = found
        return replace(snapshot, pod_usage=usage)
