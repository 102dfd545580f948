"""The device plugin over real gRPC on unix sockets, driven by the kubelet stand-in.

The health source is the real DeviceTracker + VerdictBoard fed with hand-made snapshots and
XIDs (tests/deviceplugin/test_end_to_end.py drives the same path from the NVML stand-in).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from itertools import combinations
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpuquota.exporter.deviceplugin.devices import PluginConfig
from gpuquota.exporter.deviceplugin.manager import DevicePluginManager
from gpuquota.exporter.deviceplugin.preferred import Topology
from gpuquota.exporter.health.board import VerdictBoard
from gpuquota.exporter.health.config import parse_config
from gpuquota.exporter.health.engine import DeviceTracker
from gpuquota.exporter.kubeletapi import deviceplugin_v1beta1_pb2 as pb
from gpuquota.exporter.kubeletapi import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from gpuquota.sim.harness import poll
from gpuquota.sim.kubelet.registration import KubeletStandIn
from tests.health.factory import gpu, gpus, mig, node

# Upper bounds for waits, generous for a loaded machine; the latency itself is measured by
# bench/health.py (milliseconds), never asserted here.
PUSH_S = 5.0
GPU = "nvidia.com/gpu"
UUIDS = [f"GPU-{i:08d}" for i in range(8)]


class Node:
    """Health tracker + board: what the checker does, minus NVML."""

    def __init__(self, *devices) -> None:
        self.tracker = DeviceTracker(parse_config(None, quiet_period_s=1000))
        self.board = VerdictBoard()
        self.now = 0.0
        self.snapshot(*devices)

    def snapshot(self, *devices) -> None:
        self.now += 1
        self.board.publish(self.tracker.observe_snapshot(node(*devices), self.now))

    def xid(self, uuid: str, xid: int, **kw) -> None:
        self.now += 1
        self.board.publish(self.tracker.observe_xid(uuid, xid, at=self.now, **kw))

    def expire(self) -> None:
        self.now += 10_000
        self.board.publish(self.tracker.expire(self.now))


def nvswitch_topology() -> Topology:
    pairs = list(combinations(sorted(UUIDS), 2))
    return Topology(
        numa_node={u: i // 4 for i, u in enumerate(UUIDS)},
        nvlinks={p: 18 for p in pairs},
        pcie_level={
            (a, b): 20 if UUIDS.index(a) // 2 == UUIDS.index(b) // 2 else 50 for a, b in pairs
        },
    )


@pytest.fixture
def start(plugin_dir: Path) -> Iterator[Any]:
    managers: list[DevicePluginManager] = []

    def _start(n: Node, config: PluginConfig | None = None) -> DevicePluginManager:
        m = DevicePluginManager(
            n.board, config or PluginConfig(), plugin_dir, topology=nvswitch_topology, poll_s=0.1
        )
        m.start()
        managers.append(m)
        return m

    yield _start
    for m in managers:
        m.stop()


def all_healthy(devices: dict[str, str]) -> bool:
    return bool(devices) and set(devices.values()) == {"Healthy"}


def test_register_and_list(kubelet: KubeletStandIn, start) -> None:
    start(Node(*gpus(8)))
    plugin = kubelet.wait_for_plugin(GPU)
    assert plugin is not None
    _, request = kubelet.registrations[0]
    assert (request.version, request.resource_name) == ("v1beta1", GPU)
    assert request.endpoint == "gpuquota-nvidia.com-gpu.sock"
    assert request.options.get_preferred_allocation_available
    update = plugin.wait_for(lambda d: len(d) == 8)
    assert update is not None and all_healthy(update.devices)
    # Each device names its NUMA node for the kubelet's topology manager.
    assert update.numa[UUIDS[0]] == (0,) and update.numa[UUIDS[5]] == (1,)
    assert plugin.options is not None and not plugin.options.pre_start_required


def test_health_change_is_pushed_at_once(kubelet: KubeletStandIn, start) -> None:
    n = Node(*gpus(8))
    start(n)
    plugin = kubelet.wait_for_plugin(GPU)
    assert plugin is not None and plugin.wait_for(all_healthy)
    n.xid(UUIDS[3], 79)
    update = plugin.wait_for(lambda d: d.get(UUIDS[3]) == "Unhealthy", timeout=PUSH_S)
    assert update is not None, "Unhealthy never reached the stream"
    assert [i for i, h in update.devices.items() if h != "Healthy"] == [UUIDS[3]]
    # An application error degrades the GPU but keeps it schedulable: no new list is sent.
    count = plugin.count()
    n.xid(UUIDS[4], 13)
    assert plugin.wait_for(lambda d: d.get(UUIDS[4]) != "Healthy", timeout=0.3, start=count) is None
    n.expire()
    assert plugin.wait_for(all_healthy, timeout=PUSH_S, start=count) is not None


def test_allocate(kubelet: KubeletStandIn, start) -> None:
    n = Node(*gpus(8))
    start(n)
    plugin = kubelet.wait_for_plugin(GPU)
    assert plugin is not None and plugin.wait_for(all_healthy)
    response = plugin.allocate([UUIDS[1], UUIDS[2]], [UUIDS[5]])
    first, second = response.container_responses
    assert first.envs["NVIDIA_VISIBLE_DEVICES"] == f"{UUIDS[1]},{UUIDS[2]}"
    assert [(d.host_path, d.container_path, d.permissions) for d in first.devices][:2] == [
        ("/dev/nvidia1", "/dev/nvidia1", "rw"),
        ("/dev/nvidia2", "/dev/nvidia2", "rw"),
    ]
    assert {d.host_path for d in first.devices} >= {
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    }
    assert second.envs["NVIDIA_VISIBLE_DEVICES"] == UUIDS[5]


def rpc_error(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value


def test_malformed_and_refused_requests(kubelet: KubeletStandIn, start) -> None:
    n = Node(*gpus(8))
    start(n)
    plugin = kubelet.wait_for_plugin(GPU)
    assert plugin is not None and plugin.wait_for(all_healthy)
    n.xid(UUIDS[0], 48)
    assert plugin.wait_for(lambda d: d.get(UUIDS[0]) == "Unhealthy", timeout=PUSH_S)

    err = rpc_error(lambda: plugin.allocate(["GPU-nope"]))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "GPU-nope" in str(err.details())
    err = rpc_error(lambda: plugin.allocate([UUIDS[0]]))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert UUIDS[0] in str(err.details()) and "xid_48" in str(err.details())
    err = rpc_error(lambda: plugin.allocate([]))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "names no devices" in str(
        err.details()
    )
    err = rpc_error(lambda: plugin.stub.Allocate(pb.AllocateRequest()))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "no container requests" in str(
        err.details()
    )
    err = rpc_error(lambda: plugin.preferred(UUIDS[:2], [], 3))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "exceeds the 2 available" in str(
        err.details()
    )
    err = rpc_error(lambda: plugin.preferred(UUIDS[:2], [UUIDS[5]], 1))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and UUIDS[5] in str(err.details())
    err = rpc_error(lambda: plugin.preferred(["junk"], [], 1))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "junk" in str(err.details())
    err = rpc_error(lambda: plugin.stub.GetPreferredAllocation(pb.PreferredAllocationRequest()))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    # PreStartContainer is not required, but answering it must not fail.
    plugin.stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=[UUIDS[1]]))


def test_preferred_allocation_on_nvswitch_node(kubelet: KubeletStandIn, start) -> None:
    start(Node(*gpus(8)))
    plugin = kubelet.wait_for_plugin(GPU)
    assert plugin is not None and plugin.wait_for(all_healthy)
    assert sorted(plugin.preferred(UUIDS, [], 2)) == UUIDS[0:2]
    assert sorted(plugin.preferred(UUIDS, [UUIDS[7]], 2)) == [UUIDS[6], UUIDS[7]]
    assert sorted(plugin.preferred(UUIDS, [], 8)) == UUIDS


def test_time_slicing(kubelet: KubeletStandIn, start) -> None:
    start(Node(*gpus(2)), PluginConfig(replicas=4))
    plugin = kubelet.wait_for_plugin(GPU)
    assert plugin is not None
    update = plugin.wait_for(lambda d: len(d) == 8)
    assert update is not None and sorted(update.devices) == [
        f"{u}::{r}" for u in UUIDS[:2] for r in range(4)
    ]
    response = plugin.allocate([f"{UUIDS[1]}::2"])
    assert response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == UUIDS[1]
    picked = plugin.preferred(sorted(update.devices), [], 2)
    assert {p.split("::")[0] for p in picked} == set(UUIDS[:2])


def test_mig_resources_get_their_own_sockets(
    kubelet: KubeletStandIn, start, plugin_dir: Path
) -> None:
    n = Node(
        gpu(0, mig_mode_enabled=True), mig(0, 1), mig(0, 2), mig(0, 3, profile="2g.20gb"), gpu(1)
    )
    start(n)
    small = kubelet.wait_for_plugin("nvidia.com/mig-1g.10gb")
    big = kubelet.wait_for_plugin("nvidia.com/mig-2g.20gb")
    full = kubelet.wait_for_plugin(GPU)
    assert small and big and full
    assert small.wait_for(lambda d: sorted(d) == ["MIG-00-01-00", "MIG-00-02-00"])
    assert big.wait_for(lambda d: list(d) == ["MIG-00-03-00"])
    assert full.wait_for(lambda d: list(d) == [UUIDS[1]])
    assert len({p.socket_path for p in (small, big, full)}) == 3
    response = small.allocate(["MIG-00-02-00"])
    assert response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == "MIG-00-02-00"
    # A contained error on one instance leaves its sibling alone.
    n.xid(UUIDS[0], 95, gpu_instance_id=2, compute_instance_id=0)
    assert small.wait_for(lambda d: set(d.values()) == {"Unhealthy"}, timeout=PUSH_S)
    assert big.wait_for(lambda d: d["MIG-00-03-00"] == "Unhealthy", timeout=PUSH_S)
    assert full.devices() == {UUIDS[1]: "Healthy"}


def test_kubelet_restart_registers_again(kubelet: KubeletStandIn, start, plugin_dir: Path) -> None:
    start(Node(*gpus(2)))
    first = kubelet.wait_for_plugin(GPU)
    assert first is not None and first.wait_for(all_healthy)
    restarted = time.time()
    kubelet.restart()  # kubelet.sock recreated, plugin sockets wiped
    again = kubelet.wait_for_plugin(GPU, timeout=10.0, after=restarted)
    assert again is not None, "plugin did not register again within 5 s"
    assert again.wait_for(lambda d: len(d) == 2 and all_healthy(d))
    assert (plugin_dir / "gpuquota-nvidia.com-gpu.sock").is_socket()


def test_kubelet_restart_without_wiping(kubelet: KubeletStandIn, start) -> None:
    start(Node(*gpus(2)))
    assert kubelet.wait_for_plugin(GPU)
    restarted = time.time()
    kubelet.restart(wipe_plugin_sockets=False)
    again = kubelet.wait_for_plugin(GPU, timeout=10.0, after=restarted)
    assert again is not None and again.wait_for(all_healthy)


def test_own_socket_removed_serves_again(kubelet: KubeletStandIn, start, plugin_dir: Path) -> None:
    start(Node(*gpus(2)))
    assert kubelet.wait_for_plugin(GPU)
    removed = time.time()
    (plugin_dir / "gpuquota-nvidia.com-gpu.sock").unlink()
    again = kubelet.wait_for_plugin(GPU, timeout=10.0, after=removed)
    assert again is not None
    # The old stream may end after the new registration: the kubelet then drops the new
    # plugin too (it looks the client up by resource name), and the plugin registers again.
    assert poll(lambda: (p := kubelet.plugins.get(GPU)) and all_healthy(p.devices()), 10.0)


def test_shutdown_leaves_a_successors_socket_alone(
    kubelet: KubeletStandIn, plugin_dir: Path
) -> None:
    m = DevicePluginManager(Node(*gpus(1)).board, PluginConfig(), plugin_dir, poll_s=0.1)
    m.start()
    socket = plugin_dir / "gpuquota-nvidia.com-gpu.sock"
    socket.unlink()
    socket.write_text("")  # stands for the socket a new plugin instance created meanwhile
    m.stop()
    assert socket.exists()


def test_plugin_waits_for_a_late_kubelet(plugin_dir: Path, start) -> None:
    start(Node(*gpus(1)))
    time.sleep(0.3)  # no kubelet.sock yet: the plugin serves and waits
    kubelet = KubeletStandIn(plugin_dir)
    kubelet.start()
    try:
        plugin = kubelet.wait_for_plugin(GPU, timeout=5.0)
        assert plugin is not None and plugin.wait_for(all_healthy)
    finally:
        kubelet.stop()


def test_stale_kubelet_socket_then_a_live_kubelet(plugin_dir: Path, start, caplog) -> None:
    # A kubelet.sock left behind by a dead kubelet: registration fails, the plugin keeps serving.
    stale = plugin_dir / "kubelet.sock"
    stale.write_text("")
    start(Node(*gpus(1)))
    time.sleep(0.5)
    warnings = [
        r
        for r in caplog.records
        if "cannot register" in r.getMessage() and r.levelname == "WARNING"
    ]
    assert len(warnings) == 1  # said once, retried quietly
    kubelet = KubeletStandIn(plugin_dir)
    kubelet.start()  # replaces the stale file with a live socket
    try:
        plugin = kubelet.wait_for_plugin(GPU, timeout=10.0)
        assert plugin is not None and plugin.wait_for(all_healthy)
    finally:
        kubelet.stop()


def test_clean_shutdown_removes_socket(kubelet: KubeletStandIn, plugin_dir: Path) -> None:
    m = DevicePluginManager(Node(*gpus(1)).board, PluginConfig(), plugin_dir, poll_s=0.1)
    m.start()
    socket = plugin_dir / "gpuquota-nvidia.com-gpu.sock"
    assert socket.is_socket()
    m.stop()
    assert not socket.exists()


def test_kubelet_refuses_a_bad_registration(kubelet: KubeletStandIn, plugin_dir: Path) -> None:
    with grpc.insecure_channel(f"unix:{plugin_dir / 'kubelet.sock'}") as channel:
        stub = pb_grpc.RegistrationStub(channel)
        err = rpc_error(
            lambda: stub.Register(
                pb.RegisterRequest(version="v1alpha", endpoint="x.sock", resource_name=GPU),
                timeout=5,
            )
        )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "v1alpha" in str(err.details())


def test_missing_plugin_folder_is_an_error(tmp_path: Path) -> None:
    m = DevicePluginManager(Node(*gpus(1)).board, PluginConfig(), tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        m.start()


def test_registration_state_follows_the_kubelet(plugin_dir: Path, start) -> None:
    """What gpuquota_exporter_device_plugin_registered reports (the alert on a lost plugin)."""
    stale = plugin_dir / "kubelet.sock"
    stale.write_text("")  # a dead kubelet's socket: registration fails
    manager = start(Node(*gpus(1)))
    time.sleep(0.3)
    assert manager.registrations() == {GPU: False}
    kubelet = KubeletStandIn(plugin_dir)
    kubelet.start()
    try:
        assert kubelet.wait_for_plugin(GPU, timeout=10.0)
        deadline = time.monotonic() + 5
        while manager.registrations() != {GPU: True}:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        kubelet.stop()  # the kubelet goes away: its socket with it
        assert manager.registrations() == {GPU: False}
    finally:
        kubelet.stop()
