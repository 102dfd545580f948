"""The collector, XID watcher and renderer in-process, through the real pynvml against the
NVML stand-in (node.preload())."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from gpuquota.exporter.collect.loop import CollectLoop, RoundDone
from gpuquota.exporter.collect.nvml import GPU_IS_LOST, NOT_SUPPORTED, NvmlApi
from gpuquota.exporter.collect.reader import REPROBE_COLLECTIONS
from gpuquota.exporter.collect.schedule import STARTUP_GPUS_PER_ROUND
from gpuquota.exporter.collect.xid import XidEvent, XidWatcher
from gpuquota.exporter.expose.render import Renderer, RenderOptions
from gpuquota.exporter.health.config import parse_config
from gpuquota.exporter.health.engine import DeviceTracker
from gpuquota.exporter.health.verdict import State
from gpuquota.exporter.snapshot import DeviceState, NodeSnapshot, PodRef
from gpuquota.sim.harness import wait_for
from gpuquota.sim.nvml.build import implemented_functions
from gpuquota.sim.nvml.control import SimNode
from gpuquota.sim.nvml.models import GpuModel
from gpuquota.sim.nvml.spec import GpuSpec, load
from tests.exporter.scrape import parse, value

NvmlOn = Callable[[Any], tuple[SimNode, NvmlApi]]
PRESETS = ["h100x8", "a100-mig", "l4x2", "mixed"]
NVML_ERROR_UNKNOWN = 999
EVENTS = ("nvmlEventSetCreate", "nvmlDeviceRegisterEvents", "nvmlEventSetWait_v2")
FULL = (
    *EVENTS,
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetNvLinkErrorCounter",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetFieldValues",
)

ALWAYS = {
    "gpu_info",
    "gpu_device_state",
    "gpu_memory_total_bytes",
    "gpu_memory_used_bytes",
    "gpu_memory_free_bytes",
    "gpu_memory_reserved_bytes",
    "gpu_temperature_celsius",
    "gpu_power_watts",
    "gpu_power_limit_watts",
    "gpu_energy_joules_total",
    "gpu_sm_clock_hertz",
    "gpu_memory_clock_hertz",
    "gpu_pcie_tx_bytes_per_second",
    "gpu_pcie_rx_bytes_per_second",
    "gpu_pcie_tx_bytes_total",
    "gpu_pcie_rx_bytes_total",
    "gpu_clock_event_seconds_total",
    "gpuquota_exporter_read_age_seconds",
    "gpu_pcie_replays_total",
    "gpu_performance_state",
    "gpu_clock_event_reason",
    "gpu_process_memory_used_bytes",
    "gpu_xid_errors_total",
    "gpu_history_changes_total",  # the fleet history's change counter: one per physical GPU
}
# Engine utilisation is not reported on a MIG-enabled parent (NVML answers per instance).
UTILISATION = {
    "gpu_utilization_ratio",
    "gpu_memory_utilization_ratio",
    "gpu_decoder_utilization_ratio",
}
BY_FEATURE: dict[str, set[str]] = {
    "encoder": {"gpu_encoder_utilization_ratio"},
    "fan": {"gpu_fan_speed_ratio"},
    "memory_temperature": {"gpu_memory_temperature_celsius"},
    "ecc": {
        "gpu_ecc_mode_enabled",
        "gpu_ecc_volatile_errors_total",
        "gpu_ecc_aggregate_errors_total",
    },
    "row_remapping": {
        "gpu_remapped_rows_total",
        "gpu_row_remap_pending",
        "gpu_row_remap_failure",
    },
    "page_retirement": {"gpu_retired_pages_total", "gpu_retired_pages_pending"},
}
MIG_DEVICE = {
    "gpu_mig_info",
    "gpu_device_state",
    "gpu_memory_total_bytes",
    "gpu_memory_used_bytes",
    "gpu_memory_free_bytes",
    "gpu_memory_reserved_bytes",
}
DCGM_ALWAYS = {
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
}
DCGM_UTILISATION = {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_DEC_UTIL"}
DCGM_BY_FEATURE: dict[str, set[str]] = {
    "encoder": {"DCGM_FI_DEV_ENC_UTIL"},
    "memory_temperature": {"DCGM_FI_DEV_MEMORY_TEMP"},
    "row_remapping": {
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    },
}


def expected_native(gpu: GpuSpec) -> set[str]:
    model: GpuModel = gpu.model
    names = set(ALWAYS)
    if not gpu.mig:
        names |= UTILISATION
    for feature, metrics in BY_FEATURE.items():
        if getattr(model, feature) and not (feature == "encoder" and gpu.mig):
            names |= metrics
    if model.nvlinks:
        names.add("gpu_nvlink_errors_total")  # connected or not, the links have counters
    return names


def expected_dcgm(gpu: GpuSpec) -> set[str]:
    names = set(DCGM_ALWAYS)
    if not gpu.mig:
        names |= DCGM_UTILISATION
    for feature, metrics in DCGM_BY_FEATURE.items():
        if getattr(gpu.model, feature) and not (feature == "encoder" and gpu.mig):
            names |= metrics
    return names


def names_by_key(samples: dict[str, list[tuple[dict[str, str], float]]], key: str) -> dict:
    out: dict[Any, set[str]] = {}
    for name, series in samples.items():
        for labels, _value in series:
            if key in labels:
                out.setdefault((labels[key], labels.get("GPU_I_ID")), set()).add(name)
    return out


# --- every metric on every preset --------------------------------------------------------------


def test_the_stand_in_implements_every_function_these_tests_read() -> None:
    # No skipping while a function is missing: a stand-in that lost one must fail here.
    assert set(FULL) <= implemented_functions(), set(FULL) - implemented_functions()


@pytest.mark.parametrize("preset", PRESETS)
def test_every_metric_on_every_preset(nvml_on: NvmlOn, sim_library, preset: str) -> None:
    node, api = nvml_on(preset)
    spec = load(preset)
    for gpu in spec.gpus:
        node.add_process(gpu.index, 1000 + gpu.index, (1 + gpu.index) * 2**30)
    xid = XidWatcher(api)
    xid.start()
    try:
        for gpu in spec.gpus:
            node.inject_xid(gpu.index, 31)
        wait_for(lambda: sum(sum(c.values()) for c in xid.counts().values()) == len(spec.gpus))
        collector = CollectLoop(api, hostname="sim", xid=xid)
        snapshot = collector.collect_once()
    finally:
        xid.stop()

    native = parse(Renderer().render(snapshot))
    by_uuid = names_by_key(native, "uuid")
    for gpu in spec.gpus:
        got = by_uuid[(gpu.uuid, None)]
        if gpu.mig:  # real NVML answers engine utilisation per instance only; allow either
            got -= UTILISATION
        assert got == expected_native(gpu), f"GPU {gpu.index} ({gpu.model.key})"
        # one spelling on every GPU: an L4 (no MIG at all) says "false" like a MIG-off H100
        mig_mode = value(native, "gpu_info", uuid=gpu.uuid) and next(
            lbl["mig_mode"] for lbl, _v in native["gpu_info"] if lbl["uuid"] == gpu.uuid
        )
        assert mig_mode == ("true" if gpu.mig else "false"), gpu.model.key
        for mig in gpu.mig:
            assert by_uuid[(mig.uuid, None)] == MIG_DEVICE, mig.uuid
            labels = {"uuid": mig.uuid, "gpu": str(gpu.index)}
            assert value(native, "gpu_mig_info", parent_uuid=gpu.uuid, **labels) == 1
            got_profile = value(native, "gpu_mig_info", mig_profile=mig.profile.name, **labels)
            assert got_profile == 1
            # one profile label, not two: the mig_profile every per-MIG series carries
            (info,) = [lbl for lbl, _v in native["gpu_mig_info"] if lbl["uuid"] == mig.uuid]
            assert "profile" not in info
    assert value(native, "gpuquota_exporter_devices", kind="gpu") == len(spec.gpus)
    migs = sum(len(g.mig) for g in spec.gpus)
    assert value(native, "gpuquota_exporter_devices", kind="mig") == migs
    assert value(native, "gpuquota_exporter_nvml_up") == 1
    assert value(native, "gpu_driver_info", driver_version=spec.driver_version) == 1
    assert snapshot.nvml_errors_total == {}, snapshot.nvml_errors_total

    dcgm = parse(Renderer(RenderOptions(compat=frozenset({"dcgm"}))).render(snapshot))
    dcgm_only = {k: v for k, v in dcgm.items() if k.startswith("DCGM_")}
    by_dcgm = names_by_key(dcgm_only, "UUID")
    for gpu in spec.gpus:
        got = by_dcgm[(gpu.uuid, None)] - (DCGM_UTILISATION if gpu.mig else set())
        assert got == expected_dcgm(gpu), f"GPU {gpu.index}"
        for mig in gpu.mig:
            key = (gpu.uuid, str(mig.gpu_instance_id))
            assert by_dcgm[key] == {"DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED"}


def test_values_follow_the_stand_in(nvml_on: NvmlOn, sim_library) -> None:
    node, api = nvml_on("h100x8")
    for i in range(node.gpu_count):
        node.set(
            i,
            power_watts=100.0 + i,
            gpu_utilization_ratio=i / 10,
            memory_utilization_ratio=i / 20,
            gpu_temperature_celsius=40.0 + i,
            memory_used_bytes=(i + 1) * 2**30,
            sm_clock_hertz=(1000 + i) * 1e6,
            clock_event_reasons=0x40 if i == 3 else 0,
            ecc_uncorrected_aggregate=i,
            performance_state=2 if i == 5 else 0,
        )
    node.set_nvlink_errors(2, 5, replay=3, crc_flit=7)
    snapshot = CollectLoop(api).collect_once()
    samples = parse(Renderer(RenderOptions(compat=frozenset({"dcgm"}))).render(snapshot))
    for i in range(node.gpu_count):
        labels = {"gpu": str(i), "uuid": node.uuid(i)}
        assert value(samples, "gpu_power_watts", **labels) == pytest.approx(100.0 + i)
        assert value(samples, "gpu_utilization_ratio", **labels) == pytest.approx(i / 10)
        assert value(samples, "gpu_memory_utilization_ratio", **labels) == pytest.approx(i / 20)
        assert value(samples, "gpu_temperature_celsius", **labels) == 40 + i
        assert value(samples, "gpu_memory_used_bytes", **labels) == (i + 1) * 2**30
        assert value(samples, "gpu_sm_clock_hertz", **labels) == (1000 + i) * 1e6
        assert value(samples, "gpu_ecc_aggregate_errors_total", type="uncorrected", **labels) == i
        throttled = value(samples, "gpu_clock_event_reason", reason="hw_thermal_slowdown", **labels)
        assert throttled == (1 if i == 3 else 0)
        assert value(samples, "gpu_performance_state", **labels) == (2 if i == 5 else 0)
        dcgm = {"gpu": str(i), "UUID": node.uuid(i)}
        assert value(samples, "DCGM_FI_DEV_POWER_USAGE", **dcgm) == pytest.approx(100.0 + i)
        assert value(samples, "DCGM_FI_DEV_GPU_UTIL", **dcgm) == pytest.approx(i * 10)
        assert value(samples, "DCGM_FI_DEV_FB_USED", **dcgm) == (i + 1) * 1024
        assert value(samples, "DCGM_FI_DEV_SM_CLOCK", **dcgm) == 1000 + i
    link = {"gpu": "2", "link": "5"}
    assert value(samples, "gpu_nvlink_errors_total", type="replay", **link) == 3
    assert value(samples, "gpu_nvlink_errors_total", type="crc_flit", **link) == 7


def test_energy_counter_rises_with_power(nvml_on: NvmlOn) -> None:
    node, api = nvml_on("l4x2")
    node.set(0, power_watts=70.0, energy_joules=1000.0)
    collector = CollectLoop(api)
    first = collector.collect_once().devices[0].energy_joules
    time.sleep(0.2)
    second = collector.collect_once().devices[0].energy_joules
    assert first is not None and second is not None
    assert 1000.0 <= first < second < 1000.0 + 70.0 * 2


# --- faults ------------------------------------------------------------------------------------


def test_gpu_lost_mid_run_leaves_the_others_reporting(nvml_on: NvmlOn) -> None:
    node, api = nvml_on("h100x8")
    collector = CollectLoop(api)
    before = collector.collect_once()
    assert all(d.state is DeviceState.OK for d in before.devices)

    node.set_lost(3)
    during = collector.collect_once()
    states = {d.index: d.state for d in during.devices}
    assert states[3] is DeviceState.LOST
    assert all(s is DeviceState.OK for i, s in states.items() if i != 3)
    lost = during.devices[3]
    assert lost.uuid == node.uuid(3)  # still named, from the cached identity
    assert lost.power_watts is None
    assert sum(during.nvml_errors_total.values()) >= 1

    samples = parse(Renderer().render(during))
    assert value(samples, "gpu_device_state", uuid=node.uuid(3), state="lost") == 1
    assert value(samples, "gpuquota_exporter_devices_lost") == 1
    assert value(samples, "gpu_info", uuid=node.uuid(3)) == 1
    assert len(samples["gpu_power_watts"]) == 7
    errors = sum(v for _lbl, v in samples["gpuquota_exporter_nvml_errors_total"])
    assert errors >= 1

    node.set_lost(3, lost=False)
    after = collector.collect_once()
    assert after.devices[3].state is DeviceState.OK
    assert after.devices[3].power_watts is not None


def test_reset_required_is_flagged(nvml_on: NvmlOn) -> None:
    node, api = nvml_on("l4x2")
    collector = CollectLoop(api)
    collector.collect_once()
    node.set_reset_required(1)
    snapshot = collector.collect_once()
    assert snapshot.devices[1].state is DeviceState.RESET_REQUIRED
    assert snapshot.devices[0].state is DeviceState.OK


def test_one_failing_function_hides_only_its_value(nvml_on: NvmlOn) -> None:
    node, api = nvml_on("h100x8")
    node.fail_call(1, "nvmlDeviceGetPowerUsage", NVML_ERROR_UNKNOWN)
    collector = CollectLoop(api)
    snapshot = collector.collect_once()
    snapshot = collector.collect_once()
    gpu1 = snapshot.devices[1]
    assert gpu1.state is DeviceState.OK
    assert gpu1.power_watts is None
    assert gpu1.gpu_temperature_celsius is not None
    assert gpu1.errors and gpu1.errors[0][0] == "nvmlDeviceGetPowerUsage"
    assert snapshot.devices[0].power_watts is not None
    assert snapshot.nvml_errors_total == {"nvmlDeviceGetPowerUsage": 2}

    samples = parse(Renderer().render(snapshot))
    assert {lbl["gpu"] for lbl, _ in samples["gpu_power_watts"]} == {
        str(i) for i in range(8) if i != 1
    }
    assert (
        value(samples, "gpuquota_exporter_nvml_errors_total", function="nvmlDeviceGetPowerUsage")
        == 2
    )

    node.fail_call(1, "nvmlDeviceGetPowerUsage", None)
    assert collector.collect_once().devices[1].power_watts is not None


def test_not_supported_is_omitted_and_not_an_error(nvml_on: NvmlOn) -> None:
    node, api = nvml_on("l4x2")
    node.fail_call(0, "nvmlDeviceGetTemperature", NOT_SUPPORTED)
    snapshot = CollectLoop(api).collect_once()
    assert snapshot.devices[0].gpu_temperature_celsius is None
    assert snapshot.devices[1].gpu_temperature_celsius is not None
    assert snapshot.nvml_errors_total == {}
    text = Renderer().render(snapshot).decode()
    assert 'gpu_temperature_celsius{gpu="0"' not in text


def test_not_supported_is_asked_again_only_every_reprobe_period(nvml_on: NvmlOn) -> None:
    # Seen on a real H100 SXM: with MIG off, every round after the 60th asked the
    # NOT_SUPPORTED fan speed again (131 calls in 189 rounds, 0.36 ms each).
    node, api = nvml_on("l4x2")
    for gpu in (0, 1):
        node.fail_call(gpu, "nvmlDeviceGetFanSpeed", NOT_SUPPORTED)
    collector = CollectLoop(api)
    rounds = 3 * REPROBE_COLLECTIONS + 5
    for _ in range(rounds):
        collector.collect_once()
    calls, _seconds = api.call_stats()["nvmlDeviceGetFanSpeed"]
    assert calls <= 2 * (rounds // REPROBE_COLLECTIONS + 1)


def test_lost_identity_read_keeps_other_gpus(nvml_on: NvmlOn) -> None:
    node, api = nvml_on("l4x2")
    node.set_lost(0)
    snapshot = CollectLoop(api).collect_once()  # GPU 0 lost before its identity was ever read
    assert snapshot.devices[0].state is DeviceState.LOST
    assert snapshot.devices[1].state is DeviceState.OK
    # Renders without a UUID it never learned; the lost flag is still visible.
    samples = parse(Renderer().render(snapshot))
    assert value(samples, "gpu_device_state", gpu="0", state="lost") == 1


def test_nvml_code_for_lost_matches_the_stand_in() -> None:
    assert GPU_IS_LOST == 15


# --- XID events --------------------------------------------------------------------------------


def test_xid_watcher_counts_and_notifies(nvml_on: NvmlOn, sim_library) -> None:
    node, api = nvml_on("mixed")
    xid = XidWatcher(api)
    seen: list[XidEvent] = []
    xid.add_listener(seen.append)
    xid.add_listener(lambda _e: 1 / 0)  # a broken listener must not stop the others
    xid.start()
    try:
        node.inject_xid(0, 79)
        node.inject_xid(0, 79)
        node.inject_xid(2, 94, gpu_instance_id=1, compute_instance_id=0)
        wait_for(lambda: len(seen) == 3)
    finally:
        xid.stop()  # returns once the 500 ms wait times out
    assert xid.counts() == {node.uuid(0): {79: 2}, node.uuid(2): {94: 1}}
    assert xid.last()[node.uuid(0)] == 79
    mig_event = seen[2]
    assert (mig_event.uuid, mig_event.gpu_index, mig_event.xid) == (node.uuid(2), 2, 94)
    assert (mig_event.gpu_instance_id, mig_event.compute_instance_id) == (1, 0)
    assert seen[0].gpu_instance_id is None
    assert not xid.is_alive()


# --- the loop, enrichers and subscribers -------------------------------------------------------


def test_background_loop_enrichers_and_subscribers(nvml_on: NvmlOn) -> None:
    node, api = nvml_on("l4x2")
    collector = CollectLoop(api, interval=0.1)
    uuid0 = node.uuid(0)

    def add_pods(snapshot: NodeSnapshot) -> NodeSnapshot:
        return replace(snapshot, pods={uuid0: (PodRef("team-a", "job-1", "main"),)})

    def broken(_snapshot: NodeSnapshot) -> NodeSnapshot:
        raise RuntimeError("kubelet away")

    got: list[NodeSnapshot] = []
    done = threading.Event()

    def on_snapshot(snapshot: NodeSnapshot) -> None:
        got.append(snapshot)
        if len(got) >= 3:
            done.set()

    collector.add_enricher(broken)
    collector.add_enricher(add_pods)
    collector.subscribe(on_snapshot)
    collector.start()
    try:
        assert done.wait(10)
        assert collector.is_alive()
    finally:
        collector.stop()
    assert not collector.is_alive()
    latest = collector.latest()
    assert latest is not None and latest is got[-1]
    assert [s.collections_total for s in got[:3]] == [1, 2, 3]
    assert latest.pods == {uuid0: (PodRef("team-a", "job-1", "main"),)}
    samples = parse(Renderer().render(latest))
    assert value(samples, "gpu_pod_info", uuid=uuid0, namespace="team-a", pod="job-1") == 1


def test_nvlink_counters_follow_changes_between_collections(nvml_on: NvmlOn) -> None:
    node, api = nvml_on("h100x8")
    collector = CollectLoop(api)
    first = collector.collect_once().devices[4].nvlinks
    assert len(first) == 18 and all(c.crc_data_errors == 0 for c in first)
    unchanged = collector.collect_once().devices[4].nvlinks
    assert unchanged is first  # totals unchanged: per-link counters not re-read
    node.set_nvlink_errors(4, 17, crc_data=5, recovery=1)
    changed = collector.collect_once().devices[4].nvlinks
    assert (changed[17].crc_data_errors, changed[17].recovery_errors) == (5, 1)
    assert changed[0].crc_data_errors == 0


def test_xid_registration_failure_leaves_one_gpu_out(nvml_on: NvmlOn, sim_library, caplog) -> None:
    caplog.set_level(logging.INFO, logger="gpuquota.exporter.collect.xid")
    node, api = nvml_on("l4x2")
    node.fail_call(0, "nvmlDeviceRegisterEvents", NOT_SUPPORTED)
    xid = XidWatcher(api)
    seen: list[XidEvent] = []
    xid.add_listener(seen.append)
    xid.start()
    try:
        assert xid.watched == [node.uuid(1)]
        node.inject_xid(1, 13)
        wait_for(lambda: len(seen) == 1)
    finally:
        xid.stop()
    assert [r.message for r in caplog.records if "XID" in r.message] == [
        "GPU 0 does not report XID events; not watching it",
        f"XID 13 on GPU 1 ({node.uuid(1)})",
    ]


def test_mig_processes_and_memory_belong_to_their_instance(nvml_on: NvmlOn) -> None:
    node, api = nvml_on("a100-mig")
    node.add_process(0, 4242, 2**30, gpu_instance_id=2, compute_instance_id=0)
    node.set_mig_memory_used(0, 1, 3 * 2**30)
    snapshot = CollectLoop(api).collect_once()
    instance = next(d for d in snapshot.devices if d.mig and d.mig.gpu_instance_id == 2)
    assert instance.uuid == node.mig_uuids(0)[1]
    assert [(p.pid, p.used_memory_bytes) for p in instance.processes] == [(4242, 2**30)]
    assert instance.memory_used_bytes == 3 * 2**30
    samples = parse(Renderer().render(snapshot))
    labels = {"uuid": instance.uuid, "gpu": "0", "gpu_instance_id": "2", "mig_profile": "1g.5gb"}
    assert value(samples, "gpu_process_memory_used_bytes", pid="4242", **labels) == 2**30


def test_a_round_without_nvml_is_flagged_and_recovers(nvml_on: NvmlOn) -> None:
    node, api = nvml_on("l4x2")
    collector = CollectLoop(api)
    good = collector.collect_once()
    node.fail_call(None, "nvmlDeviceGetCount", NVML_ERROR_UNKNOWN)
    bad = collector.collect_once()
    assert not bad.ok
    # issue 13: a node-wide call failing keeps the last known devices, read as usual
    assert [d.state for d in bad.devices] == [DeviceState.OK, DeviceState.OK]
    assert [d.uuid for d in bad.devices] == [node.uuid(0), node.uuid(1)]
    assert bad.last_success_at == good.collected_at
    samples = parse(Renderer().render(bad))
    assert value(samples, "gpuquota_exporter_nvml_up") == 0
    assert value(samples, "gpuquota_exporter_nvml_errors_total", function="nvmlDeviceGetCount") == 1
    node.fail_call(None, "nvmlDeviceGetCount", None)
    again = collector.collect_once()
    assert again.ok and again.devices[0].state is DeviceState.OK
    assert again.last_success_at == again.collected_at


def test_partial_failure_stays_partial(nvml_on: NvmlOn) -> None:
    """nvmlDeviceGetCount failing for several rounds: every GPU still readable keeps its
    readings and stays healthy; only the GPU that really cannot be read is marked."""
    node, api = nvml_on("h100x8")
    collector = CollectLoop(api)
    tracker = DeviceTracker(parse_config(None, quiet_period_s=0.5))
    tracker.observe_snapshot(collector.collect_once(), now=1)
    node.fail_call(None, "nvmlDeviceGetCount", NVML_ERROR_UNKNOWN)
    node.set_lost(5)
    node.set(2, power_watts=321.0, gpu_utilization_ratio=0.5)
    for now in (2, 3, 4):  # seconds of failure
        bad = collector.collect_once()
        health = tracker.observe_snapshot(bad, now=now)
    assert not bad.ok
    assert [d.uuid for d in bad.devices] == [node.uuid(i) for i in range(8)]
    assert [d.state for d in bad.devices] == [DeviceState.OK] * 5 + [DeviceState.LOST] + [
        DeviceState.OK
    ] * 2
    assert (bad.devices[2].power_watts, bad.devices[2].gpu_utilization_ratio) == (321.0, 0.5)
    states = {d.uuid: d.state for d in health.devices}
    assert states.pop(node.uuid(5)) is not State.HEALTHY
    assert set(states.values()) == {State.HEALTHY}
    samples = parse(Renderer().render(bad))
    assert value(samples, "gpu_power_watts", uuid=node.uuid(2), gpu="2") == 321.0
    assert value(samples, "gpu_device_state", uuid=node.uuid(5), gpu="5", state="lost") == 1
    assert value(samples, "gpu_device_state", uuid=node.uuid(7), gpu="7", state="ok") == 1


def test_a_failed_recovery_action_read_leaves_the_verdict_as_it_was(nvml_on: NvmlOn) -> None:
    """The driver asks for a reboot (field 230); then a round's batched field read fails: the
    snapshot does not know the recovery action (None, the error counted), which the health
    rules must not take for NONE: the verdict stays as it was until a reading says NONE."""
    node, api = nvml_on("h100x8")
    collector = CollectLoop(api)
    tracker = DeviceTracker(parse_config(None, quiet_period_s=0.5))
    node.set(0, recovery_action=2)
    asking = tracker.observe_snapshot(collector.collect_once(), now=1)
    node.fail_call(0, "nvmlDeviceGetFieldValues", NVML_ERROR_UNKNOWN)
    failed = collector.collect_once()
    assert failed.devices[0].state is DeviceState.OK
    assert failed.devices[0].recovery_action is None
    assert "nvmlDeviceGetFieldValues" in dict(failed.devices[0].errors)
    health = tracker.observe_snapshot(failed, now=2)
    assert health.generation == asking.generation  # nothing changed
    gpu0 = health.by_uuid()[node.uuid(0)]
    assert (gpu0.state, [r.code for r in gpu0.reasons]) == (State.UNHEALTHY, ["recovery_reboot"])
    node.fail_call(0, "nvmlDeviceGetFieldValues", None)
    node.set(0, recovery_action=0)
    health = tracker.observe_snapshot(collector.collect_once(), now=3)
    assert health.by_uuid()[node.uuid(0)].state is State.HEALTHY


# --- tiers, concurrency and NVML latency (issue 9) ---------------------------------------------


def test_each_value_is_read_at_its_metrics_tier(nvml_on: NvmlOn) -> None:
    node, api = nvml_on({"model": "H100-SXM5-80GB", "count": 2})
    collector = CollectLoop(api, interval=0.1, slow_interval=60.0)
    collector.start()
    try:
        ecc_reads = api.call_stats()["nvmlDeviceGetTotalEccErrors"][0]
        node.set(0, power_watts=55.0, ecc_corrected_volatile=7)
        wait_for(lambda: (s := collector.latest()) is not None and s.devices[0].power_watts == 55.0)
        rounds = collector.latest().collections_total  # type: ignore[union-attr]
        wait_for(lambda: collector.latest().collections_total >= rounds + 3)  # type: ignore[union-attr]
        fast_only = collector.latest()
        assert fast_only is not None
        assert fast_only.devices[0].ecc_corrected_volatile == 0  # slow tier: not yet re-read
        assert api.call_stats()["nvmlDeviceGetTotalEccErrors"][0] == ecc_reads
    finally:
        collector.stop()
    full = collector.collect_once()  # every tier
    assert full.devices[0].ecc_corrected_volatile == 7
    samples = parse(Renderer().render(full))
    labels = {"uuid": node.uuid(0), "gpu": "0"}
    assert value(samples, "gpuquota_exporter_read_age_seconds", tier="fast", **labels) < 5
    assert value(samples, "gpuquota_exporter_read_age_seconds", tier="once", **labels) >= 0
    calls = value(samples, "gpuquota_exporter_nvml_calls_total", function="nvmlDeviceGetPowerUsage")
    assert calls == full.nvml_calls["nvmlDeviceGetPowerUsage"][0] >= rounds * 2
    assert (
        value(
            samples, "gpuquota_exporter_nvml_call_seconds_total", function="nvmlDeviceGetPowerUsage"
        )
        > 0
    )


def test_counters_replace_samples(nvml_on: NvmlOn) -> None:
    node, api = nvml_on("h100x8")
    node.set(3, pcie_tx_bytes_per_second=2e9, pcie_rx_bytes_per_second=0.0,
             clock_event_reasons=0x4)  # fmt: skip
    collector = CollectLoop(api)
    first = collector.collect_once().devices[3]
    time.sleep(0.2)
    second = collector.collect_once().devices[3]
    assert first.pcie_tx_bytes is not None and second.pcie_tx_bytes is not None
    assert second.pcie_tx_bytes - first.pcie_tx_bytes >= 0.2 * 2e9
    assert second.pcie_tx_bytes_per_second == pytest.approx(2e9, rel=0.2)
    assert second.pcie_rx_bytes_per_second == 0.0
    assert first.pcie_tx_bytes_per_second is not None  # a first reading has a rate already
    throttled = dict(second.clock_event_time_ns)
    assert throttled["sw_power_cap"] >= 0.2e9 and throttled["hw_thermal_slowdown"] == 0
    samples = parse(Renderer().render(collector.collect_once()))
    labels = {"uuid": node.uuid(3), "gpu": "3"}
    assert value(samples, "gpu_pcie_tx_bytes_total", **labels) >= 0.2 * 2e9
    assert value(samples, "gpu_clock_event_seconds_total", reason="sw_power_cap", **labels) >= 0.2
    assert "nvmlDeviceGetPcieThroughput" not in api.call_stats()  # no 20 ms samples


def test_a_hung_call_on_one_gpu_holds_up_no_other(nvml_on: NvmlOn) -> None:
    node, api = nvml_on({"model": "H100-SXM5-80GB", "count": 4, "nvml_costs": {"mode": "modelled"}})
    collector = CollectLoop(api, interval=0.1, read_timeout=0.3)
    collector.collect_once()
    node.set_call_cost(2, "nvmlDeviceGetPowerUsage", 2500)  # GPU 2's power call hangs 2.5 s
    node.set(1, power_watts=400.0)
    node.set(2, power_watts=500.0)
    started = time.monotonic()
    stalled = collector.collect_once()
    again = collector.collect_once()  # GPU 2 still busy: not even waited for
    took = time.monotonic() - started
    node.set_call_cost(2, "nvmlDeviceGetPowerUsage", 0)
    assert took < 2.0  # two rounds, each bounded by read_timeout, not by the 2.5 s call
    assert stalled.devices[1].power_watts == again.devices[1].power_watts == 400.0
    assert again.devices[2].state is DeviceState.OK
    assert again.devices[2].power_watts != 500.0  # its last complete reading
    ages = {i: dict(again.devices[i].read_at)["fast"] for i in (1, 2)}
    assert ages[2] < ages[1]  # GPU 2's fast tier is older
    time.sleep(1.0)  # more than 3 read timeouts: GPU 2 is now marked, and only GPU 2
    late = collector.collect_once()
    assert [d.state for d in late.devices] == [DeviceState.OK] * 2 + [DeviceState.ERROR] + [
        DeviceState.OK
    ]
    assert late.devices[2].uuid == node.uuid(2)
    assert late.devices[2].errors[0][1].startswith("NVML has not answered for")
    wait_for(lambda: collector.collect_once().devices[2].power_watts == 500.0, timeout=10)


def test_the_running_loop_spreads_the_slow_tier_over_rounds(nvml_on: NvmlOn) -> None:
    # issue 20: 8 GPUs, a slow cycle of 4 rounds: each round reads the slow tier of 2 GPUs
    # (6c36c52 read all 8 in the same round, 164-168 ms with one NVML queue for the library)
    _node, api = nvml_on("h100x8")
    collector = CollectLoop(api, interval=0.2, slow_interval=0.8)
    seen: list[NodeSnapshot] = []
    collector.subscribe(seen.append)
    collector.start()
    try:
        wait_for(lambda: len(seen) >= 10, timeout=30)
    finally:
        collector.stop()
    rounds = seen[:10]  # the first is collect_once: every tier of every GPU

    def slow_at(snapshot: NodeSnapshot) -> list[float]:
        return [dict(d.read_at)["slow"] for d in snapshot.devices if d.mig is None]

    assert len(set(slow_at(rounds[0]))) == 8  # each GPU's own reader
    per_round = [
        sum(a != b for a, b in zip(slow_at(before), slow_at(after), strict=True))
        for before, after in itertools.pairwise(rounds)
    ]
    assert max(per_round) <= 2, per_round
    assert sum(per_round) >= 8  # and every GPU's slow tier was read again (2 x 4 rounds)


def _busy_h100s(
    nvml_on: NvmlOn, queueing: str, sm: Callable[[int], float], tensor: float
) -> tuple[SimNode, NvmlApi]:
    """8 H100s at modelled NVML costs with the given queueing, every GPU busy: GPM activity
    and one process with utilisation samples each, so every slow turn computes a GPM pair."""
    spec = {"gpus": [{"model": "H100-SXM5-80GB", "count": 8}],
            "nvml_costs": {"mode": "modelled", "queueing": queueing}}  # fmt: skip
    node, api = nvml_on(spec)
    for i in range(8):
        node.set_gpm(i, sm_activity=sm(i), tensor_activity=tensor)
        node.add_process(i, 4000 + i, 2**30)
        node.set_process_utilization(i, 4000 + i, sm=0.9, memory=0.3)
    return node, api


@pytest.mark.parametrize("queueing", ["gpu", "library"])
def test_gpm_pairs_take_turns_and_a_round_stays_under_100_ms_of_nvml(
    nvml_on: NvmlOn, queueing: str
) -> None:
    # issue 20: every GPU's GPM pair (5.2 ms of NVML on an H100) in every round made the fast
    # tier alone 59 ms on 8 H100s; GPM is now read on each GPU's slow turn. Counted in the
    # stand-in's modelled time (its cost table's sum, whatever the machine's load), no round
    # of the running loop carries 100 ms of NVML work, and the averages stay each GPU's own.
    node, api = _busy_h100s(nvml_on, queueing, lambda i: 0.1 * (i + 1), tensor=0.5)
    collector = CollectLoop(api, interval=0.2, slow_interval=0.8)  # a 4-round slow cycle
    per_round: list[tuple[float, int]] = []  # (modelled NVML ms, GPM pairs) per round
    mark = [node.charged_ms(), node.call_count("nvmlGpmMetricsGet")]

    def count(_snapshot: NodeSnapshot) -> None:  # runs in the collect thread after a round
        now = [node.charged_ms(), node.call_count("nvmlGpmMetricsGet")]
        per_round.append((now[0] - mark[0], now[1] - mark[1]))
        mark[:] = now

    collector.subscribe(count)
    collector.start()
    try:
        wait_for(lambda: len(per_round) >= 11, timeout=60)
    finally:
        collector.stop()
    later = per_round[1:11]  # the first is a start-up round: first samples, no pair yet
    assert per_round[0][1] == 0  # a first sample only: nothing to pair it with
    assert max(pairs for _ms, pairs in later) <= 2, later  # 8 GPUs over a 4-round cycle
    assert sum(pairs for _ms, pairs in later) >= 8  # every GPU's pair in 10 rounds
    assert max(ms for ms, _pairs in later) < 100.0, later
    # each GPU's own average over its turn, for every GPU
    last = collector.latest()
    assert last is not None
    got = [d.gpm.sm_active if d.gpm else None for d in last.devices]
    assert got == pytest.approx([0.1 * (i + 1) for i in range(8)])


@pytest.mark.parametrize("queueing", ["library", "gpu"])
def test_start_up_reads_a_few_gpus_a_round_and_no_round_passes_100_ms_of_nvml(
    nvml_on: NvmlOn, queueing: str
) -> None:
    # issue 20: the first round read identity and every tier of all 8 H100s at once, 151.9 ms
    # of modelled NVML (160-195 ms measured with one queue for the library). The start-up
    # rounds now read STARTUP_GPUS_PER_ROUND GPUs in full each, publish nothing until the
    # last of them (latest() None, so /readyz is not ready), and no round, start-up or
    # later, carries 100 ms of NVML work as the stand-in counts it.
    node, api = _busy_h100s(nvml_on, queueing, lambda _i: 0.9, tensor=0.8)
    for i in range(8):
        node.set(i, ecc_corrected_volatile=i + 1)
    collector = CollectLoop(api, interval=0.2, slow_interval=1.0)
    rounds: list[tuple[RoundDone, float, NodeSnapshot | None]] = []
    mark = [node.charged_ms()]

    def count(done: RoundDone) -> None:  # in the collecting thread, after each round's reads
        now = node.charged_ms()
        rounds.append((done, now - mark[0], collector.latest()))
        mark[0] = now

    collector.watch_rounds(count)
    collector.start()
    first = collector.latest()
    try:
        wait_for(lambda: len(rounds) >= 12, timeout=60)
    finally:
        collector.stop()
    start_up = [(done, ms) for done, ms, latest in rounds if done.start_up and latest is None]
    assert len(start_up) == 8 // STARTUP_GPUS_PER_ROUND == 4
    assert [(d.round, d.published) for d, _ms in start_up] == [(1, False)] * 3 + [(1, True)]
    assert not any(done.start_up for done, _ms, _latest in rounds[4:])
    modelled = [ms for _done, ms, _latest in rounds[:12]]
    assert max(modelled) < 100.0, modelled
    assert sum(ms for _d, ms in start_up) > 140.0  # the old first round's work, spread
    # the first snapshot still carries every tier of every GPU (no ECC or health gap)
    assert first is not None and first.collections_total == 1
    assert [d.ecc_corrected_volatile for d in first.devices] == [i + 1 for i in range(8)]
    assert all({"fast", "slow", "once"} <= dict(d.read_at).keys() for d in first.devices)


def test_start_time_tells_a_restart_from_a_silence(nvml_on: NvmlOn, sim_library) -> None:
    """The exporter's start time is exported and stays while it runs (its counters go on
    counting); a new exporter (a restart: its counters begin again) exports a later one."""
    _node, api = nvml_on("h100x8")
    before = time.time()
    first = CollectLoop(api)
    one, two = first.collect_once(), first.collect_once()
    assert one.started_at == two.started_at and before <= one.started_at <= time.time()  # type: ignore[operator]
    samples = parse(Renderer().render(two))
    assert value(samples, "gpuquota_exporter_start_time_seconds") == two.started_at
    time.sleep(0.01)
    restarted = CollectLoop(api).collect_once()
    assert restarted.started_at > one.started_at  # type: ignore[operator]
