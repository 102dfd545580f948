"""Pod attribution over real gRPC on a real unix socket, against the kubelet stand-in."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import grpc
import pytest

from gpuquota.exporter.enrich.podresources import PodResourcesWatcher
from gpuquota.exporter.enrich.pods import (
    attach_pods,
    device_pods,
    physical_device_id,
)
from gpuquota.exporter.kubeletapi import podresources_v1_pb2 as pb
from gpuquota.exporter.kubeletapi import podresources_v1_pb2_grpc as pb_grpc
from gpuquota.exporter.snapshot import DeviceSnapshot, MigInfo, NodeSnapshot, PodRef
from gpuquota.sim.harness import wait_for
from gpuquota.sim.kubelet.podresources import (
    Assignment,
    PodResourcesServer,
    load_assignments,
    node_assignments,
    one_pod_each,
    time_sliced,
)

GPU0 = "GPU-00000000-0000-0000-0000-000000000000"
GPU1 = "GPU-11111111-1111-1111-1111-111111111111"
MIG0 = "MIG-aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa"
MIG1 = "MIG-bbbbbbbb-bbbb-bbbb-bbbb-bbbbbbbbbbbb"


class FakeClock:
    """Time the watcher reads, moved by the test (the staleness rule is about elapsed time)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def snapshot_of(*devices: DeviceSnapshot) -> NodeSnapshot:
    return NodeSnapshot(
        hostname="node-a",
        driver_version="550.54.15",
        nvml_version="12.550.54.15",
        cuda_driver_version=12040,
        devices=devices,
        collected_at=1.7e9,
        collection_seconds=0.01,
    )


def ref(ns: str, pod: str, container: str = "main") -> PodRef:
    return PodRef(namespace=ns, pod=pod, container=container)


# -- the pure mapping ------------------------------------------------------------------------


def test_replica_suffix_is_stripped() -> None:
    assert physical_device_id(f"{GPU0}::3") == GPU0
    assert physical_device_id(MIG0) == MIG0


def test_mapping_attributes_every_pod_sharing_a_time_sliced_gpu() -> None:
    response = pb.ListPodResourcesResponse(
        pod_resources=[
            pb.PodResources(
                name=f"p{r}",
                namespace="team-a",
                containers=[
                    pb.ContainerResources(
                        name="main",
                        devices=[
                            pb.ContainerDevices(
                                resource_name="nvidia.com/gpu", device_ids=[f"{GPU0}::{r}"]
                            )
                        ],
                    )
                ],
            )
            for r in (2, 0, 1)
        ]
    )
    assert device_pods(response) == {
        GPU0: (ref("team-a", "p0"), ref("team-a", "p1"), ref("team-a", "p2"))
    }


def test_mapping_ignores_other_resources_and_collapses_two_replicas_of_one_gpu() -> None:
    response = pb.ListPodResourcesResponse(
        pod_resources=[
            pb.PodResources(
                name="trainer",
                namespace="ml",
                containers=[
                    pb.ContainerResources(
                        name="worker",
                        devices=[
                            pb.ContainerDevices(
                                resource_name="nvidia.com/gpu.shared",
                                device_ids=[f"{GPU1}::0", f"{GPU1}::1"],
                            ),
                            pb.ContainerDevices(
                                resource_name="nvidia.com/mig-1g.5gb", device_ids=[MIG0]
                            ),
                            pb.ContainerDevices(
                                resource_name="intel.com/sriov", device_ids=["0000:3b:00.1"]
                            ),
                        ],
                        cpu_ids=[4, 5],
                    )
                ],
            )
        ]
    )
    assert device_pods(response) == {
        GPU1: (ref("ml", "trainer", "worker"),),
        MIG0: (ref("ml", "trainer", "worker"),),
    }


def test_attach_pods_keeps_only_devices_of_the_snapshot_and_resolves_indices() -> None:
    snap = snapshot_of(
        DeviceSnapshot(index=0, uuid=GPU0),
        DeviceSnapshot(index=1, uuid=GPU1),
    )
    mapping = {
        "1": (ref("a", "by-index"),),
        GPU1: (ref("a", "by-uuid"),),
        "GPU-not-on-this-node": (ref("a", "elsewhere"),),
    }
    enriched = attach_pods(snap, mapping)
    assert enriched.pods == {GPU1: (ref("a", "by-index"), ref("a", "by-uuid"))}
    assert enriched.devices == snap.devices
    assert snap.pods == {}  # snapshots are immutable: a new one is returned


# -- over gRPC ------------------------------------------------------------------------------


def test_watcher_attributes_time_sliced_gpus_and_mig_devices(
    kubelet: PodResourcesServer, socket_path: Path
) -> None:
    kubelet.set_assignments(
        [
            *time_sliced([GPU0], pods_per_gpu=3, namespace="infer"),
            *one_pod_each([MIG0, MIG1], "nvidia.com/mig-1g.5gb", namespace="train"),
        ]
    )
    watcher = PodResourcesWatcher(socket_path, timeout=2.0)
    try:
        assert watcher.refresh()
        snap = snapshot_of(
            DeviceSnapshot(index=0, uuid=GPU0),
            DeviceSnapshot(index=1, uuid=GPU1, mig_mode_enabled=True),
            DeviceSnapshot(
                index=0,
                uuid=MIG0,
                mig=MigInfo(GPU1, 1, gpu_instance_id=7, compute_instance_id=0, profile="1g.5gb"),
            ),
            DeviceSnapshot(
                index=1,
                uuid=MIG1,
                mig=MigInfo(GPU1, 1, gpu_instance_id=8, compute_instance_id=0, profile="1g.5gb"),
            ),
        )
        enriched = watcher.enrich(snap)
        pods = enriched.pods
    finally:
        watcher.stop()
    assert enriched.pod_attribution is not None
    assert enriched.pod_attribution.up and enriched.pod_attribution.devices_attributed == 3
    assert pods == {
        GPU0: tuple(ref("infer", f"shared-0-{r}") for r in range(3)),
        MIG0: (ref("train", "pod-0"),),
        MIG1: (ref("train", "pod-1"),),
    }
    assert GPU1 not in pods  # the MIG parent itself is held by nobody
    status = watcher.status()
    assert status.up and status.errors_total == 0 and status.devices_attributed == 3


def test_no_socket_logs_once_then_attributes_when_the_socket_appears(
    socket_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gpuquota.exporter.enrich.podresources")
    watcher = PodResourcesWatcher(socket_path, interval=0.05, timeout=1.0)
    watcher.start()
    try:
        time.sleep(0.2)  # several refresh rounds without a socket
        assert watcher.mapping() == {}
        assert not watcher.status().socket_present
        off = [r for r in caplog.records if "attribution is off" in r.getMessage()]
        assert len(off) == 1
        with PodResourcesServer(socket_path, time_sliced([GPU0], 2)):
            wait_for(lambda: GPU0 in watcher.mapping())
            assert len(watcher.mapping()[GPU0]) == 2
    finally:
        watcher.stop()


def test_kubelet_error_keeps_last_mapping_for_a_bounded_time(
    kubelet: PodResourcesServer, socket_path: Path
) -> None:
    clock = FakeClock()
    kubelet.set_assignments(one_pod_each([GPU0], "nvidia.com/gpu"))
    watcher = PodResourcesWatcher(socket_path, timeout=1.0, max_stale=30.0, clock=clock)
    try:
        assert watcher.refresh()
        kubelet.fail(grpc.StatusCode.UNAVAILABLE)
        clock.now += 10
        assert not watcher.refresh()
        assert not watcher.refresh()
        assert watcher.mapping() == {GPU0: (ref("default", "pod-0"),)}
        assert watcher.status().errors_total == 2
        assert not watcher.status().up
        clock.now += 25  # 35 s since the last good answer: older than max_stale
        assert watcher.mapping() == {}
        assert watcher.status().devices_attributed == 0
        kubelet.fail(None)
        assert watcher.refresh()
        assert watcher.mapping() == {GPU0: (ref("default", "pod-0"),)}
        assert watcher.status().errors_total == 2
    finally:
        watcher.stop()


def test_a_stalled_kubelet_runs_into_the_deadline(
    kubelet: PodResourcesServer, socket_path: Path
) -> None:
    kubelet.stall(1.0)
    watcher = PodResourcesWatcher(socket_path, timeout=0.2)
    try:
        started = time.monotonic()
        assert not watcher.refresh()
        assert time.monotonic() - started < 0.9
        assert watcher.status().errors_total == 1
    finally:
        kubelet.stall(0)
        watcher.stop()


def test_kubelet_restart_with_new_assignments_is_followed(socket_path: Path) -> None:
    clock = FakeClock()
    watcher = PodResourcesWatcher(socket_path, timeout=1.0, max_stale=30.0, clock=clock)
    try:
        with PodResourcesServer(socket_path, one_pod_each([GPU0], "nvidia.com/gpu")):
            assert watcher.refresh()
        # the kubelet is gone (socket removed): the old mapping stays, but only for a while
        assert not watcher.refresh()
        assert watcher.mapping() == {GPU0: (ref("default", "pod-0"),)}
        assert watcher.status().errors_total == 1
        with PodResourcesServer(socket_path, time_sliced([GPU1], 2, namespace="b")):
            assert watcher.refresh()
            assert watcher.mapping() == {GPU1: (ref("b", "shared-0-0"), ref("b", "shared-0-1"))}
    finally:
        watcher.stop()


# -- the stand-in itself ----------------------------------------------------------------------


def test_stand_in_serves_get_and_allocatable(
    kubelet: PodResourcesServer, socket_path: Path
) -> None:
    kubelet.assign("ns", "p", "c", "nvidia.com/gpu", f"{GPU0}::0")
    kubelet.set_allocatable("nvidia.com/gpu", [f"{GPU0}::0", f"{GPU0}::1"])
    with grpc.insecure_channel(f"unix://{socket_path}") as channel:
        stub = pb_grpc.PodResourcesListerStub(channel)
        got = stub.Get(pb.GetPodResourcesRequest(pod_name="p", pod_namespace="ns"), timeout=2)
        assert got.pod_resources.containers[0].devices[0].device_ids == [f"{GPU0}::0"]
        alloc = stub.GetAllocatableResources(pb.AllocatableResourcesRequest(), timeout=2)
        assert list(alloc.devices[0].device_ids) == [f"{GPU0}::0", f"{GPU0}::1"]
        with pytest.raises(grpc.RpcError) as missing:
            stub.Get(pb.GetPodResourcesRequest(pod_name="q", pod_namespace="ns"), timeout=2)
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        kubelet.remove_pod("ns", "p")
        assert list(stub.List(pb.ListPodResourcesRequest(), timeout=2).pod_resources) == []


def test_demo_node_shares_the_first_gpu_and_gives_each_mig_device_a_pod(
    kubelet: PodResourcesServer, socket_path: Path
) -> None:
    kubelet.set_assignments(node_assignments([GPU0, GPU1], [MIG0, MIG1], replicas=2))
    with PodResourcesWatcher(socket_path) as watcher:
        mapping = watcher.mapping()
    assert mapping == {
        GPU0: (ref("inference", "infer-0-0", "server"), ref("inference", "infer-0-1", "server")),
        GPU1: (ref("training", "train-0", "trainer"),),
        MIG0: (ref("research", "notebook-0", "jupyter"),),
        MIG1: (ref("research", "notebook-1", "jupyter"),),
    }


def test_assignment_file_errors_name_the_problem(tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text(
        '[{"namespace": "a", "pod": "p", "container": "c", "resource": "nvidia.com/gpu",'
        f' "device_ids": ["{GPU0}"]}}]'
    )
    assert load_assignments(good) == [Assignment("a", "p", "c", "nvidia.com/gpu", (GPU0,))]
    bad = tmp_path / "bad.json"
    bad.write_text('[{"namespace": "a", "pod": "p"}]')
    with pytest.raises(SystemExit, match="lacks"):
        load_assignments(bad)
    with pytest.raises(SystemExit, match="cannot read"):
        load_assignments(tmp_path / "missing.json")


def test_watcher_rejects_nonsense_settings(socket_path: Path) -> None:
    with pytest.raises(ValueError, match="interval"):
        PodResourcesWatcher(socket_path, interval=0)
    with pytest.raises(ValueError, match="timeout"):
        PodResourcesWatcher(socket_path, timeout=-1)


def test_stand_in_runs_on_its_own_from_an_assignment_file(socket_path: Path) -> None:
    import json
    import signal
    import subprocess
    import sys

    assignments = socket_path.parent / "pods.json"
    assignments.write_text(
        json.dumps(
            [
                {
                    "namespace": "a",
                    "pod": "p",
                    "container": "c",
                    "resource": "nvidia.com/gpu",
                    "device_ids": [f"{GPU0}::1"],
                }
            ]
        )
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuquota.sim.kubelet.podresources", "--socket", str(socket_path),
         "--assignments", str(assignments)],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and "pod-resources stand-in on" in proc.stdout.readline()
        with PodResourcesWatcher(socket_path) as watcher:
            assert watcher.mapping() == {GPU0: (ref("a", "p", "c"),)}
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    assert not socket_path.exists()  # it cleans up its socket
