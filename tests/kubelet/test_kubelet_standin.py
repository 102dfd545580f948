"""The kubelet stand-in behaves like a real 1.36 kubelet (../shared/kubelet.md), one test per
point where it used not to: Allocate answers checkpointed and reused, allocatable published only
at the node status sync, the device-plugin folder independent of the root dir, and the pods'
``allocatedResourcesStatus`` following ListAndWatch.

The device plugin is the exporter's own (DevicePluginManager over real gRPC), fed by the real
health tracker and board with hand-made snapshots (tests/health/factory.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from gpuquota.exporter.deviceplugin.devices import PluginConfig
from gpuquota.exporter.deviceplugin.manager import DevicePluginManager
from gpuquota.exporter.enrich.podresources import PodResourcesWatcher
from gpuquota.exporter.health.board import VerdictBoard
from gpuquota.exporter.health.config import parse_config
from gpuquota.exporter.health.engine import DeviceTracker
from gpuquota.exporter.kubeletapi import deviceplugin_v1beta1_pb2 as pb
from gpuquota.exporter.kubeletapi import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from gpuquota.sim.apiserver import ApiServer
from gpuquota.sim.harness import poll
from gpuquota.sim.kubelet.checkpoint import CHECKPOINT_FILE
from gpuquota.sim.kubelet.registration import (
    DEFAULT_PLUGIN_DIR,
    AdmissionError,
    KubeletStandIn,
    NodeStatus,
)
from tests.health.factory import gpus, node

GPU = "nvidia.com/gpu"
UUIDS = [f"GPU-{i:08d}" for i in range(8)]
PUSH_S = 5.0


class Health:
    """The health checker minus NVML: tracker + board."""

    def __init__(self, count: int = 8) -> None:
        self.tracker = DeviceTracker(parse_config(None, quiet_period_s=1000))
        self.board = VerdictBoard()
        self.now = 0.0
        self.devices = gpus(count)
        self.now += 1
        self.board.publish(self.tracker.observe_snapshot(node(*self.devices), self.now))

    def xid(self, index: int, xid: int) -> None:
        self.now += 1
        self.board.publish(self.tracker.observe_xid(UUIDS[index], xid, at=self.now))

    def expire(self) -> None:
        self.now += 10_000
        self.board.publish(self.tracker.expire(self.now))


@pytest.fixture
def plugins(dirs: tuple[Path, Path]) -> Iterator[Callable[..., DevicePluginManager]]:
    started: list[DevicePluginManager] = []

    def start(health: Health, config: PluginConfig | None = None) -> DevicePluginManager:
        manager = DevicePluginManager(health.board, config or PluginConfig(), dirs[0], poll_s=0.1)
        manager.start()
        started.append(manager)
        return manager

    yield start
    for manager in started:
        manager.stop()


def listed(kubelet: KubeletStandIn, count: int = 8) -> None:
    plugin = kubelet.wait_for_plugin(GPU, timeout=10)
    assert plugin is not None and plugin.wait_for(lambda d: len(d) == count, timeout=PUSH_S)


def test_device_plugin_folder_does_not_follow_the_root_dir(
    dirs: tuple[Path, Path], make_kubelet, plugins
) -> None:
    plugin_dir, root_dir = dirs
    # The folder is a constant of its own; only the pod-resources socket follows the root dir.
    alone = KubeletStandIn(root_dir=Path("/srv/kubelet"))
    assert alone.plugin_dir == DEFAULT_PLUGIN_DIR == Path("/var/lib/kubelet/device-plugins")
    assert alone.pod_resources_socket == Path("/srv/kubelet/pod-resources/kubelet.sock")

    kubelet = make_kubelet()
    plugins(Health())
    listed(kubelet)
    assert (plugin_dir / "kubelet.sock").is_socket()
    assert not (root_dir / "device-plugins").exists()
    socket = root_dir / "pod-resources" / "kubelet.sock"
    assert socket.is_socket()
    kubelet.admit("ml", "train", {"main": {GPU: 1}})
    with PodResourcesWatcher(socket, timeout=2.0) as watcher:
        assert watcher.refresh()
        held = {uuid: [p.pod for p in pods] for uuid, pods in watcher.mapping().items()}
    assert list(held.values()) == [["train"]]


def test_allocate_answers_are_checkpointed_and_stick_until_the_pod_is_recreated(
    dirs: tuple[Path, Path], make_kubelet, plugins
) -> None:
    plugin_dir, _ = dirs
    kubelet = make_kubelet()
    health = Health()
    first = plugins(health)
    listed(kubelet)
    answer = kubelet.admit("ml", "train", {"main": {GPU: 1}})["main"][GPU]
    assert answer.devices and not answer.cdi_devices  # device nodes, no CDI
    uid = kubelet.pod_uid("ml", "train")
    assert uid is not None
    saved = json.loads((plugin_dir / CHECKPOINT_FILE).read_text())
    [entry] = saved["Data"]["PodDeviceEntries"]
    assert (entry["PodUID"], entry["ContainerName"], entry["ResourceName"]) == (uid, "main", GPU)
    assert len(saved["Data"]["RegisteredDevices"][GPU]) == 8

    # The plugin restarts with another answer (CDI): the running pod keeps the old one, also
    # through a kubelet restart, and no Allocate is asked again.
    first.stop()
    restarted = time.time()
    plugins(health, PluginConfig(cdi=True))
    again = kubelet.wait_for_plugin(GPU, timeout=10, after=restarted)
    assert again is not None and again.wait_for(lambda d: len(d) == 8, timeout=PUSH_S)
    assert kubelet.container_options(uid, "main")[GPU] == answer
    kubelet.admit("ml", "train", {"main": {GPU: 1}}, uid=uid)  # the container starts again
    assert again.allocate_calls == 0
    kubelet.restart()
    assert kubelet.container_options(uid, "main")[GPU] == answer
    kubelet.admit("ml", "train", {"main": {GPU: 1}}, uid=uid)
    assert kubelet.allocated("ml", "train")["main"][GPU] == tuple(entry["DeviceIDs"]["-1"])
    assert kubelet.container_options(uid, "main")[GPU] == answer

    # Only a new pod gets the plugin's new answer.
    kubelet.remove_pod("ml", "train")

    def uids() -> list[str]:
        saved = json.loads((plugin_dir / CHECKPOINT_FILE).read_text())
        return [e["PodUID"] for e in saved["Data"]["PodDeviceEntries"]]

    # the kubelet rewrites the file only at the next allocation (or a plugin's device update):
    # until then it still names the deleted pod
    assert uids() == [uid]
    listed(kubelet)
    fresh = kubelet.admit("ml", "train", {"main": {GPU: 1}})["main"][GPU]
    assert [d.name for d in fresh.cdi_devices] and not fresh.devices
    assert uids() == [kubelet.pod_uid("ml", "train")] != [uid]


def test_allocatable_is_published_only_at_the_node_status_sync(make_kubelet, plugins) -> None:
    with ApiServer() as api:
        api.apply("ADDED", {"kind": "Node", "apiVersion": "v1", "metadata": {"name": "node-a", "uid": "uid-node-a"},
                            "status": {"capacity": {"cpu": "2"}}})  # fmt: skip
        kubelet = make_kubelet(api=api)
        health = Health()
        plugins(health)
        listed(kubelet)
        assert kubelet.node_status.allocatable == {}  # registered, not yet synced
        assert kubelet.sync_node_status().allocatable == {GPU: 8}
        plugin = kubelet.plugins[GPU]
        health.xid(3, 79)
        assert plugin.wait_for(lambda d: d[UUIDS[3]] == "Unhealthy", timeout=PUSH_S)
        time.sleep(0.2)
        assert kubelet.node_status.allocatable == {GPU: 8}  # the kubelet knows, the Node not yet
        status = (api.get("nodes", "node-a") or {})["status"]
        assert status["allocatable"][GPU] == "8"
        synced = kubelet.sync_node_status()
        assert (synced.capacity, synced.allocatable) == ({GPU: 8}, {GPU: 7})
        status = (api.get("nodes", "node-a") or {})["status"]
        assert (status["capacity"], status["allocatable"][GPU]) == ({"cpu": "2", GPU: "8"}, "7")


def test_node_status_sync_runs_on_its_period(make_kubelet, plugins) -> None:
    kubelet = make_kubelet(node_status_sync_s=0.2)
    plugins(Health())
    listed(kubelet)
    got = kubelet.wait_for_node_status(lambda s: s.allocatable.get(GPU) == 8, timeout=5)
    assert isinstance(got, NodeStatus)


def test_a_gone_plugin_leaves_capacity_then_zero_after_the_grace_period(
    make_kubelet, plugins
) -> None:
    kubelet = make_kubelet(endpoint_grace_s=0.5)
    manager = plugins(Health())
    listed(kubelet)
    assert kubelet.sync_node_status().allocatable == {GPU: 8}
    manager.stop()  # the plugin goes away: its stream ends, every device turns Unhealthy
    assert poll(lambda: kubelet.sync_node_status().allocatable == {GPU: 0}, 5)
    assert kubelet.node_status.capacity == {GPU: 8}
    time.sleep(0.6)
    assert kubelet.sync_node_status().capacity == {GPU: 0}


def test_allocated_resources_status_follows_list_and_watch(make_kubelet, plugins) -> None:
    with ApiServer() as api:
        api.apply("ADDED", {"kind": "Pod", "apiVersion": "v1",
                            "metadata": {"name": "train", "namespace": "ml", "uid": "uid-train"},
                            "spec": {"containers": [{"name": "main"}]}, "status": {}})  # fmt: skip
        kubelet = make_kubelet(api=api)
        health = Health()
        plugins(health)
        listed(kubelet)
        kubelet.admit("ml", "train", {"main": {GPU: 2}})
        held = kubelet.allocated("ml", "train")["main"][GPU]

        def in_api() -> dict[str, str]:
            pod = api.get("pods", "train", "ml") or {}
            [status] = pod["status"]["containerStatuses"]
            [group] = status["allocatedResourcesStatus"]
            assert group["name"] == GPU
            return {r["resourceID"]: r["health"] for r in group["resources"]}

        assert in_api() == dict.fromkeys(held, "Healthy")
        bad = UUIDS.index(held[1])
        health.xid(bad, 79)
        want = {held[0]: "Healthy", held[1]: "Unhealthy"}
        assert poll(lambda: in_api() == want, PUSH_S), in_api()
        assert kubelet.resource_health("ml", "train") == {"main": want}
        health.expire()
        assert poll(lambda: in_api() == dict.fromkeys(held, "Healthy"), PUSH_S), in_api()


def test_admission_takes_only_free_healthy_devices_and_prefers_the_plugins_choice(
    make_kubelet, plugins
) -> None:
    kubelet = make_kubelet()
    health = Health(4)
    plugins(health)
    listed(kubelet, 4)
    health.xid(0, 79)
    assert kubelet.plugins[GPU].wait_for(lambda d: d[UUIDS[0]] == "Unhealthy", timeout=PUSH_S)
    kubelet.admit("ml", "pair", {"main": {GPU: 2}})
    # GetPreferredAllocation picked two GPUs, never the unhealthy one
    pair = kubelet.allocated("ml", "pair")["main"][GPU]
    assert len(pair) == 2 and UUIDS[0] not in pair
    with pytest.raises(AdmissionError, match="Requested: 2, Available: 1"):
        kubelet.admit("ml", "more", {"main": {GPU: 2}})
    assert kubelet.allocated("ml", "more") == {}
    with pytest.raises(AdmissionError, match=r"no device plugin registered for nvidia\.com/mig"):
        kubelet.admit("ml", "mig", {"main": {"nvidia.com/mig-1g.10gb": 1}})


@pytest.mark.parametrize(
    ("resource", "problem"),
    [
        ("nvidia.com/mig-1g.10gb+me", "at most 63 letters, digits"),
        ("NVIDIA.com/gpu", "not a lowercase DNS subdomain"),
        ("kubernetes.io/gpu", "not one for extended resources"),
        ("nvidia.com/" + "g" * 64, "at most 63"),
    ],
)
def test_registration_refuses_what_the_kubelet_refuses(
    dirs: tuple[Path, Path], make_kubelet, resource: str, problem: str
) -> None:
    make_kubelet()
    channel = grpc.insecure_channel(f"unix:{dirs[0] / 'kubelet.sock'}")
    with channel, pytest.raises(grpc.RpcError) as err:
        pb_grpc.RegistrationStub(channel).Register(
            pb.RegisterRequest(version="v1beta1", endpoint="x.sock", resource_name=resource),
            timeout=5,
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert problem in str(err.value.details())
