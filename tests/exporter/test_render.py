"""The metric table and the renderer, on hand-made snapshots (no NVML)."""

from __future__ import annotations

import subprocess
from dataclasses import fields, replace

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpuquota.exporter.expose import metrics
from gpuquota.exporter.expose.metrics import METRICS, MetricSpec, Scope
from gpuquota.exporter.expose.promcollector import SnapshotCollector
from gpuquota.exporter.expose.render import Renderer, RenderOptions, escape_label_value
from gpuquota.exporter.health.publishing import PublisherStatus
from gpuquota.exporter.health.verdict import Action, DeviceHealth, NodeHealth, Reason, State
from gpuquota.exporter.snapshot import DeviceSnapshot, DeviceState, GpmMetrics, PodRef
from tests.exporter.factories import GIB, gpu, mig, node
from tests.exporter.scrape import parse, value

DCGM = RenderOptions(compat=frozenset({"dcgm"}))

# dcgm-exporter's etc/default-counters.csv (uncommented rows).
DCGM_DEFAULT_COUNTERS = {
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    # DCP (profiling) fields in dcgm-exporter's default counters
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
}
# The other DCP fields dcgm-exporter serves when its counters file lists them
# (etc/dcp-metrics-included.csv and DCGM's field list).
DCGM_DCP_COUNTERS = {
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_SM_OCCUPANCY",
    "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
    "DCGM_FI_PROF_PIPE_INT_ACTIVE",
    "DCGM_FI_PROF_NVLINK_TX_BYTES",
    "DCGM_FI_PROF_NVLINK_RX_BYTES",
}


# --- the table ---------------------------------------------------------------------------------


def test_table_names_follow_prometheus_conventions() -> None:
    suffix_for_unit = {
        "bytes": "_bytes",
        "seconds": ("_seconds", "_timestamp_seconds"),
        "watts": "_watts",
        "joules": "_joules",  # counters: the unit comes before _total
        "hertz": "_hertz",
        "celsius": "_celsius",
        "ratio": "_ratio",
        "bytes/second": "_bytes_per_second",
    }
    for spec in METRICS:
        if spec.compat:
            assert spec.name.startswith("DCGM_FI_"), spec.name
            continue
        assert spec.name.startswith((metrics.PREFIX, metrics.SELF_PREFIX)), spec.name
        assert spec.name == spec.name.lower()
        if spec.type == "counter":
            assert spec.name.endswith("_total"), spec.name
        else:
            assert not spec.name.endswith("_total"), spec.name
        if spec.unit:
            suffix = suffix_for_unit[spec.unit]
            base = spec.name.removesuffix("_total") if spec.type == "counter" else spec.name
            assert base.endswith(suffix), f"{spec.name} should end in {suffix}"


def test_every_scalar_row_reads_an_existing_snapshot_field() -> None:
    device_fields = {f.name for f in fields(DeviceSnapshot)}
    for spec in METRICS:
        if spec.accessor.startswith("DeviceSnapshot.") and " " not in spec.accessor:
            attr = spec.accessor.removeprefix("DeviceSnapshot.")
            first, _dot, nested = attr.split("/")[0].partition(".")
            first = first.removesuffix("[]")
            assert first in device_fields, spec.name
            if first == "gpm" and "*" not in nested:  # GPM rows read one GpmMetrics field
                assert nested in {f.name for f in fields(GpmMetrics)}, spec.name


def test_dcgm_rows_cover_dcgm_exporter_default_counters() -> None:
    emitted = {s.name for s in METRICS if s.compat == "dcgm"}
    documented_gaps = {name for name, _why in metrics.DCGM_NOT_EMITTED}
    assert emitted | documented_gaps >= DCGM_DEFAULT_COUNTERS
    assert emitted <= DCGM_DEFAULT_COUNTERS | DCGM_DCP_COUNTERS


def test_table_rejects_bad_rows() -> None:
    with pytest.raises(ValueError, match="_total"):
        metrics.device_row("gpu_bad", "counter", "", "x", "f", "power_watts")
    with pytest.raises(ValueError, match="read_node"):
        MetricSpec("gpu_x", "gauge", "", "x", (), "f", "a", scope=Scope.NODE)
    with pytest.raises(ValueError, match="defined twice"):
        metrics.check_table([METRICS[0], METRICS[0]])


# --- rendering -------------------------------------------------------------------------------


def test_values_are_rendered_in_base_units() -> None:
    g = gpu(0)
    samples = parse(Renderer().render(node(g)))
    labels = {"gpu": "0", "uuid": g.uuid}
    assert value(samples, "gpu_power_watts", **labels) == 312.5
    assert value(samples, "gpu_memory_used_bytes", **labels) == 20 * GIB
    assert value(samples, "gpu_sm_clock_hertz", **labels) == 1980e6
    assert value(samples, "gpu_energy_joules_total", **labels) == pytest.approx(123456.789)
    assert value(samples, "gpu_utilization_ratio", **labels) == 0.75
    assert value(samples, "gpu_clock_event_reason", reason="sw_power_cap", **labels) == 1
    assert value(samples, "gpu_clock_event_reason", reason="gpu_idle", **labels) == 0
    assert value(samples, "gpu_nvlink_errors_total", link="0", type="crc_flit", **labels) == 2
    assert value(samples, "gpu_ecc_aggregate_errors_total", type="uncorrected", **labels) == 1
    assert value(samples, "gpu_process_memory_used_bytes", pid="4242", **labels) == 8 * GIB
    info = value(samples, "gpu_info", uuid=g.uuid, model="NVIDIA H100 80GB HBM3", mig_mode="false")
    assert info == 1


def test_unsupported_values_are_left_out_never_zero() -> None:
    # An L4-like board: no ECC, no fan reading, no NVLink, no memory temperature.
    l4 = gpu(
        0,
        name="NVIDIA L4",
        fan_speed_ratio=None,
        ecc_mode_enabled=None,
        ecc_corrected_volatile=None,
        ecc_uncorrected_volatile=None,
        ecc_corrected_aggregate=None,
        ecc_uncorrected_aggregate=None,
        memory_temperature_celsius=None,
        nvlinks=(),
    )
    text = Renderer(DCGM).render(node(l4))
    for absent in (
        "gpu_fan_speed_ratio",
        "gpu_ecc_mode_enabled",
        "gpu_ecc_volatile_errors_total",
        "gpu_ecc_aggregate_errors_total",
        "gpu_memory_temperature_celsius",
        "gpu_nvlink_errors_total",
        "DCGM_FI_DEV_MEMORY_TEMP",
    ):
        assert absent.encode() not in text, absent
    assert b"gpu_power_watts{" in text


def test_lost_gpu_keeps_identity_and_state_only() -> None:
    lost = DeviceSnapshot(index=1, uuid="GPU-lost", state=DeviceState.LOST, name="NVIDIA H100")
    snapshot = node(gpu(0), lost)
    samples = parse(Renderer().render(snapshot))
    assert value(samples, "gpu_device_state", uuid="GPU-lost", state="lost") == 1
    assert value(samples, "gpu_device_state", uuid="GPU-lost", state="ok") == 0
    assert value(samples, "gpuquota_exporter_devices_lost") == 1
    assert not [s for s in samples["gpu_power_watts"] if s[0]["uuid"] == "GPU-lost"]
    assert len(samples["gpu_power_watts"]) == 1


def test_mig_instances_have_their_own_series() -> None:
    parent = gpu(0, mig_mode_enabled=True)
    instances = [mig(parent, 0, 7), mig(parent, 1, 8)]
    samples = parse(Renderer().render(node(parent, *instances)))
    for inst in instances:
        assert inst.mig is not None
        labels = {"uuid": inst.uuid, "gpu": "0", "gpu_instance_id": str(inst.mig.gpu_instance_id)}
        assert value(samples, "gpu_memory_used_bytes", mig_profile="1g.5gb", **labels) == GIB
        assert value(samples, "gpu_mig_info", parent_uuid=parent.uuid, **labels) == 1
    assert value(samples, "gpuquota_exporter_devices", kind="mig") == 2
    assert value(samples, "gpu_info", uuid=parent.uuid, mig_mode="true") == 1


def test_pod_join_metric_and_pod_labels() -> None:
    g0, g1 = gpu(0), gpu(1)
    pods = {g0.uuid: (PodRef("ml", "a", "main"), PodRef("ml", "b", "main"))}
    snapshot = node(g0, g1, pods=pods)
    plain = parse(Renderer().render(snapshot))
    assert len(plain["gpu_pod_info"]) == 2
    assert {lbl["pod"] for lbl, _ in plain["gpu_pod_info"]} == {"a", "b"}
    assert all("pod" not in lbl for lbl, _ in plain["gpu_power_watts"])

    labelled = parse(Renderer(RenderOptions(pod_labels=True)).render(snapshot))
    power = labelled["gpu_power_watts"]
    assert sorted(lbl.get("pod", "") for lbl, _ in power) == ["", "a", "b"]
    # Identity and join metrics are never multiplied by pods.
    assert len(labelled["gpu_info"]) == 2
    assert len(labelled["gpu_pod_info"]) == 2


def test_without_pods_there_is_no_pod_series() -> None:
    text = Renderer(RenderOptions(pod_labels=True)).render(node())
    assert b"gpu_pod_info" not in text
    assert b'pod="' not in text


def test_one_holder_with_two_replicas_is_one_series() -> None:
    g0 = gpu(0)
    ref = PodRef("ml", "a", "main")
    text = Renderer(RenderOptions(pod_labels=True)).render(node(g0, pods={g0.uuid: (ref, ref)}))
    assert len(parse(text)["gpu_power_watts"]) == 1


def test_dcgm_compat_names_units_and_labels() -> None:
    parent = gpu(0, mig_mode_enabled=True)
    inst = mig(parent, 0, 7, "3g.40gb")
    snapshot = node(
        parent,
        inst,
        pods={inst.uuid: (PodRef("ml", "a", "c"),)},
        xid_last={parent.uuid: 79},
        hostname="node-7",
    )
    samples = parse(Renderer(DCGM).render(snapshot))
    labels = {
        "gpu": "0",
        "UUID": parent.uuid,
        "pci_bus_id": parent.pci_bus_id or "",
        "device": "nvidia0",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": "node-7",
        "DCGM_FI_DRIVER_VERSION": "550.54.15",
    }
    assert value(samples, "DCGM_FI_DEV_FB_USED", True, **labels) == 20 * 1024
    assert value(samples, "DCGM_FI_DEV_GPU_UTIL", True, **labels) == 75
    assert value(samples, "DCGM_FI_DEV_SM_CLOCK", True, **labels) == 1980
    assert value(samples, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", True, **labels) == pytest.approx(
        123456789
    )
    assert value(samples, "DCGM_FI_DEV_PCIE_TX_THROUGHPUT", True, **labels) == 500
    assert value(samples, "DCGM_FI_DEV_XID_ERRORS", True, **labels) == 79
    mig_labels = {**labels, "GPU_I_ID": "7", "GPU_I_PROFILE": "3g.40gb"}
    mig_used = value(
        samples, "DCGM_FI_DEV_FB_USED", True, pod="a", namespace="ml", container="c", **mig_labels
    )
    assert mig_used == 1024
    # Native series are still there alongside.
    assert "gpu_power_watts" in samples


def test_dcgm_counters_keep_dcgm_names_and_types() -> None:
    text = Renderer(DCGM).render(node()).decode()
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n" in text
    assert "\nDCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{" in text
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total" not in text


def test_label_values_are_escaped() -> None:
    odd = gpu(0, name='Weird "GPU"\\ \nname')
    samples = parse(Renderer().render(node(odd)))
    info = [lbl for lbl, _ in samples["gpu_info"]]
    assert info[0]["model"] == 'Weird "GPU"\\ \nname'
    assert escape_label_value('a"b') == 'a\\"b'


def test_exposition_is_cached_per_snapshot() -> None:
    renderer = Renderer()
    first = node()
    body = renderer.exposition(first)
    assert renderer.exposition(first) is body
    # An equal copy renders the same bytes; the cache keys on identity, never compares values.
    assert renderer.exposition(replace(first)) == body
    second = replace(first, devices=(gpu(0, power_watts=100.0),))
    assert renderer.exposition(second) != body


def test_a_scrape_of_an_older_snapshot_gets_the_newer_bytes_already_rendered() -> None:
    """A scrape that took the latest snapshot just before the next one was published and
    rendered must not render the older one again (and push the newer one out)."""
    renderer = Renderer()
    older = node()
    newer = replace(older, collected_at=older.collected_at + 1, devices=(gpu(0, power_watts=1.0),))
    body = renderer.exposition(newer)
    assert renderer.peek(older) is body
    assert renderer.exposition(older) is body
    assert renderer.exposition(newer) is body  # still cached: nothing was rendered in between


def test_verdict_is_rendered_beside_the_snapshot_and_cached_per_generation() -> None:
    renderer = Renderer()
    snapshot = node(gpu(0))
    uuid = snapshot.devices[0].uuid
    without = renderer.exposition(snapshot)
    assert b"gpu_health_state" not in without  # no health checking: no health series

    def verdict(state: State, action: Action, generation: int) -> NodeHealth:
        reasons = () if state is State.HEALTHY else (Reason("xid_79", state, action, "", 1, 1),)
        return NodeHealth((DeviceHealth(uuid, 0, state, action, 1.0, reasons),), generation, 1.0)

    healthy = verdict(State.HEALTHY, Action.NONE, 1)
    body = renderer.exposition(snapshot, healthy)
    assert renderer.exposition(snapshot, healthy) is body
    assert renderer.exposition(snapshot, verdict(State.HEALTHY, Action.NONE, 1)) is body
    samples = parse(body)
    assert value(samples, "gpu_health_state", uuid=uuid, state="healthy") == 1
    sick = renderer.exposition(snapshot, verdict(State.UNHEALTHY, Action.REBOOT_NODE, 2))
    samples = parse(sick)
    assert value(samples, "gpu_health_state", uuid=uuid, state="unhealthy") == 1
    assert (
        value(samples, "gpu_health_reason", uuid=uuid, reason="xid_79", action="reboot_node") == 1
    )
    assert value(samples, "gpu_health_since_timestamp_seconds", uuid=uuid) == 1.0
    again = parse(renderer.exposition(snapshot))
    # the verdict came, changed and went: three changes of what the fleet history reads
    assert value(again, "gpu_history_changes_total", uuid=uuid) == 3
    before = parse(without)
    assert value(before, "gpu_history_changes_total", uuid=uuid) == 0
    del again["gpu_history_changes_total"], before["gpu_history_changes_total"]
    assert again == before


def test_custom_collector_matches_text_rendering() -> None:
    g0 = gpu(0)
    snapshot = node(g0, pods={g0.uuid: (PodRef("ml", "a", "main"),)})
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: snapshot, RenderOptions(pod_labels=True)))
    via_client = parse(generate_latest(registry))
    via_renderer = parse(Renderer(RenderOptions(pod_labels=True)).render(snapshot))
    assert via_client == via_renderer


def test_build_info_names_the_installed_version() -> None:
    from importlib.metadata import version

    samples = parse(Renderer().render(node()))
    assert value(samples, "gpuquota_exporter_build_info", version=version("gpuquota")) == 1


def test_unknown_compat_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="foo"):
        Renderer(RenderOptions(compat=frozenset({"foo"})))


# --- promtool ----------------------------------------------------------------------------------


def _full_snapshot():
    parent = gpu(0, mig_mode_enabled=True)
    g1 = gpu(1)
    return node(
        parent,
        mig(parent, 0, 7),
        g1,
        DeviceSnapshot(index=2, uuid="GPU-lost", state=DeviceState.LOST),
        pods={g1.uuid: (PodRef("ml", "a", "main"), PodRef("ml", "b", "main"))},
        xid_counts={g1.uuid: {79: 1, 48: 2}},
        xid_last={g1.uuid: 79},
        nvml_errors_total={"nvmlDeviceGetPowerUsage": 2},
    )


@pytest.mark.parametrize("pod_labels", [False, True])
def test_promtool_accepts_native_exposition(promtool: str, pod_labels: bool) -> None:
    text = Renderer(RenderOptions(pod_labels=pod_labels)).render(_full_snapshot())
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, check=False
    )
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()


def test_promtool_only_objects_to_dcgm_exporters_own_names(promtool: str) -> None:
    text = Renderer(RenderOptions(compat=frozenset({"dcgm"}), pod_labels=True)).render(
        _full_snapshot()
    )
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, check=False
    )
    findings = (result.stdout + result.stderr).decode().splitlines()
    allowed = (
        'counter metrics should have "_total" suffix',
        "label names should be written in 'snake_case' not 'camelCase'",
        "metric name should not include type 'counter'",
    )
    assert findings, "expected dcgm-exporter's own lint findings"
    for line in findings:
        assert line.startswith("DCGM_FI_") and line.endswith(allowed), line


def test_device_plugin_registration_per_resource() -> None:
    off = parse(Renderer().render(node(gpu(0))))
    assert "gpuquota_exporter_device_plugin_registered" not in off
    registered = {"nvidia.com/gpu": True, "nvidia.com/mig-1g.5gb": False}
    samples = parse(
        Renderer().render(node(gpu(0)), publishers=PublisherStatus(device_plugin=registered))
    )
    name = "gpuquota_exporter_device_plugin_registered"
    assert value(samples, name, resource="nvidia.com/gpu") == 1.0
    assert value(samples, name, resource="nvidia.com/mig-1g.5gb") == 0.0


def test_every_native_gpu_series_names_the_agents_node() -> None:
    """Issue 38: where a GPU is comes from the agent, not a scrape relabel (the fleet history
    keys a board's place by it); dcgm rows say Hostname, the agent's own rows nothing."""
    parent = gpu(0, mig_mode_enabled=True)
    snapshot = node(
        parent, mig(parent, 0, 7, "3g.40gb"), gpu(1),
        pods={parent.uuid: (PodRef("ml", "a", "c"),)}, hostname="host-7",
    )  # fmt: skip
    options = RenderOptions(compat=frozenset({"dcgm"}), pod_labels=True, node="gpu-node-7")
    publishers = PublisherStatus(device_plugin={"nvidia.com/gpu": True})
    samples = parse(Renderer(options).render(snapshot, publishers=publishers))
    native = {spec.name for spec in METRICS if metrics.carries_node(spec)}
    seen = set()
    for name, series in samples.items():
        for labels, _ in series:
            if name in native:
                seen.add(name)
                assert labels.get("node") == "gpu-node-7", (name, labels)
            else:
                assert "node" not in labels, (name, labels)
    assert {"gpu_info", "gpu_power_watts", "gpu_pod_info"} <= seen
    assert any(name.startswith("DCGM_") for name in samples)
    assert any(name.startswith("gpuquota_exporter_") for name in samples)
    # without a node name (a renderer of tests, bench): no node label at all
    assert b'node="' not in Renderer().render(snapshot)
