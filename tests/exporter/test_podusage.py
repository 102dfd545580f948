"""Per-pod usage: cgroup parsing, and the collector + enricher against the NVML stand-in, a
proc tree built in tmp (test data: what /proc/<pid>/cgroup holds on real nodes), the
pod-resources stand-in over its socket and a device checkpoint as the kubelet writes it. No API
server: the agent names pods from the node alone (tests/exporter/test_node_pod_names.py runs
the whole program with pods forbidden)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuquota.exporter.cli import main as exporter_main
from gpuquota.exporter.collect.loop import CollectLoop
from gpuquota.exporter.collect.nvml import NvmlApi
from gpuquota.exporter.enrich.cgroup import CgroupPod, parse_cgroup
from gpuquota.exporter.enrich.poddirectory import PodDirectory
from gpuquota.exporter.enrich.podresources import PodResourcesWatcher
from gpuquota.exporter.enrich.procfs import ProcReader
from gpuquota.exporter.enrich.usage import PodUsageEnricher
from gpuquota.exporter.expose.render import Renderer
from gpuquota.sim.kubelet.checkpoint import CHECKPOINT_FILE, PodDeviceEntry
from gpuquota.sim.kubelet.checkpoint import write as write_checkpoint
from gpuquota.sim.kubelet.podresources import GPU_RESOURCE as GPU
from gpuquota.sim.kubelet.podresources import Assignment, PodResourcesServer
from gpuquota.sim.nvml.control import SimNode
from tests.exporter.scrape import parse, value

NvmlOn = Callable[[Any], tuple[SimNode, NvmlApi]]
UID_A = "6f1b3a8e-2c4d-4e5f-9a0b-1c2d3e4f5a6b"
UID_B = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
UID_GONE = "ffffffff-0000-4000-8000-000000000001"
CID = "4b6f0c2d9a8e7f1b3c5d7e9f0a2b4c6d8e0f1a3b5c7d9e1f2a4b6c8d0e2f4a6b"
CID2 = "a" * 64


def _systemd(uid: str, qos: str = "burstable") -> str:
    return f"kubepods-{qos}-pod{uid.replace('-', '_')}.slice"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # cgroup v2, systemd driver, containerd
        (f"0::/kubepods.slice/kubepods-burstable.slice/{_systemd(UID_A)}/cri-containerd-{CID}.scope\n",
         CgroupPod(UID_A, CID)),
        # cgroup v2, cgroupfs driver, guaranteed QoS (no QoS folder)
        (f"0::/kubepods/pod{UID_A}/{CID}\n", CgroupPod(UID_A, CID)),
        # cgroup v1, cgroupfs driver: one line per hierarchy
        (f"12:pids:/kubepods/besteffort/pod{UID_B}/{CID}\n11:memory:/kubepods/besteffort/pod{UID_B}/{CID}\n"
         "1:name=systemd:/kubepods/besteffort\n", CgroupPod(UID_B, CID)),
        # cgroup v1, systemd driver, CRI-O
        (f"9:cpu,cpuacct:/kubepods.slice/kubepods-besteffort.slice/{_systemd(UID_B, 'besteffort')}/crio-{CID}.scope\n",
         CgroupPod(UID_B, CID)),
        # docker via cri-dockerd, systemd driver
        (f"0::/kubepods.slice/{_systemd(UID_A, 'guaranteed')}/docker-{CID}.scope\n", CgroupPod(UID_A, CID)),
        # kind / nested kubelet: a prefix before kubepods
        (f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-{_systemd(UID_A, 'besteffort')}/cri-containerd-{CID}.scope\n",
         CgroupPod(UID_A, CID)),
        # the pod's own cgroup (no container segment)
        (f"0::/kubepods.slice/kubepods-burstable.slice/{_systemd(UID_A)}\n", CgroupPod(UID_A, None)),
        # host processes
        ("0::/system.slice/ollama.service\n", None),
        ("0::/user.slice/user-1000.slice/session-3.scope\n", None),
        ("12:memory:/\n", None),
    ],
)  # fmt: skip
def test_parse_cgroup(text: str, expected: CgroupPod | None) -> None:
    assert parse_cgroup(text) == expected


def _proc(root: Path, pid: int, cgroup: str) -> None:
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    (root / str(pid) / "cgroup").write_text(cgroup)


def _checkpoint(folder: Path, *held: tuple[str, str, str, tuple[str, ...]]) -> Path:
    """The kubelet's device checkpoint, as the kubelet stand-in writes it: (pod UID,
    container, resource, device ids) per entry."""
    path = folder / CHECKPOINT_FILE
    entries = [PodDeviceEntry(uid, c, r, ids, b"") for uid, c, r, ids in held]
    write_checkpoint(path, entries, {GPU: sorted({i for *_, ids in held for i in ids})})
    return path


def test_time_sliced_gpu_shows_each_pod_and_the_host(
    nvml_on: NvmlOn, tmp_path: Path, sim_dir: Path
) -> None:
    node, api = nvml_on("h100x8")
    proc = tmp_path / "proc"
    # GPU 0 time-sliced between two pods; pod A runs two processes; one host process; one
    # process of a pod that holds no GPU through the kubelet (sees GPUs by its environment);
    # one pid already gone.
    _proc(
        proc,
        101,
        f"0::/kubepods.slice/kubepods-burstable.slice/{_systemd(UID_A)}/cri-containerd-{CID}.scope\n",
    )
    _proc(
        proc,
        102,
        f"0::/kubepods.slice/kubepods-burstable.slice/{_systemd(UID_A)}/cri-containerd-{CID}.scope\n",
    )
    _proc(proc, 201, f"11:memory:/kubepods/besteffort/pod{UID_B}/{CID2}\n")
    _proc(proc, 301, "0::/system.slice/train.service\n")
    _proc(proc, 401, f"0::/kubepods/pod{UID_GONE}/{CID2}\n")
    for pid, gib, sm, mem in (
        (101, 10, 0.40, 0.10),
        (102, 6, 0.20, 0.05),
        (201, 20, 0.30, 0.20),
        (301, 1, 0.05, 0.01),
        (401, 2, 0.0, 0.0),
        (999, 3, 0.0, 0.0),
    ):
        node.add_process(0, pid, gib * 2**30)
        node.set_process_utilization(0, pid, sm=sm, memory=mem)  # fmt: skip
    gpu0 = node.uuid(0)
    checkpoint = _checkpoint(
        sim_dir, (UID_A, "main", GPU, (f"{gpu0}::0",)), (UID_B, "jupyter", GPU, (f"{gpu0}::1",))
    )
    kubelet = [
        Assignment("team-a", "trainer", "main", GPU, (f"{gpu0}::0",)),
        Assignment("team-a", "trainer", "sidecar", "", ()),
        Assignment("team-b", "notebook", "jupyter", GPU, (f"{gpu0}::1",)),
    ]
    with PodResourcesServer(sim_dir / "pr.sock", kubelet):
        directory = PodDirectory(checkpoint)
        watcher = PodResourcesWatcher(sim_dir / "pr.sock", directory=directory)
        assert watcher.refresh()
        collector = CollectLoop(api, hostname="sim")
        collector.add_enricher(watcher.enrich)
        collector.add_enricher(PodUsageEnricher(ProcReader(proc), directory))
        snapshot = collector.collect_once()
        watcher.stop()
    native = parse(Renderer().render(snapshot))
    at = {"gpu": "0", "uuid": gpu0}
    a = {"namespace": "team-a", "pod": "trainer", "container": "main", "owner": "pod", **at}
    b = {"namespace": "team-b", "pod": "notebook", "container": "jupyter", "owner": "pod", **at}
    a, b = {**a, "pod_uid": UID_A}, {**b, "pod_uid": UID_B}
    host = {"namespace": "", "pod": "", "container": "", "owner": "host", "pod_uid": "", **at}
    unknown = {"namespace": "", "pod": "", "container": "", "owner": "unknown", "pod_uid": "", **at}
    # a pod the node cannot name: by its UID alone, for the controller to join
    uid_only = {
        "namespace": "",
        "pod": "",
        "container": "",
        "owner": "pod",
        "pod_uid": UID_GONE,
        **at,
    }
    assert value(native, "gpu_pod_sm_utilization_ratio", True, **a) == pytest.approx(0.60)
    assert value(native, "gpu_pod_memory_utilization_ratio", True, **a) == pytest.approx(0.15)
    assert value(native, "gpu_pod_memory_used_bytes", True, **a) == 16 * 2**30
    assert value(native, "gpu_pod_sm_utilization_ratio", True, **b) == pytest.approx(0.30)
    assert value(native, "gpu_pod_memory_used_bytes", True, **b) == 20 * 2**30
    assert value(native, "gpu_pod_sm_utilization_ratio", True, **host) == pytest.approx(0.05)
    assert value(native, "gpu_pod_memory_used_bytes", True, **host) == 2**30
    assert value(native, "gpu_pod_memory_used_bytes", True, **uid_only) == 2 * 2**30
    # pid 999 is not in /proc; idle: 0 SM
    assert value(native, "gpu_pod_memory_used_bytes", True, **unknown) == 3 * 2**30
    assert value(native, "gpu_pod_sm_utilization_ratio", True, **unknown) == 0.0
    owners = {lbl["uuid"] for lbl, _v in native["gpu_pod_memory_used_bytes"]}
    assert owners == {gpu0}  # idle GPUs have no per-pod series


def test_without_the_checkpoint_pods_are_named_by_uid_only(
    nvml_on: NvmlOn, tmp_path: Path, sim_dir: Path
) -> None:
    node, api = nvml_on("h100x8")
    proc = tmp_path / "proc"
    _proc(proc, 101, f"0::/kubepods/pod{UID_A}/{CID}\n")
    node.add_process(0, 101, 2**30)
    bad = sim_dir / CHECKPOINT_FILE
    bad.write_text("{not json")
    kubelet = [Assignment("team-a", "trainer", "main", GPU, (node.uuid(0),))]
    with PodResourcesServer(sim_dir / "pr.sock", kubelet):
        directory = PodDirectory(bad)
        watcher = PodResourcesWatcher(sim_dir / "pr.sock", directory=directory)
        assert watcher.refresh()
        collector = CollectLoop(api, hostname="sim")
        collector.add_enricher(watcher.enrich)
        collector.add_enricher(PodUsageEnricher(ProcReader(proc), directory))
        (use,) = collector.collect_once().pod_usage[node.uuid(0)]
        assert (use.owner, use.namespace, use.pod, use.pod_uid) == ("pod", "", "", UID_A)
        assert directory.errors_total == 1
        _checkpoint(sim_dir, (UID_A, "main", GPU, (node.uuid(0),)))  # readable again
        assert watcher.refresh()
        (use,) = collector.collect_once().pod_usage[node.uuid(0)]
        assert (use.namespace, use.pod, use.container) == ("team-a", "trainer", "main")
        watcher.stop()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--pod-usage", "--pod-resources-socket", ""], "--pod-usage needs pod attribution"),
        (["--pod-usage", "--node-name", "n1", "--proc-root", "/nonexistent/proc"],
         "--proc-root /nonexistent/proc: no such folder"),
    ],
)  # fmt: skip
def test_bad_pod_usage_flags_exit_2(nvml_on: NvmlOn, capsys, monkeypatch, argv, message) -> None:
    nvml_on("h100x8")
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert exporter_main([*argv, "--listen", "127.0.0.1:0"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_mig_processes_count_on_their_instance_only(nvml_on: NvmlOn, tmp_path: Path) -> None:
    spec = {"gpus": [{"model": "H100-SXM5-80GB", "count": 1, "mig": ["3g.40gb", "3g.40gb"]}]}
    node, api = nvml_on(spec)
    proc = tmp_path / "proc"
    _proc(proc, 77, "0::/system.slice/infer.service\n")
    collector = CollectLoop(api, hostname="sim")
    mig = collector.collect_once().devices[2].mig
    assert mig is not None
    node.add_process(0, 77, 3 * 2**30, gpu_instance_id=mig.gpu_instance_id, compute_instance_id=0)
    collector.add_enricher(PodUsageEnricher(ProcReader(proc), PodDirectory(None)))
    snapshot = collector.collect_once()
    parent, _first, second = snapshot.devices
    assert parent.uuid not in snapshot.pod_usage  # the parent lists it too: counted once
    (use,) = snapshot.pod_usage[second.uuid]
    assert (use.owner, use.memory_used_bytes, use.sm_ratio) == ("host", 3 * 2**30, None)
