"""The real path end to end: ``gpu-exporter --device-plugin`` as its own process on the NVML
stand-in, the kubelet stand-in registering it, faults injected through the stand-in's state.

Checks that each channel (ListAndWatch, /health JSON, /metrics) shows what docs/health.md
promises for XIDs 79, 48, 94 and 13, a lost GPU, recovery, MIG, time-slicing, Allocate and
GetPreferredAllocation on NVML's real topology, and kubelet restarts.
"""

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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpuquota.exporter.app import build_health
from gpuquota.exporter.cli import build_parser
from gpuquota.sim.apiserver import ApiServer
from gpuquota.sim.harness import poll, stop_process
from gpuquota.sim.kubelet.registration import KubeletStandIn, PluginClient
from gpuquota.sim.nvml.control import SimNode
from gpuquota.sim.nvml.spec import load as load_spec
from tests.exporter.scrape import parse, value

# Upper bounds for waits, generous for a loaded machine; the latency itself is measured by
# bench/health.py (milliseconds), never asserted here.
PUSH_S = 5.0
GPU = "nvidia.com/gpu"
QUIET_S = 1.0
SERVING = re.compile(r"serving http://([\d.]+):(\d+)/metrics")


class Exporter:
    """One gpu-exporter process with its simulated node and kubelet (or, with ``beside``,
    another agent on the same node and kubelet: a surge rollout's new agent)."""

    def __init__(self, preset: str, *flags: str, beside: Exporter | None = None) -> None:
        self.owner = beside is None
        if beside is None:
            self.work = Path(tempfile.mkdtemp(prefix="e2e-", dir="/tmp"))
            self.plugin_dir = self.work / "dp"
            self.plugin_dir.mkdir()
            self.node = SimNode.create(self.work / "state", preset)
            self.kubelet = KubeletStandIn(self.plugin_dir)
            self.kubelet.start()
        else:
            self.work, self.plugin_dir = beside.work, beside.plugin_dir
            self.node, self.kubelet = beside.node, beside.kubelet
        self.output: list[str] = []
        self._served = threading.Event()
        self.url = ""
        command = [
            sys.executable, "-m", "gpuquota.exporter.cli", "--listen", "127.0.0.1:0", "--interval", "200ms",
            "--device-plugin", "--device-plugin-dir", str(self.plugin_dir),
            "--health-quiet-period", str(QUIET_S), *flags,
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            command, env={**os.environ, **self.node.env()}, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._served.wait(30):
            self.stop()
            raise AssertionError("exporter did not start:\n" + "".join(self.output))

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            match = SERVING.search(line)
            if match:
                self.url = f"http://{match.group(1)}:{match.group(2)}"
                self._served.set()

    def get(self, path: str) -> str:
        with urllib.request.urlopen(self.url + path, timeout=5) as response:
            return str(response.read().decode())

    def health(self) -> dict[str, dict[str, Any]]:
        return {d["uuid"]: d for d in json.loads(self.get("/health"))["devices"]}

    def plugin(self, resource: str = GPU, after: float = 0.0) -> PluginClient:
        plugin = self.kubelet.wait_for_plugin(resource, timeout=10, after=after)
        assert plugin is not None, f"{resource} never registered:\n" + "".join(self.output[-30:])
        return plugin

    def stop_agent(self) -> int:
        """Stop the exporter process only (the kubelet and node stay)."""
        code = stop_process(self.proc)
        self._reader.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return code

    def stop(self) -> int:
        code = self.stop_agent()
        if not self.owner:
            return code
        self.kubelet.stop()
        self.node.close()
        shutil.rmtree(self.work, ignore_errors=True)
        return code


def healthy(count: int) -> Callable[[dict[str, str]], bool]:
    return lambda d: len(d) == count and set(d.values()) == {"Healthy"}


def is_(uuid: str, state: str) -> Callable[[dict[str, str]], bool]:
    return lambda d: d.get(uuid) == state


@pytest.fixture(scope="module")
def h100(sim_library: Path) -> Iterator[Exporter]:
    exporter = Exporter("h100x8")
    yield exporter
    assert exporter.stop() == 0
    assert not list(exporter.plugin_dir.glob("gpuquota-*.sock"))


def test_xids_are_classified_as_the_table_says_and_recover(h100: Exporter) -> None:
    plugin = h100.plugin()
    assert plugin.wait_for(healthy(8), timeout=5)
    uuid = [h100.node.uuid(i) for i in range(8)]
    start = plugin.count()
    for gpu, xid in ((1, 79), (2, 48), (3, 94), (4, 13)):
        h100.node.inject_xid(gpu, xid)
    # Fatal ones are withdrawn within a second; application errors stay schedulable.
    got = plugin.wait_for(
        lambda d: d[uuid[1]] == d[uuid[2]] == "Unhealthy", timeout=PUSH_S, start=start
    )
    assert got is not None
    assert got.devices[uuid[3]] == got.devices[uuid[4]] == got.devices[uuid[0]] == "Healthy"

    # the four XIDs are four events, read one after another: the fatal two can reach the plugin
    # before the exporter has read the last one (it did on a loaded machine), so wait for that
    def all_four() -> dict[str, dict[str, Any]] | None:
        now = h100.health()
        return now if all(now[uuid[gpu]]["reasons"] for gpu in (1, 2, 3, 4)) else None

    verdicts = poll(all_four, PUSH_S)
    assert verdicts is not None, h100.health()
    assert json.loads(h100.get("/api/v1/health"))["summary"]["unhealthy"] == 2
    expected = {1: ("unhealthy", "reboot_node", "xid_79"), 2: ("unhealthy", "reset_gpu", "xid_48"),
                3: ("degraded", "restart_app", "xid_94"), 4: ("degraded", "restart_app", "xid_13")}  # fmt: skip
    for gpu, (state, action, reason) in expected.items():
        v = verdicts[uuid[gpu]]
        assert (v["state"], v["action"], v["reasons"][0]["reason"]) == (state, action, reason)
    assert verdicts[uuid[0]]["state"] == "healthy"

    # by their labels, not their text: the agent adds its node to every gpu_* series
    metrics = parse(h100.get("/metrics").encode())
    assert value(metrics, "gpu_health_state", gpu="1", uuid=uuid[1], state="unhealthy") == 1
    assert value(metrics, "gpu_health_reason", gpu="1", uuid=uuid[1], reason="xid_79",
                 action="reboot_node") == 1  # fmt: skip
    assert value(metrics, "gpu_health_state", gpu="4", uuid=uuid[4], state="degraded") == 1

    # No repeat for the quiet period: everything returns to healthy, on every channel.
    assert plugin.wait_for(healthy(8), timeout=QUIET_S + 2, start=plugin.count() - 1)
    assert poll(lambda: {v["state"] for v in h100.health().values()} == {"healthy"}, 3)
    metrics = parse(h100.get("/metrics").encode())
    assert value(metrics, "gpu_health_state", gpu="1", uuid=uuid[1], state="healthy") == 1


def test_ignored_xid_changes_nothing(h100: Exporter) -> None:
    plugin = h100.plugin()
    assert plugin.wait_for(healthy(8), timeout=5)
    h100.node.inject_xid(0, 45)
    time.sleep(0.3)
    assert h100.health()[h100.node.uuid(0)]["state"] == "healthy"


def test_lost_gpu_until_it_answers_again(h100: Exporter) -> None:
    plugin = h100.plugin()
    assert plugin.wait_for(healthy(8), timeout=5)
    uuid = h100.node.uuid(6)
    start = plugin.count()
    h100.node.set_lost(6)
    assert plugin.wait_for(is_(uuid, "Unhealthy"), timeout=2, start=start)
    reasons = [r["reason"] for r in h100.health()[uuid]["reasons"]]
    assert "gpu_lost" in reasons
    h100.node.set_lost(6, False)
    assert plugin.wait_for(is_(uuid, "Healthy"), timeout=2, start=start)


def test_nvml_conditions(h100: Exporter) -> None:
    plugin = h100.plugin()
    assert plugin.wait_for(healthy(8), timeout=5)
    uuid = [h100.node.uuid(i) for i in range(8)]

    def reasons(gpu: int) -> list[tuple[str, str]]:
        return [(r["reason"], r["action"]) for r in h100.health()[uuid[gpu]]["reasons"]]

    start = plugin.count()
    h100.node.set(1, remap_pending=True)
    h100.node.set(2, clock_event_reasons=0x40 | 0x1)  # hardware thermal slowdown (+ idle)
    h100.node.set_nvlink_errors(3, 0, replay=0, crc_flit=5)
    before = int(h100.node.get(4, "ecc_uncorrected_volatile"))
    h100.node.set(4, ecc_uncorrected_volatile=before + 1)
    assert plugin.wait_for(is_(uuid[4], "Unhealthy"), timeout=PUSH_S, start=start)
    assert poll(lambda: ("row_remap_pending", "reset_gpu") in reasons(1), 3)
    assert ("hw_thermal_slowdown", "none") in reasons(2)
    assert poll(lambda: ("nvlink_errors", "none") in reasons(3), 3)
    assert ("ecc_uncorrectable", "reset_gpu") in reasons(4)
    assert {h100.health()[uuid[i]]["state"] for i in (1, 2, 3)} == {"degraded"}
    assert plugin.devices()[uuid[1]] == "Healthy"  # degraded GPUs keep taking pods
    # The pending remap completes at the GPU reset, the slowdown ends; the rest heal by quiet.
    h100.node.set(1, remap_pending=False)
    h100.node.set(2, clock_event_reasons=0x1)
    assert plugin.wait_for(healthy(8), timeout=QUIET_S + PUSH_S, start=start)
    assert poll(lambda: {v["state"] for v in h100.health().values()} == {"healthy"}, 3)


def test_allocate_and_refusals(h100: Exporter) -> None:
    plugin = h100.plugin()
    assert plugin.wait_for(healthy(8), timeout=5)
    uuid = [h100.node.uuid(i) for i in range(8)]
    response = plugin.allocate([uuid[0], uuid[5]])
    c = response.container_responses[0]
    assert c.envs["NVIDIA_VISIBLE_DEVICES"] == f"{uuid[0]},{uuid[5]}"
    nodes = [d.host_path for d in c.devices]
    assert nodes[:2] == ["/dev/nvidia0", "/dev/nvidia5"] and "/dev/nvidiactl" in nodes

    start = plugin.count()
    h100.node.inject_xid(7, 95)
    assert plugin.wait_for(is_(uuid[7], "Unhealthy"), timeout=PUSH_S, start=start)
    with pytest.raises(grpc.RpcError) as err:
        plugin.allocate([uuid[7]])
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and uuid[7] in str(
        err.value.details()
    )
    with pytest.raises(grpc.RpcError) as err:
        plugin.allocate(["GPU-not-here"])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert plugin.wait_for(healthy(8), timeout=QUIET_S + 2, start=start)


def test_preferred_allocation_uses_nvml_topology(h100: Exporter) -> None:
    plugin = h100.plugin()
    uuid = [h100.node.uuid(i) for i in range(8)]
    listed = plugin.wait_for(healthy(8), timeout=PUSH_S)
    assert listed is not None  # NVML's NUMA nodes reach the kubelet: GPUs 0-3 on 0, 4-7 on 1
    assert [listed.numa[u] for u in uuid] == [(0,)] * 4 + [(1,)] * 4
    # All pairs share NVSwitch bandwidth; NVML's PCIe topology pairs 0-1, 2-3, 4-5, 6-7.
    assert sorted(plugin.preferred(uuid, [], 2)) == sorted(uuid[0:2])
    assert sorted(plugin.preferred(uuid, [uuid[5]], 2)) == sorted(uuid[4:6])
    assert sorted(plugin.preferred(uuid, [], 4)) == sorted(uuid[0:4])  # one CPU socket
    assert sorted(plugin.preferred(uuid[1:], [], 4)) == sorted(uuid[4:8])  # the other, whole


def third_endpoint(exporter: Exporter) -> str:
    """The endpoint the exporter registered last."""
    return exporter.kubelet.registrations[-1][1].endpoint


def test_kubelet_restart_and_socket_removal(h100: Exporter) -> None:
    first = h100.plugin()
    assert first.wait_for(healthy(8), timeout=5)
    restarted = time.time()
    h100.kubelet.restart()
    again = h100.plugin(after=restarted)
    assert again.wait_for(healthy(8), timeout=5)
    removed = time.time()
    (h100.plugin_dir / third_endpoint(h100)).unlink()
    assert h100.plugin(after=removed)
    # the old stream may end after the new registration: the kubelet drops the new plugin
    # too (it looks the client up by resource name), and the exporter registers again
    current = h100.kubelet.plugins
    assert poll(lambda: (p := current.get(GPU)) and healthy(8)(p.devices()), PUSH_S)


def test_surge_rollout_keeps_the_gpus_schedulable(sim_library: Path) -> None:
    """A surge rollout (the new agent starts before the old one stops, maxUnavailable 0):
    the new agent serves beside the old one on a socket of its own and registers; when the
    old one exits, the kubelet drops the plugin current for the resource (the new one's: the
    1.36 kubelet looks the client up by resource name) and marks every GPU Unhealthy; the new
    agent registers again at once, and the GPUs are Healthy and admit pods. Before: the new
    agent took the old one's socket name, the two took it from each other every half second,
    and after the old one's exit nobody registered again: the node kept no GPU."""
    old = Exporter("h100x8")
    new: Exporter | None = None
    try:
        assert old.plugin().wait_for(healthy(8), timeout=PUSH_S)
        surged = time.time()
        new = Exporter("h100x8", beside=old)
        current = new.plugin(after=surged)
        assert current.wait_for(healthy(8), timeout=PUSH_S)
        endpoints = [r.endpoint for _, r in old.kubelet.registrations]
        assert len(set(endpoints)) == 2, endpoints  # beside, not instead
        time.sleep(2)  # four reconcile rounds: nobody takes a socket back
        assert [r.endpoint for _, r in old.kubelet.registrations] == endpoints
        left = time.time()
        assert old.stop_agent() == 0
        assert poll(lambda: old.kubelet.disconnects, PUSH_S), "the stand-in dropped nobody"
        again = new.plugin(after=left)
        assert again.endpoint == endpoints[-1]
        assert again.wait_for(healthy(8), timeout=PUSH_S), "".join(new.output[-20:])
        answer = old.kubelet.admit("ml", "after-rollout", {"main": {GPU: 1}})
        assert answer["main"][GPU].envs
    finally:
        if new is not None:
            assert new.stop() == 0
        old.kubelet.stop()
        old.node.close()
        shutil.rmtree(old.work, ignore_errors=True)


def test_mig_instances_are_their_own_resource(sim_library: Path) -> None:
    exporter = Exporter("a100-mig")
    try:
        spec = load_spec("a100-mig")
        plugin = exporter.plugin("nvidia.com/mig-1g.5gb")
        assert plugin.wait_for(healthy(28), timeout=5)
        full = exporter.plugin(GPU)
        assert full.devices() == {}
        migs = spec.gpus[0].mig
        assert [m.uuid for m in migs] == exporter.node.mig_uuids(0)
        start = plugin.count()
        # Contained error on one instance: that instance degrades, nothing is withdrawn.
        exporter.node.inject_xid(0, 94, migs[2].gpu_instance_id, migs[2].compute_instance_id)
        assert poll(lambda: exporter.health()[migs[2].uuid]["state"] == "degraded", 2)
        verdicts = exporter.health()
        assert verdicts[migs[1].uuid]["state"] == "healthy"
        assert verdicts[migs[2].uuid]["parent_uuid"] == exporter.node.uuid(0)
        # Uncontained error: the whole GPU (all seven instances) is withdrawn.
        exporter.node.inject_xid(0, 95, migs[4].gpu_instance_id, migs[4].compute_instance_id)
        got = plugin.wait_for(
            lambda d: all(d[m.uuid] == "Unhealthy" for m in migs), timeout=PUSH_S, start=start
        )
        assert got is not None
        assert all(got.devices[u] == "Healthy" for u in exporter.node.mig_uuids(1))
        response = plugin.allocate([exporter.node.mig_uuids(1)[0]])
        assert (
            response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"]
            == exporter.node.mig_uuids(1)[0]
        )
    finally:
        assert exporter.stop() == 0


def test_time_slicing_and_cdi_on_mixed_topology(sim_library: Path) -> None:
    exporter = Exporter("mixed", "--time-slicing-replicas", "2", "--cdi")
    try:
        plugin = exporter.plugin(GPU)
        uuid = [exporter.node.uuid(i) for i in range(4)]
        got = plugin.wait_for(lambda d: len(d) == 6, timeout=5)  # GPUs 0, 1, 3 twice; 2 is MIG
        assert got is not None and sorted(got.devices) == sorted(
            f"{uuid[i]}::{n}" for i in (0, 1, 3) for n in (0, 1)
        )
        for profile in ("3g.20gb", "2g.10gb", "1g.5gb"):
            assert exporter.plugin(f"nvidia.com/mig-{profile}").wait_for(healthy(1), timeout=5)
        # NVLink joins 0 and 1 only.
        picked = plugin.preferred([f"{uuid[i]}::0" for i in (0, 1, 3)] + [f"{uuid[3]}::1"], [], 2)
        assert sorted(p.split("::")[0] for p in picked) == sorted(uuid[0:2])
        response = plugin.allocate([f"{uuid[3]}::1"])
        c = response.container_responses[0]
        assert [d.name for d in c.cdi_devices] == [f"nvidia.com/gpu={uuid[3]}"]
        assert c.envs["NVIDIA_VISIBLE_DEVICES"] == "void" and not c.devices
    finally:
        assert exporter.stop() == 0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--time-slicing-replicas", "0"], "must be >= 1"),
        (["--health-quiet-period", "-3"], "invalid duration '-3'"),
        (["--health-quiet-period", "0"], "duration '0' must be positive"),
        (["--health-quiet-period", "soon"], "invalid duration 'soon'"),
    ],
)
def test_bad_flag_values_exit_2(
    capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["--device-plugin", *flags])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--resource-name", "gpu"], "invalid resource name 'gpu'"),
        (
            ["--device-plugin-dir", "/nonexistent/dp"],
            "--device-plugin-dir /nonexistent/dp: no such folder",
        ),
        (["--node-taint", "--node-name", ""], "need --node-name"),
    ],
)
def test_bad_settings_are_refused(flags: list[str], message: str) -> None:
    args = build_parser().parse_args(["--device-plugin", "--device-plugin-dir", "/tmp", *flags])
    with pytest.raises(ValueError) as err:
        build_health(args)
    assert message in str(err.value)


def test_bad_health_config_exits_2(tmp_path: Path, sim_library: Path) -> None:
    node = SimNode.create(tmp_path / "state", "l4x2")
    config = tmp_path / "health.yaml"
    config.write_text("xids: {48: {state: broken}}\n")
    try:
        result = subprocess.run(
            [sys.executable, "-m", "gpuquota.exporter.cli", "--listen", "127.0.0.1:0", "--health-config", str(config)],
            env={**os.environ, **node.env()}, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    finally:
        node.close()
    assert result.returncode == 2
    assert f"{config}: xids.48.state: unknown health state 'broken'" in result.stderr


def test_node_taint_and_condition_through_the_cli(sim_library: Path, tmp_path: Path) -> None:
    with ApiServer() as api:
        api.apply("ADDED", {"kind": "Node", "apiVersion": "v1",
                            "metadata": {"name": "node-a", "uid": "uid-node-a"}, "spec": {}, "status": {}})  # fmt: skip
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        exporter = Exporter("l4x2", "--node-taint", "--node-condition", "--node-name", "node-a",
                            "--kubeconfig", str(kubeconfig))  # fmt: skip
        try:
            plugin = exporter.plugin()
            assert plugin.wait_for(healthy(2), timeout=PUSH_S)

            def node_says() -> tuple[list[str], str | None]:
                obj = api.get("nodes", "node-a") or {}
                taints = [t["key"] for t in (obj.get("spec") or {}).get("taints") or []]
                conds = {
                    c["type"]: c["status"]
                    for c in (obj.get("status") or {}).get("conditions") or []
                }
                return taints, conds.get("GPUUnhealthy")

            assert poll(lambda: node_says() == ([], "False"), 10)
            exporter.node.inject_xid(1, 79)
            assert poll(lambda: node_says() == (["gpuquota.io/gpu-unhealthy"], "True"), 10)
            assert poll(lambda: node_says() == ([], "False"), QUIET_S + 10)
        finally:
            assert exporter.stop() == 0
