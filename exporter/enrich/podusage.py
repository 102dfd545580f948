"""Per-pod GPU usage: which pod each GPU process belongs to, and what each pod uses.

NVML lists the processes on each GPU (framebuffer per process) and their SM and memory
utilisation (exporter/collect/profiling.py). This enricher maps each process to its pod and sums
per pod and device, so time-sliced and MPS GPUs show who uses what:

1. ``/proc/<pid>/cgroup`` names the pod: the kubelet puts every container in a cgroup under
   ``kubepods`` whose path carries ``pod<UID>`` (cgroupfs driver) or
   ``kubepods-<qos>-pod<UID_with_underscores>.slice`` (systemd driver), then the container
   id (``<id>``, ``cri-containerd-<id>.scope``, ``crio-<id>.scope``, ``docker-<id>.scope``),
   in cgroup v1 (one line per hierarchy) and v2 (``0::/...``) alike. A process whose
   cgroup has no pod is a host process (owner ``host``).
2. The pod UID and container id become namespace/pod/container through the pods on this
   node (``PodDirectory``, listed from the API server by ``spec.nodeName`` in the background;
   neither the cgroup nor the kubelet's pod-resources answer carries the other half). A UID
   not (yet) on that list is owner ``unknown``.

NVML reports PIDs in the exporter's PID namespace, and ``/proc`` shows only that namespace's
processes: both need the host PID namespace (``hostPID: true``, the pod-usage overlay in
deploy/overlays/pod-usage). The /proc root is a parameter (``--proc-root``), so tests can
point it at a proc tree they build.
"""

from __future__ import annotations

import argparse
import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpuquota.exporter.snapshot import DeviceSnapshot, NodeSnapshot, PodUsage

log = logging.getLogger(__name__)

_UID = r"[0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12}"
# "pod<uid>" as a path segment or inside a systemd slice name, then the container's segment.
_POD = re.compile(rf"(?:^|[/-])pod({_UID})(?:\.slice)?(?:/([^/\n]*))?")
_CONTAINER_ID = re.compile(r"(?:^|[-:])([0-9a-fA-F]{64})(?:\.scope)?$")

OWNER_POD = "pod"
OWNER_HOST = "host"
OWNER_UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class CgroupPod:
    """What a process's cgroup says about its pod."""

    pod_uid: str  # with dashes, lower case
    container_id: str | None  # 64 hex digits, when the path names the container


def parse_cgroup(text: str) -> CgroupPod | None:
    """The pod (and container) a /proc/<pid>/cgroup names; None for a process of no pod."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        match = _POD.search(path)
        if match is None:
            continue
        uid = match.group(1).replace("_", "-").lower()
        container = None
        segment = match.group(2) or ""
        found = _CONTAINER_ID.search(segment)
        if found is not None:
            container = found.group(1).lower()
        return CgroupPod(pod_uid=uid, container_id=container)
    return None


class ProcReader:
    """Reads processes' cgroups under a /proc root (the host's, with hostPID)."""

    def __init__(self, root: Path = Path("/proc")) -> None:
        self.root = root

    def pod_of(self, pid: int) -> tuple[bool, CgroupPod | None]:
        """(visible, pod): visible is False when /proc has no such process for us."""
        try:
            text = (self.root / str(pid) / "cgroup").read_text(errors="replace")
        except OSError:
            return False, None
        return True, parse_cgroup(text)


@dataclass(frozen=True, slots=True)
class PodName:
    namespace: str
    pod: str
    containers: Mapping[str, str]  # container id -> container name
    only_container: str  # the name when the pod has exactly one container, else ""


PodLister = Callable[[], Iterable[Any]]  # returns V1Pod-like objects of this node


def pod_names(pods: Iterable[Any]) -> dict[str, PodName]:
    """pod UID -> its names, from V1Pod objects (or anything shaped like them)."""
    out: dict[str, PodName] = {}
    for pod in pods:
        meta, spec, status = pod.metadata, pod.spec, pod.status
        containers: dict[str, str] = {}
        statuses = [
            *(getattr(status, "container_statuses", None) or []),
            *(getattr(status, "init_container_statuses", None) or []),
            *(getattr(status, "ephemeral_container_statuses", None) or []),
        ]
        for cs in statuses:
            cid = (cs.container_id or "").rpartition("://")[2]
            if cid:
                containers[cid.lower()] = cs.name
        names = [c.name for c in (getattr(spec, "containers", None) or [])]
        out[str(meta.uid).lower()] = PodName(
            namespace=meta.namespace,
            pod=meta.name,
            containers=containers,
            only_container=names[0] if len(names) == 1 else "",
        )
    return out


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
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors_total = 0

    def refresh(self) -> bool:
        try:
            self._names = pod_names(self._lister())
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


class PodUsageEnricher:
    """CollectLoop enricher: fills ``NodeSnapshot.pod_usage``."""

    def __init__(self, procs: ProcReader, directory: PodDirectory) -> None:
        self.procs = procs
        self.directory = directory

    def owner(self, pid: int) -> tuple[str, str, str, str]:
        """(owner, namespace, pod, container) of one process."""
        visible, cgroup = self.procs.pod_of(pid)
        if not visible:
            return OWNER_UNKNOWN, "", "", ""
        if cgroup is None:
            return OWNER_HOST, "", "", ""
        name = self.directory.lookup(cgroup.pod_uid)
        if name is None:
            return OWNER_UNKNOWN, "", "", ""
        container = name.containers.get(cgroup.container_id or "", name.only_container)
        return OWNER_POD, name.namespace, name.pod, container

    def usage(self, device: DeviceSnapshot) -> tuple[PodUsage, ...]:
        if device.mig is None and device.mig_mode_enabled:
            return ()  # a MIG-enabled GPU's processes are its instances', counted there
        memory: dict[int, int | None] = {}
        for proc in device.processes:  # a pid listed as compute and graphics: one allocation
            prev, used = memory.get(proc.pid), proc.used_memory_bytes
            memory[proc.pid] = used if prev is None else prev if used is None else max(prev, used)
        utilization = {u.pid: u for u in device.process_utilization or ()}
        groups: dict[tuple[str, str, str, str], list[int]] = {}
        for pid in sorted(set(memory) | set(utilization)):
            groups.setdefault(self.owner(pid), []).append(pid)
        out = []
        for (owner, namespace, pod, container), pids in sorted(groups.items()):
            known = [m for m in (memory.get(p) for p in pids) if m is not None]
            has_util = device.process_utilization is not None
            sm = sum(utilization[p].sm_ratio for p in pids if p in utilization)
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
                    memory_ratio=min(mem, 1.0) if has_util else None,
                )
            )
        return tuple(out)

    def start(self) -> None:
        self.directory.start()

    def stop(self) -> None:
        self.directory.stop()

    def __call__(self, snapshot: NodeSnapshot) -> NodeSnapshot:
        usage = {}
        for device in snapshot.devices:
            found = self.usage(device)
            if found:
                usage[device.uuid] = found
        return replace(snapshot, pod_usage=usage)


# --- command line ----------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("per-pod usage (needs the host PID namespace)")
    group.add_argument(
        "--pod-usage",
        action="store_true",
        help="publish SM/memory utilisation and framebuffer use per pod per GPU "
        "(gpu_pod_*): needs hostPID, --node-name and read access to this node's pods",
    )
    group.add_argument(
        "--proc-root",
        type=Path,
        default=Path("/proc"),
        metavar="PATH",
        help="where processes' cgroups are read for --pod-usage (default /proc)",
    )


def lister_for_node(core_api: Any, node_name: str) -> PodLister:
    """Lists the pods bound to `node_name` through a kubernetes CoreV1Api."""

    def pods() -> Iterable[Any]:
        answer = core_api.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node_name}", _request_timeout=10
        )
        return list(answer.items)

    return pods


def from_args(
    args: argparse.Namespace, core_api: Callable[[Path | None], Any]
) -> PodUsageEnricher | None:
    """The enricher --pod-usage asks for (None without it). ValueError on bad flags."""
    if not args.pod_usage:
        return None
    if not args.node_name:
        raise ValueError("--pod-usage needs --node-name (or $NODE_NAME)")
    if not args.proc_root.is_dir():
        raise ValueError(f"--proc-root {args.proc_root}: no such folder")
    lister = lister_for_node(core_api(args.kubeconfig), args.node_name)
    return PodUsageEnricher(ProcReader(args.proc_root), PodDirectory(lister))
