"""The agent names pods from the node alone (issue 35): the kubelet's device checkpoint as the
kubelet writes it, its pod-resources answer, the DRA claims' reservations, and, end to end,
``gpu-exporter --pod-usage`` on the kubelet stand-in with the API server refusing every pod
request (403, as RBAC without pods does) still publishes per-pod usage by namespace, pod and
UID, and its usage counters."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuquota.exporter.enrich.admin_access import reserved_pods
from gpuquota.exporter.enrich.devicecheckpoint import (
    CheckpointEntry,
    CheckpointError,
    parse_checkpoint,
    read_checkpoint,
)
from gpuquota.exporter.enrich.podnames import node_pod_names
from gpuquota.exporter.kubeletapi import podresources_v1_pb2 as pb
from gpuquota.sim.apiserver import ApiServer
from gpuquota.sim.harness import poll, stop_process
from gpuquota.sim.kubelet.checkpoint import CHECKPOINT_FILE, PodDeviceEntry
from gpuquota.sim.kubelet.checkpoint import write as write_checkpoint
from gpuquota.sim.kubelet.registration import KubeletStandIn
from gpuquota.sim.nvml.control import SimNode
from tests.exporter.scrape import parse

GPU = "nvidia.com/gpu"
UID_A = "6f1b3a8e-2c4d-4e5f-9a0b-1c2d3e4f5a6b"
UID_B = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
UID_C = "11111111-2222-4333-8444-555555555555"
UID_OLD = "ffffffff-0000-4000-8000-000000000001"


# --- the checkpoint, read ----------------------------------------------------------------


def test_the_kubelets_checkpoint_is_read_with_devices_per_numa_node() -> None:
    # compact, as Go's encoding/json writes it; a device on two NUMA nodes is under both
    text = (
        '{"Data":{"PodDeviceEntries":[{"PodUID":"' + UID_A.upper() + '","ContainerName":"main",'
        '"ResourceName":"nvidia.com/gpu","DeviceIDs":{"-1":["GPU-c"],"0":["GPU-a","GPU-b"],'
        '"1":["GPU-b"]},"AllocResp":"CgA="}],"RegisteredDevices":{"nvidia.com/gpu":["GPU-a"]}},'
        '"Checksum":1234567}'
    )
    (entry,) = parse_checkpoint(text)
    assert entry == CheckpointEntry(UID_A, "main", GPU, frozenset({"GPU-a", "GPU-b", "GPU-c"}))
    # before Kubernetes 1.20, DeviceIDs was a plain list; a node with nothing allocated: null
    old = '{"Data":{"PodDeviceEntries":[{"PodUID":"u","ContainerName":"c","ResourceName":"r",'
    old += '"DeviceIDs":["x"],"AllocResp":null}]},"Checksum":1}'
    assert parse_checkpoint(old)[0].device_ids == frozenset({"x"})
    assert parse_checkpoint('{"Data":{"PodDeviceEntries":null},"Checksum":0}') == ()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{oops", "not JSON"),
        ('{"Data":{"PodDeviceEntries":{}}}', "no Data.PodDeviceEntries list"),
        ('{"Data":{"PodDeviceEntries":[{"PodUID":"u","ResourceName":"r"}]}}',
         "PodDeviceEntries[0] lacks PodUID, ContainerName or ResourceName"),
        ('{"Data":{"PodDeviceEntries":[{"PodUID":"u","ContainerName":"c","ResourceName":"r",'
         '"DeviceIDs":{"0":"x"}}]}}', "PodDeviceEntries[0].DeviceIDs is not lists of strings"),
    ],
)  # fmt: skip
def test_a_bad_checkpoint_names_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / CHECKPOINT_FILE
    path.write_text(text)
    with pytest.raises(CheckpointError, match=re.escape(f"{path}: {message}")):
        read_checkpoint(path)
    assert read_checkpoint(tmp_path / "missing") == ()


def test_the_stand_ins_checkpoint_reads_as_the_kubelets(tmp_path: Path) -> None:
    path = tmp_path / CHECKPOINT_FILE
    numa = (("GPU-a", (0,)), ("GPU-b", (0, 1)))
    entry = PodDeviceEntry(UID_A, "main", GPU, ("GPU-a", "GPU-b", "GPU-c"), b"\n\x00", numa)
    write_checkpoint(path, [entry], {GPU: ["GPU-a", "GPU-b", "GPU-c"]})
    raw = path.read_text()
    assert ": " not in raw and ", " not in raw  # Go writes compact JSON
    data = json.loads(raw)
    assert list(data) == ["Data", "Checksum"]
    assert list(data["Data"]) == ["PodDeviceEntries", "RegisteredDevices"]
    written = data["Data"]["PodDeviceEntries"][0]
    assert list(written) == ["PodUID", "ContainerName", "ResourceName", "DeviceIDs", "AllocResp"]
    assert written["DeviceIDs"] == {"-1": ["GPU-c"], "0": ["GPU-a", "GPU-b"], "1": ["GPU-b"]}
    assert written["AllocResp"] == "CgA="
    (got,) = read_checkpoint(path)
    assert got.device_ids == frozenset(entry.device_ids) and got.pod_uid == UID_A


# --- the join (pure) ---------------------------------------------------------------------


def _pod(namespace: str, name: str, *containers: pb.ContainerResources) -> pb.PodResources:
    return pb.PodResources(name=name, namespace=namespace, containers=list(containers))


def _holds(container: str, *ids: str) -> pb.ContainerResources:
    devices = [pb.ContainerDevices(resource_name=GPU, device_ids=list(ids))] if ids else []
    return pb.ContainerResources(name=container, devices=devices)


def _claim(container: str, claim: str) -> pb.ContainerResources:
    return pb.ContainerResources(
        name=container, dynamic_resources=[pb.DynamicResource(claim_name=claim)]
    )


def _entry(uid: str, container: str, *ids: str) -> CheckpointEntry:
    return CheckpointEntry(uid, container, GPU, frozenset(ids))


def test_pods_are_named_where_exactly_one_uid_fits() -> None:
    listed = pb.ListPodResourcesResponse(
        pod_resources=[
            _pod("team-a", "trainer", _holds("main", "GPU-1", "GPU-2"), _holds("sidecar")),
            _pod("team-b", "web", _holds("app")),  # holds nothing: no name from the node
            _pod("team-c", "again", _holds("main", "GPU-3")),
        ]
    )
    entries = [
        _entry(UID_A, "main", "GPU-1", "GPU-2"),
        _entry(UID_A, "init", "GPU-1"),  # an init container's devices: List leaves it out
        _entry(UID_B, "main", "GPU-3"),
        _entry(UID_OLD, "main", "GPU-3"),  # the same name's old pod, not yet rewritten away
    ]
    names = node_pod_names(listed, entries)
    assert names.by_uid[UID_A].namespace == "team-a" and names.by_uid[UID_A].pod == "trainer"
    assert names.by_uid[UID_A].containers == ("main", "sidecar")
    assert names.uids == {("team-a", "trainer"): UID_A}  # "again": two UIDs fit, none named
    assert UID_B not in names.by_uid and UID_OLD not in names.by_uid


def test_dra_pods_are_named_by_their_claims_reservations() -> None:
    listed = pb.ListPodResourcesResponse(
        pod_resources=[
            _pod("ml", "worker-0", _claim("main", "shared")),
            _pod("ml", "worker-1", _claim("main", "shared")),
            _pod("ml", "late", _claim("main", "shared")),  # joined after the claim was read
            _pod("ml", "unread", _claim("main", "fresh")),
        ]
    )
    reservations = {("ml", "shared"): [("worker-0", UID_A), ("worker-1", UID_B)]}
    names = node_pod_names(listed, [], lambda ns, claim: reservations.get((ns, claim)))
    assert {u: n.pod for u, n in names.by_uid.items()} == {UID_A: "worker-0", UID_B: "worker-1"}
    assert names.stale_claims == {("ml", "shared")}  # read again for "late"


def test_a_claims_reservation_names_its_pods() -> None:
    claim = {"status": {"reservedFor": [
        {"resource": "pods", "name": "worker-0", "uid": UID_A},
        {"resource": "pods", "name": "worker-1", "uid": UID_B},
        {"apiGroup": "example.com", "resource": "pods", "name": "not-a-pod", "uid": UID_C},
    ]}}  # fmt: skip
    assert reserved_pods(claim) == (("worker-0", UID_A), ("worker-1", UID_B))
    assert reserved_pods({"status": {}}) == () == reserved_pods({})


def test_a_pod_that_joins_a_shared_claim_later_is_named_after_a_reread(
    tmp_path: Path, sim_dir: Path
) -> None:
    from gpuquota.exporter.enrich.claimreader import AdminAccessClaims
    from gpuquota.exporter.enrich.poddirectory import PodDirectory
    from gpuquota.exporter.enrich.podresources import PodResourcesWatcher
    from gpuquota.kube.client import Kube
    from gpuquota.kube.rest import load
    from gpuquota.sim.kubelet.podresources import ClaimAssignment, PodResourcesServer

    def claim(*pods: tuple[str, str]) -> dict[str, object]:
        reserved = [{"resource": "pods", "name": n, "uid": u} for n, u in pods]
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": "shared", "namespace": "ml", "uid": UID_OLD},
                "spec": {"devices": {"requests": []}}, "status": {"reservedFor": reserved}}  # fmt: skip

    device = (("gpu.nvidia.com", "node-a", "gpu-0"),)
    with ApiServer() as api, PodResourcesServer(sim_dir / "pr.sock") as kubelet:
        api.forbid("pods")
        api.apply("ADDED", claim(("first", UID_A)))
        kube = Kube(load(str(api.write_kubeconfig(tmp_path / "kubeconfig"))))
        claims = AdminAccessClaims(kube, reread_s=0.2)
        claims.start()
        try:
            directory = PodDirectory(None)
            directory.claims = claims
            watcher = PodResourcesWatcher(sim_dir / "pr.sock", directory=directory)
            for pod in ("first", "late"):
                kubelet.assign_claim(ClaimAssignment("ml", pod, "main", "shared", "ml", device))
            claims.devices("ml", "shared")  # what DRA attribution asks first: the claim is read
            assert poll(lambda: watcher.refresh() and directory.uid_of("ml", "first"), 5)
            assert directory.uid_of("ml", "late") is None  # not in the reservation read
            api.apply("MODIFIED", claim(("first", UID_A), ("late", UID_B)))
            assert poll(lambda: watcher.refresh() and directory.uid_of("ml", "late"), 5) == UID_B
            found = directory.lookup(UID_B)
            assert found is not None and (found.namespace, found.pod) == ("ml", "late")
            watcher.stop()
        finally:
            claims.stop()


def test_a_pod_started_since_the_last_answer_is_named_without_waiting_an_interval(
    sim_dir: Path,
) -> None:
    from gpuquota.exporter.enrich.poddirectory import PodDirectory
    from gpuquota.exporter.enrich.podresources import PodResourcesWatcher
    from gpuquota.sim.kubelet.podresources import PodResourcesServer

    checkpoint = sim_dir / CHECKPOINT_FILE
    with PodResourcesServer(sim_dir / "pr.sock", checkpoint=checkpoint) as kubelet:
        directory = PodDirectory(checkpoint)
        watcher = PodResourcesWatcher(sim_dir / "pr.sock", interval=3600, directory=directory)
        directory.wake = watcher.wake
        watcher.start()
        try:
            kubelet.assign("ml", "new", "main", GPU, "GPU-1", uid=UID_A)  # after the answer
            calls = kubelet.calls
            assert directory.lookup(UID_A) is None  # its process shows up: ask again now
            assert poll(lambda: directory.lookup(UID_A), 5) is not None
            # a UID the node can never name (no GPU through the kubelet) asks once, not
            # every round
            assert directory.lookup(UID_C) is None
            assert poll(lambda: kubelet.calls >= calls + 2, 5)
            for _ in range(20):
                directory.lookup(UID_C)
            time.sleep(1.0)
            assert kubelet.calls == calls + 2
        finally:
            watcher.stop()


# --- the kubelet stand-in lists as the kubelet does ----------------------------------------


def test_the_kubelet_stand_in_lists_every_container_with_or_without_devices(
    sim_dir: Path,
) -> None:
    from gpuquota.exporter.kubeletapi import podresources_v1_pb2_grpc as pb_grpc

    kubelet = KubeletStandIn(sim_dir / "dp", root_dir=sim_dir / "root")
    (sim_dir / "dp").mkdir()
    kubelet.start()
    try:
        kubelet.admit("web", "frontend", {"nginx": {}, "envoy": {}}, uid=UID_C)
        assert kubelet.pod_resources_socket is not None
        import grpc

        with grpc.insecure_channel(f"unix://{kubelet.pod_resources_socket}") as channel:
            got = pb_grpc.PodResourcesListerStub(channel).List(
                pb.ListPodResourcesRequest(), timeout=5
            )
    finally:
        kubelet.stop()
    (pod,) = got.pod_resources
    assert (pod.namespace, pod.name) == ("web", "frontend")
    assert [(c.name, len(c.devices)) for c in pod.containers] == [("nginx", 0), ("envoy", 0)]


# --- end to end: the exporter with no right to pods ----------------------------------------

SERVING = re.compile(r"serving http://([\d.]+):(\d+)/metrics")


class Node:
    """gpu-exporter --device-plugin --pod-usage on the NVML and kubelet stand-ins, with an API
    server stand-in that refuses pods."""

    def __init__(self) -> None:
        self.work = Path(tempfile.mkdtemp(prefix="np-", dir="/tmp"))
        (self.work / "dp").mkdir()
        self.proc_root = self.work / "proc"
        self.proc_root.mkdir()
        self.node = SimNode.create(self.work / "state", "h100x8")
        self.api = ApiServer().start()
        self.api.forbid("pods")
        kubeconfig = self.api.write_kubeconfig(self.work / "kubeconfig")
        self.kubelet = KubeletStandIn(self.work / "dp", root_dir=self.work / "root")
        self.kubelet.start()
        assert self.kubelet.pod_resources_socket is not None
        command = [
            sys.executable, "-m", "gpuquota.exporter.cli", "--listen", "127.0.0.1:0",
            "--interval", "200ms", "--device-plugin", "--device-plugin-dir", str(self.work / "dp"),
            "--pod-resources-socket", str(self.kubelet.pod_resources_socket),
            "--pod-resources-interval", "200ms", "--pod-usage", "--proc-root", str(self.proc_root),
            "--device-checkpoint", str(self.work / "dp" / CHECKPOINT_FILE),
            "--kubeconfig", str(kubeconfig), "--node-name", "node-a",
        ]  # fmt: skip
        self.output: list[str] = []
        self.url = ""
        served = threading.Event()
        self.proc = subprocess.Popen(
            command, env={**os.environ, **self.node.env()}, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.output.append(line)
                if (m := SERVING.search(line)) is not None:
                    self.url = f"http://{m.group(1)}:{m.group(2)}"
                    served.set()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        if not served.wait(30):
            self.stop()
            raise AssertionError("exporter did not start:\n" + "".join(self.output))

    def run(self, namespace: str, pod: str, uid: str, gpus: int, pid: int, gib: int) -> str:
        """Admit a one-container pod and start a GPU process in it; its GPU's UUID."""
        asked = {GPU: gpus} if gpus else {}
        self.kubelet.admit(namespace, pod, {"main": asked}, uid=uid)
        held = self.kubelet.allocated(namespace, pod).get("main", {}).get(GPU, ())
        uuid = held[0] if held else self.node.uuid(7)  # no request: sees a GPU by its env
        gpu = next(i for i in range(8) if self.node.uuid(i) == uuid)
        (self.proc_root / str(pid)).mkdir(parents=True)
        cid = f"{pid:064x}"
        (self.proc_root / str(pid) / "cgroup").write_text(f"0::/kubepods/pod{uid}/{cid}\n")
        self.node.add_process(gpu, pid, gib * 2**30)
        self.node.set_process_utilization(gpu, pid, sm=0.5, memory=0.1)
        return uuid

    def metrics(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as response:
            return parse(response.read())

    def stop(self) -> int:
        code = stop_process(self.proc)
        self._reader.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.kubelet.stop()
        self.api.stop()
        self.node.close()
        shutil.rmtree(self.work, ignore_errors=True)
        return code


@pytest.fixture
def node(sim_library: Path) -> Iterator[Node]:
    running = Node()
    yield running
    assert running.stop() == 0


def test_per_pod_usage_works_with_pods_forbidden(node: Node) -> None:
    plugin = node.kubelet.wait_for_plugin(GPU, timeout=20)
    assert plugin is not None, "".join(node.output)
    assert plugin.wait_for(lambda d: len(d) == 8, timeout=20) is not None
    gpu_a = node.run("team-a", "trainer", UID_A, 1, 4101, 10)
    gpu_c = node.run("team-c", "sneaky", UID_C, 0, 4301, 3)  # holds no GPU through the kubelet

    def named() -> dict[str, list[tuple[dict[str, str], float]]] | None:
        got = node.metrics()  # processes are read on the slow tier: a few seconds
        used = {lbl.get("pod_uid") for lbl, _ in got.get("gpu_pod_used_seconds_total", [])}
        memory = {lbl.get("pod_uid") for lbl, _ in got.get("gpu_pod_memory_used_bytes", [])}
        return got if UID_A in used and {UID_A, UID_C} <= memory else None

    got = poll(named, 30)
    assert got is not None, "".join(node.output[-30:])
    mine = {
        (lbl["uuid"], lbl["namespace"], lbl["pod"], lbl["container"], lbl["owner"], lbl["pod_uid"])
        for lbl, _ in got["gpu_pod_memory_used_bytes"]
    }
    assert (gpu_a, "team-a", "trainer", "main", "pod", UID_A) in mine
    assert (gpu_c, "", "", "", "pod", UID_C) in mine  # the node cannot name it: its UID
    (used,) = [lbl for lbl, _ in got["gpu_pod_used_seconds_total"] if lbl["pod_uid"] == UID_A]
    assert (used["uuid"], used["namespace"], used["pod"]) == (gpu_a, "team-a", "trainer")
    # not one request for pods reached the API server: nothing to forbid
    assert not [c for c in node.api.calls if c[1].startswith("pods")], node.api.calls
    assert "forbidden" not in "".join(node.output).lower()
