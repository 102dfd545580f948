"""The one table of every metric the exporter emits.

Each row names a metric, its Prometheus type and base unit, its help text, the labels it adds
to the device labels, the NVML function its value comes from and how to read that value from
a snapshot (the ``gpu_health_*`` rows: from the health verdict the renderer gets beside the
snapshot). The renderer (exporter/expose/render.py) and docs/metrics.md (exporter/expose/metrics_doc.py)
are both generated from this table, so a metric exists exactly when it has a row here.

Each row also says which snapshot fields it shows (``fields``); how often those are read
from NVML (``tier``: every collection, every slow interval, once per device) is the
collector's own table (exporter/collect/tiers.py), which docs/metrics.md shows per row.

Rows with ``compat="dcgm"`` reproduce dcgm-exporter's default counters (names, units, labels)
and are emitted only with ``--compat dcgm``. A reader returns no sample when the snapshot
field is ``None`` (NVML said NOT_SUPPORTED, or the read failed): the series is left out,
never reported as 0.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from operator import attrgetter

from gpuquota.exporter.collect.tiers import Tier, tier_of
from gpuquota.exporter.health.publishing import ApiWriterStatus, PublisherStatus
from gpuquota.exporter.health.verdict import DeviceHealth, State
from gpuquota.exporter.snapshot import (
    CLOCK_EVENT_REASONS,
    DeviceSnapshot,
    DeviceState,
    NodeSnapshot,
)

PREFIX = "gpu_"
SELF_PREFIX = "gpuquota_exporter_"

# The extra label values of one series (in the row's ``labels`` order) and its value.
Sample = tuple[tuple[str, ...], float]
DeviceReader = Callable[[DeviceSnapshot, NodeSnapshot], Iterable[Sample]]
NodeReader = Callable[[NodeSnapshot], Iterable[Sample]]
# Per-device rows read from the health verdict (exporter/health/verdict.py), which the
# renderer gets beside the snapshot; a device without a verdict has no series.
VerdictReader = Callable[[DeviceHealth], Iterable[Sample]]
# The history change counter's row (exporter/expose/history.py): the count the renderer
# made for the device from the rendering's history rows.
ChangesReader = Callable[[DeviceSnapshot, int], Iterable[Sample]]
# Node rows read from the verdict's publishers' own state (exporter/health/publishing.py),
# which the renderer also gets beside the snapshot; None (not given) has no series.
PublisherReader = Callable[[PublisherStatus], Iterable[Sample]]


class Scope(Enum):
    """Which label set a row's series carry."""

    DEVICE = "device"  # per GPU / MIG device; with --pod-labels one series per pod holding it
    IDENTITY = "identity"  # per device, never multiplied by pods (info and join metrics)
    NODE = "node"  # about the node or the exporter itself: no device labels


# Labels every per-device series carries; MIG instances add MIG_LABELS.
DEVICE_LABELS = ("gpu", "uuid")
# The label every native gpu_* series carries (carries_node): the agent's node name
# (--node-name / $NODE_NAME, else the host name). Where a GPU is must not depend on a scrape
# relabel: without one the target is the agent pod's IP:port, new at every restart, and the
# fleet history (quota/fleet/source.py) would record every board as moved. dcgm rows say
# Hostname instead, as dcgm-exporter does; the agent's own gpuquota_exporter_* series are
# about the agent (its scrape target).
NODE_LABEL = "node"
MIG_LABELS = ("gpu_instance_id", "mig_profile")
POD_LABELS = ("namespace", "pod", "container")


def carries_node(spec: MetricSpec) -> bool:
    """Whether a row's series carry NODE_LABEL: every native gpu_* row."""
    return spec.compat is None and spec.name.startswith(PREFIX)


# dcgm-exporter's label set for its own rows (the MIG and pod labels only where they apply).
DCGM_LABELS = (
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "Hostname",
    "DCGM_FI_DRIVER_VERSION",
)
DCGM_MIG_LABELS = ("GPU_I_PROFILE", "GPU_I_ID")


NVLINK_ERROR_TYPES: tuple[tuple[str, str], ...] = (
    ("replay", "replay_errors"),
    ("recovery", "recovery_errors"),
    ("crc_flit", "crc_flit_errors"),
    ("crc_data", "crc_data_errors"),
)


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One row of the table."""

    name: str  # exposed name; counters end in _total (dcgm compat rows keep dcgm's names)
    type: str  # "gauge" or "counter"
    unit: str  # base unit, for the docs ("" when dimensionless)
    help: str
    labels: tuple[str, ...]  # labels this row adds to its scope's labels
    source: str  # NVML function (or other origin) the value comes from
    accessor: str  # where the value lives in the snapshot
    scope: Scope = Scope.DEVICE
    read_device: DeviceReader | None = None
    read_node: NodeReader | None = None
    read_verdict: VerdictReader | None = None
    read_publishers: PublisherReader | None = None
    read_changes: ChangesReader | None = None
    compat: str | None = None  # "dcgm": only emitted with --compat dcgm
    # read by the fleet history (quota/fleet/source.py): a change of any of its series is a
    # change that gpu_history_changes_total counts (exporter/expose/history.py)
    history: bool = False
    fields: tuple[str, ...] = ()  # the DeviceSnapshot fields it shows (NVML readings)
    tier: Tier = field(init=False)  # how often they are read: the collector's table says

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "tier", tier_of(self.fields))
        except KeyError as missing:
            raise ValueError(f"{self.name}: the collector reads no field {missing}") from None
        if self.type not in ("gauge", "counter"):
            raise ValueError(f"{self.name}: type must be gauge or counter, not {self.type}")
        needs_node = self.scope is Scope.NODE
        per_node = (self.read_node is not None) + (self.read_publishers is not None)
        per_device = (
            (self.read_device is not None)
            + (self.read_verdict is not None)
            + (self.read_changes is not None)
        )
        if per_node != (1 if needs_node else 0) or per_device != (0 if needs_node else 1):
            raise ValueError(
                f"{self.name}: give read_node or read_publishers for NODE rows, read_device "
                "read_verdict or read_changes otherwise"
            )
        if self.compat is None and self.type == "counter" and not self.name.endswith("_total"):
            raise ValueError(f"{self.name}: counter names end in _total")


def _scalar(attr: str, scale: float = 1.0) -> DeviceReader:
    get = attrgetter(attr)

    def read(device: DeviceSnapshot, _node: NodeSnapshot) -> Iterator[Sample]:
        value = get(device)
        if value is not None:
            yield (), float(value) * scale

    return read


def device_row(
    name: str,
    type_: str,
    unit: str,
    help_: str,
    source: str,
    attr: str,
    *,
    scale: float = 1.0,
    compat: str | None = None,
    history: bool = False,
) -> MetricSpec:
    """A row with one series per device, read from one DeviceSnapshot field."""
    shown = attr if scale == 1.0 else f"{attr} * {scale:g}"
    return MetricSpec(
        name=name,
        type=type_,
        unit=unit,
        help=help_,
        labels=(),
        source=source,
        accessor=f"DeviceSnapshot.{shown}",
        read_device=_scalar(attr, scale),
        compat=compat,
        fields=(attr,),
        history=history,
    )


def _label(value: object) -> str:
    return "" if value is None else str(value)


def _read_info(device: DeviceSnapshot, node: NodeSnapshot) -> Iterator[Sample]:
    if device.mig is not None:
        return
    # one answer for every GPU: a GPU that cannot do MIG (L4: NVML_ERROR_NOT_SUPPORTED) is
    # "false" like an H100 with MIG disabled, not an empty string
    mig_mode = "true" if device.mig_mode_enabled else "false"
    yield (
        (
            _label(device.name),
            _label(device.serial),
            _label(device.pci_bus_id),
            _label(device.vbios_version),
            _label(node.driver_version),
            _label(device.compute_capability),
            mig_mode,
        ),
        1.0,
    )


def _read_mig_info(device: DeviceSnapshot, _node: NodeSnapshot) -> Iterator[Sample]:
    if device.mig is None:
        return
    mig = device.mig
    # the profile is the mig_profile label every per-MIG series carries (MIG_LABELS)
    yield (mig.parent_uuid, str(mig.compute_instance_id)), 1.0


def _read_state(device: DeviceSnapshot, _node: NodeSnapshot) -> Iterator[Sample]:
    for state in DeviceState:
        yield (state.value,), 1.0 if device.state is state else 0.0


def _read_pods(device: DeviceSnapshot, node: NodeSnapshot) -> Iterator[Sample]:
    for ref in node.pods.get(device.uuid, ()):
        yield (ref.namespace, ref.pod, ref.container), 1.0


def _read_claims(device: DeviceSnapshot, node: NodeSnapshot) -> Iterator[Sample]:
    for c in node.claims.get(device.uuid, ()):
        yield (c.claim_namespace, c.claim, c.namespace, c.pod, c.container, c.driver, c.pool,
               c.device), 1.0  # fmt: skip


def _read_dra_problems(node: NodeSnapshot) -> Iterator[Sample]:
    if node.dra is not None:
        for reason, count in sorted(node.dra.problems_total.items()):
            yield (reason,), float(count)


def _read_clock_events(device: DeviceSnapshot, _node: NodeSnapshot) -> Iterator[Sample]:
    mask = device.clock_event_reasons
    if mask is None:
        return
    for reason, bit in CLOCK_EVENT_REASONS:
        yield (reason,), 1.0 if mask & bit else 0.0


def _read_clock_event_time(device: DeviceSnapshot, _node: NodeSnapshot) -> Iterator[Sample]:
    for reason, ns in device.clock_event_time_ns:
        yield (reason,), ns * 1e-9


def _read_nvml_calls(index: int) -> NodeReader:
    def read(node: NodeSnapshot) -> Iterator[Sample]:
        for function, stats in sorted(node.nvml_calls.items()):
            yield (function,), float(stats[index])

    return read


def _read_ages(device: DeviceSnapshot, node: NodeSnapshot) -> Iterator[Sample]:
    # relative to the collection, so that a snapshot renders the same at every scrape; a GPU
    # whose reads stall keeps its old read times while collections go on
    for tier, at in device.read_at:
        yield (tier,), max(0.0, node.collected_at - at)


def _pair(first: str, second: str, values: tuple[str, str]) -> DeviceReader:
    """Two fields of one device as one metric with a label telling them apart."""
    get_first, get_second = attrgetter(first), attrgetter(second)

    def read(device: DeviceSnapshot, _node: NodeSnapshot) -> Iterator[Sample]:
        for label, get in zip(values, (get_first, get_second), strict=True):
            value = get(device)
            if value is not None:
                yield (label,), float(value)

    return read


def _read_nvlink(device: DeviceSnapshot, _node: NodeSnapshot) -> Iterator[Sample]:
    for counters in device.nvlinks:
        link = str(counters.link)
        for kind, attr in NVLINK_ERROR_TYPES:
            value = getattr(counters, attr)
            if value is not None:
                yield (link, kind), float(value)


def _read_health_state(verdict: DeviceHealth) -> Iterator[Sample]:
    for state in State:
        yield (state.label,), 1.0 if verdict.state is state else 0.0


def _read_health_reasons(verdict: DeviceHealth) -> Iterator[Sample]:
    for reason in verdict.reasons:
        yield (reason.code, reason.action.label), 1.0


def _read_health_since(verdict: DeviceHealth) -> Iterator[Sample]:
    yield (), verdict.since


def _read_changes(device: DeviceSnapshot, count: int) -> Iterator[Sample]:
    # one per physical GPU, like gpu_info (the fleet history reads whole GPUs)
    if device.mig is None:
        yield (), float(count)


def _read_processes(device: DeviceSnapshot, _node: NodeSnapshot) -> Iterator[Sample]:
    for proc in device.processes:
        if proc.used_memory_bytes is not None:
            yield (str(proc.pid), proc.kind), float(proc.used_memory_bytes)


def _read_xids(device: DeviceSnapshot, node: NodeSnapshot) -> Iterator[Sample]:
    for xid, count in sorted(node.xid_counts.get(device.uuid, {}).items()):
        yield (str(xid),), float(count)


def _read_last_xid(device: DeviceSnapshot, node: NodeSnapshot) -> Iterator[Sample]:
    # dcgm-exporter reports 0 until the first XID on a GPU; MIG instances have none.
    if device.mig is None and device.state is not DeviceState.ERROR:
        yield (), float(node.xid_last.get(device.uuid, 0))


def _gpm(attr: str) -> DeviceReader:
    def read(device: DeviceSnapshot, _node: NodeSnapshot) -> Iterator[Sample]:
        value = None if device.gpm is None else getattr(device.gpm, attr)
        if value is not None:
            yield (), float(value)

    return read


def gpm_row(
    name: str, unit: str, help_: str, attr: str, *, type_: str = "gauge", compat: str | None = None
) -> MetricSpec:
    """A row read from DeviceSnapshot.gpm (GPM: Hopper and later, GPUs and MIG instances)."""
    return MetricSpec(
        name=name,
        type=type_,
        unit=unit,
        help=help_,
        labels=(),
        source="nvmlGpmSampleGet / nvmlGpmMigSampleGet + nvmlGpmMetricsGet",
        accessor=f"DeviceSnapshot.gpm.{attr}",
        read_device=_gpm(attr),
        compat=compat,
        fields=("gpm",),
    )


# gpu_pipe_active_ratio's pipe label -> GpmMetrics field
GPM_PIPES: tuple[tuple[str, str], ...] = (
    ("tensor", "tensor_active"),
    ("tensor_hmma", "tensor_hmma_active"),
    ("tensor_imma", "tensor_imma_active"),
    ("tensor_dfma", "tensor_dfma_active"),
    ("tensor_dmma", "tensor_dmma_active"),
    ("fp64", "fp64_active"),
    ("fp32", "fp32_active"),
    ("fp16", "fp16_active"),
    ("integer", "integer_active"),
)


def _read_pipes(device: DeviceSnapshot, _node: NodeSnapshot) -> Iterator[Sample]:
    if device.gpm is None:
        return
    for pipe, attr in GPM_PIPES:
        value = getattr(device.gpm, attr)
        if value is not None:
            yield (pipe,), float(value)


def _gpm_pair(tx: str, rx: str) -> DeviceReader:
    def read(device: DeviceSnapshot, _node: NodeSnapshot) -> Iterator[Sample]:
        if device.gpm is None:
            return
        for direction, attr in (("tx", tx), ("rx", rx)):
            value = getattr(device.gpm, attr)
            if value is not None:
                yield (direction,), float(value)

    return read


def _read_process_util(attr: str) -> DeviceReader:
    def read(device: DeviceSnapshot, _node: NodeSnapshot) -> Iterator[Sample]:
        for proc in device.process_utilization or ():
            yield (str(proc.pid),), float(getattr(proc, attr))

    return read


def _read_pod_usage(attr: str) -> DeviceReader:
    def read(device: DeviceSnapshot, node: NodeSnapshot) -> Iterator[Sample]:
        for use in node.pod_usage.get(device.uuid, ()):
            value = getattr(use, attr)
            if value is not None:
                yield (use.namespace, use.pod, use.container, use.owner, use.pod_uid), float(value)

    return read


POD_USAGE_LABELS = (*POD_LABELS, "owner", "pod_uid")
# no API server read: the node names its pods (exporter/enrich/poddirectory.py)
_POD_USAGE_SOURCE = "{} + /proc/<pid>/cgroup + pod-resources List + kubelet_internal_checkpoint"


def _read_holder_used(kind: str) -> DeviceReader:
    def read(device: DeviceSnapshot, node: NodeSnapshot) -> Iterator[Sample]:
        for t in node.usage_totals.get(device.uuid, ()):
            if t.kind == kind and t.activity:
                yield (t.namespace, t.name, t.uid, t.activity), t.used_seconds

    return read


def _read_holder_energy(kind: str) -> DeviceReader:
    def read(device: DeviceSnapshot, node: NodeSnapshot) -> Iterator[Sample]:
        for t in node.usage_totals.get(device.uuid, ()):
            if t.kind == kind:
                yield (t.namespace, t.name, t.uid), t.energy_joules

    return read


def _read_unallocated_energy(device: DeviceSnapshot, node: NodeSnapshot) -> Iterator[Sample]:
    joules = node.unallocated_energy.get(device.uuid)
    if joules is not None and device.mig is None:
        yield (), joules


_USAGE_SOURCE = "exporter/enrich/ledger.py: GPM SM activity, utilisation or per-process SM"
_ENERGY_SOURCE = (
    "exporter/enrich/ledger.py: the increase of gpu_energy_joules_total (field value "
    "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION), split by power x time"
)
_ACTIVITY_HELP = (
    "activity, how the latest round measured it (one counter however measured: a label "
    "change is the same counter): sm_active (GPM SM activity: the whole GPU held by one "
    "holder, or a MIG "
    "instance's own GPM), utilization (NVML utilisation ratio, no GPM), process_sm "
    "(per-process SM utilisation: a GPU held by several, time-slicing or MPS). A MIG "
    "instance counts its activity x N/7 (1g at 100 % for 1 h: 3600/7). Starts at 0 when the "
    "agent first sees the holder (published once its UID is known) and resets when the agent "
    "restarts; needs pod attribution and --pod-usage (exporter/enrich/ledger.py)."
)


def _node_value(get: Callable[[NodeSnapshot], float | None]) -> NodeReader:
    def read(node: NodeSnapshot) -> Iterator[Sample]:
        value = get(node)
        if value is not None:
            yield (), float(value)

    return read


def _read_nvml_errors(node: NodeSnapshot) -> Iterator[Sample]:
    for function, count in sorted(node.nvml_errors_total.items()):
        yield (function,), float(count)


def _read_device_counts(node: NodeSnapshot) -> Iterator[Sample]:
    migs = sum(1 for d in node.devices if d.mig is not None)
    yield ("gpu",), float(len(node.devices) - migs)
    yield ("mig",), float(migs)


def _read_driver(node: NodeSnapshot) -> Iterator[Sample]:
    cuda = node.cuda_driver_version
    cuda_text = "" if cuda is None else f"{cuda // 1000}.{cuda % 1000 // 10}"
    yield (_label(node.driver_version), _label(node.nvml_version), cuda_text), 1.0


def _version() -> str:
    try:
        return importlib.metadata.version("gpuquota")
    except importlib.metadata.PackageNotFoundError:  # running from a source tree
        return "unknown"


VERSION = _version()


def _read_device_plugin(status: PublisherStatus) -> Iterator[Sample]:
    for resource, registered in sorted((status.device_plugin or {}).items()):
        yield (resource,), float(registered)


def _publisher_value(get: Callable[[PublisherStatus], float | None]) -> PublisherReader:
    def read(status: PublisherStatus) -> Iterator[Sample]:
        value = get(status)
        if value is not None:
            yield (), float(value)

    return read


def _api_writer_reader(get: Callable[[ApiWriterStatus], float | None]) -> PublisherReader:
    def read(status: PublisherStatus) -> Iterator[Sample]:
        for writer, writes in sorted(status.api_writers.items()):
            value = get(writes)
            if value is not None:
                yield (writer,), float(value)

    return read


def _read_build(_node: NodeSnapshot) -> Iterator[Sample]:
    yield (VERSION,), 1.0


def _lost(node: NodeSnapshot) -> float:
    return float(sum(1 for d in node.devices if d.state is DeviceState.LOST))


P = PREFIX
S = SELF_PREFIX
MIB = 1.0 / (1024 * 1024)

METRICS: list[MetricSpec] = [
    # --- identity -------------------------------------------------------------------------
    MetricSpec(
        name=f"{P}info",
        type="gauge",
        unit="",
        help="Identity of each physical GPU; always 1. Join on uuid for model, PCI bus id, "
        "driver and VBIOS version, compute capability and MIG mode (mig_mode: true or false; "
        "false also on GPUs without MIG, such as the L4).",
        labels=(
            "model",
            "serial",
            "pci_bus_id",
            "vbios_version",
            "driver_version",
            "compute_capability",
            "mig_mode",
        ),
        source="nvmlDeviceGetName, nvmlDeviceGetSerial, nvmlDeviceGetPciInfo_v3, "
        "nvmlDeviceGetVbiosVersion, nvmlSystemGetDriverVersion, "
        "nvmlDeviceGetCudaComputeCapability, nvmlDeviceGetMigMode",
        accessor="DeviceSnapshot.name/serial/pci_bus_id/vbios_version/compute_capability/"
        "mig_mode_enabled, NodeSnapshot.driver_version",
        scope=Scope.IDENTITY,
        read_device=_read_info,
        fields=(
            "name",
            "serial",
            "pci_bus_id",
            "vbios_version",
            "compute_capability",
            "mig_mode_enabled",
        ),
        history=True,
    ),
    MetricSpec(
        name=f"{P}mig_info",
        type="gauge",
        unit="",
        help="Identity of each MIG instance; always 1. uuid is the MIG device's own UUID; "
        "its profile is the mig_profile label, as on every per-MIG series.",
        labels=("parent_uuid", "compute_instance_id"),
        source="nvmlDeviceGetMigDeviceHandleByIndex, nvmlDeviceGetGpuInstanceId, "
        "nvmlDeviceGetComputeInstanceId, nvmlDeviceGetAttributes_v2",
        accessor="DeviceSnapshot.mig",
        scope=Scope.IDENTITY,
        read_device=_read_mig_info,
        fields=("mig",),
    ),
    MetricSpec(
        name=f"{P}device_state",
        type="gauge",
        unit="",
        help="1 for the device's state in the last collection (ok, lost: "
        "NVML_ERROR_GPU_IS_LOST, reset_required, error), 0 for the others.",
        labels=("state",),
        source="NVML return codes",
        accessor="DeviceSnapshot.state",
        scope=Scope.IDENTITY,
        read_device=_read_state,
        history=True,
    ),
    MetricSpec(
        name=f"{P}pod_info",
        type="gauge",
        unit="",
        help="1 for each pod container holding the device (kubelet pod-resources API); "
        "several on time-sliced GPUs. Join on uuid to attribute any gpu_* series.",
        labels=POD_LABELS,
        source="kubelet pod-resources v1 List",
        accessor="NodeSnapshot.pods[uuid]",
        scope=Scope.IDENTITY,
        read_device=_read_pods,
    ),
    MetricSpec(
        name=f"{P}dra_claim_info",
        type="gauge",
        unit="",
        help="1 for each pod container holding the device through a DRA ResourceClaim "
        "(the device is then also in gpu_pod_info); a claim shared by several pods has one "
        "series per pod. driver/pool/device name the device in its ResourceSlice.",
        labels=("claim_namespace", "claim", *POD_LABELS, "driver", "pool", "device"),
        source="kubelet pod-resources v1 List (dynamic_resources) + ResourceSlices",
        accessor="NodeSnapshot.claims[uuid]",
        scope=Scope.IDENTITY,
        read_device=_read_claims,
    ),
    # --- utilisation ----------------------------------------------------------------------
    device_row(
        f"{P}utilization_ratio",
        "gauge",
        "ratio",
        "Fraction of the last sample period in which a kernel ran on the GPU (0-1).",
        "nvmlDeviceGetUtilizationRates",
        "gpu_utilization_ratio",
    ),
    device_row(
        f"{P}memory_utilization_ratio",
        "gauge",
        "ratio",
        "Fraction of the last sample period in which device memory was read or written (0-1).",
        "nvmlDeviceGetUtilizationRates",
        "memory_utilization_ratio",
    ),
    device_row(
        f"{P}encoder_utilization_ratio",
        "gauge",
        "ratio",
        "Video encoder utilisation (0-1).",
        "nvmlDeviceGetEncoderUtilization",
        "encoder_utilization_ratio",
    ),
    device_row(
        f"{P}decoder_utilization_ratio",
        "gauge",
        "ratio",
        "Video decoder utilisation (0-1).",
        "nvmlDeviceGetDecoderUtilization",
        "decoder_utilization_ratio",
    ),
    # --- framebuffer memory ---------------------------------------------------------------
    device_row(
        f"{P}memory_total_bytes",
        "gauge",
        "bytes",
        "Framebuffer memory installed (for MIG: the instance's share).",
        "nvmlDeviceGetMemoryInfo_v2",
        "memory_total_bytes",
    ),
    device_row(
        f"{P}memory_used_bytes",
        "gauge",
        "bytes",
        "Framebuffer memory allocated.",
        "nvmlDeviceGetMemoryInfo_v2",
        "memory_used_bytes",
    ),
    device_row(
        f"{P}memory_free_bytes",
        "gauge",
        "bytes",
        "Framebuffer memory free.",
        "nvmlDeviceGetMemoryInfo_v2",
        "memory_free_bytes",
    ),
    device_row(
        f"{P}memory_reserved_bytes",
        "gauge",
        "bytes",
        "Framebuffer memory reserved by the driver and firmware.",
        "nvmlDeviceGetMemoryInfo_v2",
        "memory_reserved_bytes",
    ),
    # --- thermals and power ---------------------------------------------------------------
    device_row(
        f"{P}temperature_celsius",
        "gauge",
        "celsius",
        "GPU die temperature.",
        "nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)",
        "gpu_temperature_celsius",
    ),
    device_row(
        f"{P}memory_temperature_celsius",
        "gauge",
        "celsius",
        "HBM memory temperature.",
        "nvmlDeviceGetFieldValues(NVML_FI_DEV_MEMORY_TEMP)",
        "memory_temperature_celsius",
    ),
    device_row(
        f"{P}power_watts",
        "gauge",
        "watts",
        "Power draw of the board.",
        "nvmlDeviceGetPowerUsage",
        "power_watts",
    ),
    device_row(
        f"{P}power_limit_watts",
        "gauge",
        "watts",
        "Enforced power limit.",
        "nvmlDeviceGetEnforcedPowerLimit",
        "power_limit_watts",
    ),
    device_row(
        f"{P}energy_joules_total",
        "counter",
        "joules",
        "Energy consumed since the driver was loaded.",
        "nvmlDeviceGetFieldValues(NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION)",
        "energy_joules",
    ),
    device_row(
        f"{P}fan_speed_ratio",
        "gauge",
        "ratio",
        "Fan speed as a fraction of its maximum (0-1); absent on passively cooled boards.",
        "nvmlDeviceGetFanSpeed",
        "fan_speed_ratio",
    ),
    # --- clocks and performance -----------------------------------------------------------
    device_row(
        f"{P}sm_clock_hertz",
        "gauge",
        "hertz",
        "Current SM clock.",
        "nvmlDeviceGetClockInfo(NVML_CLOCK_SM)",
        "sm_clock_hertz",
    ),
    device_row(
        f"{P}memory_clock_hertz",
        "gauge",
        "hertz",
        "Current memory clock.",
        "nvmlDeviceGetClockInfo(NVML_CLOCK_MEM)",
        "memory_clock_hertz",
    ),
    device_row(
        f"{P}performance_state",
        "gauge",
        "",
        "Performance state: 0 (P0, maximum performance) to 15 (P15, minimum).",
        "nvmlDeviceGetPerformanceState",
        "performance_state",
    ),
    MetricSpec(
        name=f"{P}clock_event_reason",
        type="gauge",
        unit="",
        help="1 while the reason is holding clocks down (throttling), 0 otherwise; one series "
        "per NVML clock event reason.",
        labels=("reason",),
        source="nvmlDeviceGetCurrentClocksEventReasons",
        accessor="DeviceSnapshot.clock_event_reasons (bitmask)",
        read_device=_read_clock_events,
        fields=("clock_event_reasons",),
    ),
    MetricSpec(
        name=f"{P}clock_event_seconds_total",
        type="counter",
        unit="seconds",
        help="Time clocks were held down, per reason (NVML's clock event reason counters: "
        "sw_power_cap, thermal, sync_boost, board_limit, gpu_idle, reliability, "
        "sw_thermal_slowdown, hw_thermal_slowdown, hw_power_brake_slowdown); absent where "
        "the GPU lacks them.",
        labels=("reason",),
        source="nvmlDeviceGetFieldValues(NVML_FI_DEV_PERF_POLICY_* 74-79, "
        "NVML_FI_DEV_CLOCKS_EVENT_REASON_* 269-271), nanoseconds",
        accessor="DeviceSnapshot.clock_event_time_ns * 1e-9",
        read_device=_read_clock_event_time,
        fields=("clock_event_time_ns",),
    ),
    # --- PCIe -----------------------------------------------------------------------------
    device_row(
        f"{P}pcie_tx_bytes_per_second",
        "gauge",
        "bytes/second",
        "PCIe transmit throughput between the last two readings of the byte counter "
        "gpu_pcie_tx_bytes_total (no 20 ms throughput sample).",
        "nvmlDeviceGetFieldValues(NVML_FI_DEV_PCIE_COUNT_TX_BYTES), rate",
        "pcie_tx_bytes_per_second",
    ),
    device_row(
        f"{P}pcie_tx_bytes_total",
        "counter",
        "bytes",
        "PCIe bytes transmitted (NVML's cumulative counter; may wrap, as NVML says).",
        "nvmlDeviceGetFieldValues(NVML_FI_DEV_PCIE_COUNT_TX_BYTES)",
        "pcie_tx_bytes",
    ),
    device_row(
        f"{P}pcie_rx_bytes_per_second",
        "gauge",
        "bytes/second",
        "PCIe receive throughput between the last two readings of the byte counter "
        "gpu_pcie_rx_bytes_total (no 20 ms throughput sample).",
        "nvmlDeviceGetFieldValues(NVML_FI_DEV_PCIE_COUNT_RX_BYTES), rate",
        "pcie_rx_bytes_per_second",
    ),
    device_row(
        f"{P}pcie_rx_bytes_total",
        "counter",
        "bytes",
        "PCIe bytes received (NVML's cumulative counter; may wrap, as NVML says).",
        "nvmlDeviceGetFieldValues(NVML_FI_DEV_PCIE_COUNT_RX_BYTES)",
        "pcie_rx_bytes",
    ),
    device_row(
        f"{P}pcie_replays_total",
        "counter",
        "",
        "PCIe replay (retransmission) events.",
        "nvmlDeviceGetPcieReplayCounter",
        "pcie_replay_total",
    ),
    # --- memory errors --------------------------------------------------------------------
    device_row(
        f"{P}ecc_mode_enabled",
        "gauge",
        "",
        "1 when ECC is enabled; absent on boards without ECC.",
        "nvmlDeviceGetEccMode",
        "ecc_mode_enabled",
    ),
    MetricSpec(
        name=f"{P}ecc_volatile_errors_total",
        type="counter",
        unit="",
        help="ECC errors since the driver was loaded, by type (corrected, uncorrected).",
        labels=("type",),
        source="nvmlDeviceGetTotalEccErrors(NVML_VOLATILE_ECC)",
        accessor="DeviceSnapshot.ecc_corrected_volatile / ecc_uncorrected_volatile",
        read_device=_pair(
            "ecc_corrected_volatile", "ecc_uncorrected_volatile", ("corrected", "uncorrected")
        ),
        fields=("ecc_corrected_volatile", "ecc_uncorrected_volatile"),
    ),
    MetricSpec(
        name=f"{P}ecc_aggregate_errors_total",
        type="counter",
        unit="",
        help="ECC errors over the board's lifetime (persisted in the InfoROM), by type.",
        labels=("type",),
        source="nvmlDeviceGetTotalEccErrors(NVML_AGGREGATE_ECC)",
        accessor="DeviceSnapshot.ecc_corrected_aggregate / ecc_uncorrected_aggregate",
        read_device=_pair(
            "ecc_corrected_aggregate", "ecc_uncorrected_aggregate", ("corrected", "uncorrected")
        ),
        fields=("ecc_corrected_aggregate", "ecc_uncorrected_aggregate"),
        history=True,
    ),
    MetricSpec(
        name=f"{P}remapped_rows_total",
        type="counter",
        unit="",
        help="Memory rows remapped, by the kind of error that caused it.",
        labels=("cause",),
        source="nvmlDeviceGetRemappedRows",
        accessor="DeviceSnapshot.remapped_rows_correctable / remapped_rows_uncorrectable",
        read_device=_pair(
            "remapped_rows_correctable",
            "remapped_rows_uncorrectable",
            ("correctable", "uncorrectable"),
        ),
        fields=("remapped_rows_correctable", "remapped_rows_uncorrectable"),
        history=True,
    ),
    device_row(
        f"{P}row_remap_pending",
        "gauge",
        "",
        "1 when a row remap is pending (takes effect at the next GPU reset).",
        "nvmlDeviceGetRemappedRows",
        "remap_pending",
        history=True,
    ),
    device_row(
        f"{P}row_remap_failure",
        "gauge",
        "",
        "1 when a row remap failed (no spare rows left): the GPU needs servicing.",
        "nvmlDeviceGetRemappedRows",
        "remap_failure",
        history=True,
    ),
    MetricSpec(
        name=f"{P}retired_pages_total",
        type="counter",
        unit="",
        help="Memory pages retired (pre-Ampere page retirement), by cause.",
        labels=("cause",),
        source="nvmlDeviceGetRetiredPages",
        accessor="DeviceSnapshot.retired_pages_single_bit / retired_pages_double_bit",
        read_device=_pair(
            "retired_pages_single_bit",
            "retired_pages_double_bit",
            ("single_bit_ecc", "double_bit_ecc"),
        ),
        fields=("retired_pages_single_bit", "retired_pages_double_bit"),
        history=True,
    ),
    device_row(
        f"{P}retired_pages_pending",
        "gauge",
        "",
        "1 when pages are waiting to be retired at the next reboot.",
        "nvmlDeviceGetRetiredPagesPendingStatus",
        "retired_pages_pending",
        history=True,
    ),
    # --- interconnect and driver events ---------------------------------------------------
    MetricSpec(
        name=f"{P}nvlink_errors_total",
        type="counter",
        unit="",
        help="NVLink errors per link, by type (replay, recovery, crc_flit, crc_data).",
        labels=("link", "type"),
        source="nvmlDeviceGetNvLinkErrorCounter (re-read when the per-GPU totals from "
        "nvmlDeviceGetFieldValues change)",
        accessor="DeviceSnapshot.nvlinks",
        read_device=_read_nvlink,
        fields=("nvlinks",),
    ),
    MetricSpec(
        name=f"{P}xid_errors_total",
        type="counter",
        unit="",
        help="XID events reported by the driver since the exporter started, per XID code.",
        labels=("xid",),
        source="nvmlEventSetWait_v2 (nvmlEventTypeXidCriticalError)",
        accessor="NodeSnapshot.xid_counts[uuid]",
        read_device=_read_xids,
        history=True,
    ),
    # --- health (exporter/health/, docs/health.md) ----------------------------------------
    MetricSpec(
        name=f"{P}health_state",
        type="gauge",
        unit="",
        help="1 for the device's health verdict (healthy, degraded, unhealthy; docs/health.md), "
        "0 for the others. Unhealthy devices are withdrawn from the kubelet device plugin.",
        labels=("state",),
        source="health checker: XID events and NVML conditions (docs/health.md)",
        accessor="NodeHealth[uuid].state",
        scope=Scope.IDENTITY,
        read_verdict=_read_health_state,
        history=True,
    ),
    MetricSpec(
        name=f"{P}health_reason",
        type="gauge",
        unit="",
        help="1 for each active reason behind the device's health verdict (xid_79, gpu_lost, "
        "row_remap_pending, ...), with the recommended action (none, restart_app, reset_gpu, "
        "reboot_node).",
        labels=("reason", "action"),
        source="health checker: XID events and NVML conditions (docs/health.md)",
        accessor="NodeHealth[uuid].reasons",
        scope=Scope.IDENTITY,
        read_verdict=_read_health_reasons,
        fields=("recovery_action",),  # the other inputs come with their own rows
        history=True,
    ),
    MetricSpec(
        name=f"{P}health_since_timestamp_seconds",
        type="gauge",
        unit="seconds",
        help="Unix time at which the device entered its current health state.",
        labels=(),
        source="health checker",
        accessor="NodeHealth[uuid].since",
        scope=Scope.IDENTITY,
        read_verdict=_read_health_since,
        history=True,
    ),
    MetricSpec(
        name=f"{P}history_changes_total",
        type="counter",
        unit="",
        help="Changes, since the exporter started, of what the fleet history reads about the "
        "GPU (one series per physical GPU): one more whenever any series of gpu_info, "
        "gpu_device_state, gpu_health_*, gpu_xid_errors_total or the memory error counters "
        "and flags changed value, appeared or went between two consecutive renderings, "
        "rendered with the values it counts. The controller's fleet history reads it once "
        "per GPU for each window it ingests (--ledger-window, an hour by default) to find "
        "the GPUs that changed, and fetches only their samples (docs/accounting.md).",
        labels=(),
        source="exporter: the rendered history series, compared rendering to rendering "
        "(exporter/expose/history.py)",
        accessor="ChangeCounter[uuid]",
        scope=Scope.IDENTITY,
        read_changes=_read_changes,
    ),
    # --- processes ------------------------------------------------------------------------
    MetricSpec(
        name=f"{P}process_memory_used_bytes",
        type="gauge",
        unit="bytes",
        help="Framebuffer memory used by each process running on the device.",
        labels=("pid", "kind"),
        source="nvmlDeviceGetComputeRunningProcesses_v3, nvmlDeviceGetGraphicsRunningProcesses_v3",
        accessor="DeviceSnapshot.processes",
        read_device=_read_processes,
        fields=("processes",),
    ),
    # --- profiling: GPM (Hopper and later; left out on older GPUs) --------------------------
    gpm_row(
        f"{P}graphics_engine_active_ratio",
        "ratio",
        "Fraction of time the graphics/compute engine was busy, averaged over the last "
        "slow interval (GPM, Hopper and later).",
        "graphics_active",
    ),
    gpm_row(
        f"{P}sm_active_ratio",
        "ratio",
        "Fraction of SM cycles with at least one warp resident, averaged over all SMs and "
        "the last slow interval (GPM).",
        "sm_active",
    ),
    gpm_row(
        f"{P}sm_occupancy_ratio",
        "ratio",
        "Resident warps as a fraction of the SMs' maximum, over the last slow interval (GPM).",
        "sm_occupancy",
    ),
    gpm_row(
        f"{P}dram_active_ratio",
        "ratio",
        "DRAM bandwidth used as a fraction of the peak, over the last slow interval (GPM).",
        "dram_active",
    ),
    MetricSpec(
        name=f"{P}pipe_active_ratio",
        type="gauge",
        unit="ratio",
        help="Fraction of SM cycles a pipe was busy over the last slow interval (GPM): "
        "tensor (any precision), tensor_hmma/imma/dfma/dmma, fp64, fp32, fp16, integer.",
        labels=("pipe",),
        source="nvmlGpmSampleGet / nvmlGpmMigSampleGet + nvmlGpmMetricsGet",
        accessor="DeviceSnapshot.gpm.*_active",
        read_device=_read_pipes,
        fields=("gpm",),
    ),
    # PCIe traffic has one native source, the byte counters' rate (gpu_pcie_*_bytes_per_second
    # above): every GPU with the counters has it, at any interval. GPM's PCIe averages serve
    # only DCGM_FI_PROF_PCIE_*, as DCGM serves that field from its profiling counters. NVLink
    # traffic has no counter read here, so GPM is its one source.
    MetricSpec(
        name=f"{P}nvlink_bandwidth_bytes_per_second",
        type="gauge",
        unit="bytes/second",
        help="NVLink traffic over all links (direction tx or rx) averaged over the last slow "
        "interval (GPM).",
        labels=("direction",),
        source="nvmlGpmMetricsGet(NVML_GPM_METRIC_NVLINK_TOTAL_TX/RX_PER_SEC)",
        accessor="DeviceSnapshot.gpm.nvlink_*_bytes_per_second",
        read_device=_gpm_pair("nvlink_tx_bytes_per_second", "nvlink_rx_bytes_per_second"),
        fields=("gpm",),
    ),
    # --- per-process and per-pod utilisation ----------------------------------------------
    MetricSpec(
        name=f"{P}process_sm_utilization_ratio",
        type="gauge",
        unit="ratio",
        help="Fraction of the GPU's SM time used by each process in its latest driver sample "
        "(whole GPUs; NVML has none on MIG). The driver samples once a second: asked at most "
        "once a second per GPU, the last values in between.",
        labels=("pid",),
        source="nvmlDeviceGetProcessUtilization",
        accessor="DeviceSnapshot.process_utilization[].sm_ratio",
        read_device=_read_process_util("sm_ratio"),
        fields=("process_utilization",),
    ),
    MetricSpec(
        name=f"{P}process_memory_utilization_ratio",
        type="gauge",
        unit="ratio",
        help="Fraction of the GPU's memory bandwidth used by each process in its latest driver "
        "sample (asked at most once a second per GPU).",
        labels=("pid",),
        source="nvmlDeviceGetProcessUtilization",
        accessor="DeviceSnapshot.process_utilization[].memory_ratio",
        read_device=_read_process_util("memory_ratio"),
        fields=("process_utilization",),
    ),
    MetricSpec(
        name=f"{P}pod_sm_utilization_ratio",
        type="gauge",
        unit="ratio",
        help="SM utilisation of the device by each pod's processes (owner=pod, pod_uid from "
        "the process's cgroup; namespace, pod and container where the kubelet's pod-resources "
        "answer and device checkpoint name it, else empty: join pod_uid with the controller's "
        "pods), by processes of no pod (owner=host) and by processes /proc does not show "
        "(owner=unknown); needs --pod-usage (host PID namespace).",
        labels=POD_USAGE_LABELS,
        source=_POD_USAGE_SOURCE.format("nvmlDeviceGetProcessUtilization"),
        accessor="NodeSnapshot.pod_usage[uuid].sm_ratio",
        scope=Scope.IDENTITY,
        read_device=_read_pod_usage("sm_ratio"),
        fields=("process_utilization",),
    ),
    MetricSpec(
        name=f"{P}pod_memory_utilization_ratio",
        type="gauge",
        unit="ratio",
        help="Memory bandwidth utilisation of the device by each pod's processes (labels as "
        "gpu_pod_sm_utilization_ratio).",
        labels=POD_USAGE_LABELS,
        source=_POD_USAGE_SOURCE.format("nvmlDeviceGetProcessUtilization"),
        accessor="NodeSnapshot.pod_usage[uuid].memory_ratio",
        scope=Scope.IDENTITY,
        read_device=_read_pod_usage("memory_ratio"),
        fields=("process_utilization",),
    ),
    MetricSpec(
        name=f"{P}pod_memory_used_bytes",
        type="gauge",
        unit="bytes",
        help="Framebuffer memory used on the device by each pod's processes (labels as "
        "gpu_pod_sm_utilization_ratio; MIG instances too).",
        labels=POD_USAGE_LABELS,
        source=_POD_USAGE_SOURCE.format("nvmlDeviceGetComputeRunningProcesses_v3"),
        accessor="NodeSnapshot.pod_usage[uuid].memory_used_bytes",
        scope=Scope.IDENTITY,
        read_device=_read_pod_usage("memory_used_bytes"),
        fields=("processes",),
    ),
    # --- the usage ledger's counters (issue 19) ---------------------------------------------
    MetricSpec(
        name=f"{P}pod_used_seconds_total",
        type="counter",
        unit="seconds",
        help="Physical GPU-seconds of activity of this pod on this device (a pod holding it "
        "through a DRA claim counts in gpu_claim_used_seconds_total instead). " + _ACTIVITY_HELP,
        labels=("namespace", "pod", "pod_uid", "activity"),
        source=_USAGE_SOURCE,
        accessor="NodeSnapshot.usage_totals[uuid].used_seconds (kind pod)",
        scope=Scope.IDENTITY,
        read_device=_read_holder_used("pod"),
        fields=("gpm", "gpu_utilization_ratio", "process_utilization"),
    ),
    MetricSpec(
        name=f"{P}pod_energy_joules_total",
        type="counter",
        unit="joules",
        help="Joules of the physical GPU apportioned to this pod on this device: a shared "
        "GPU's energy split by activity shares each moment (equally when nobody is active), a "
        "MIG GPU's by its instances' physical shares. Needs pod attribution and --pod-usage.",
        labels=("namespace", "pod", "pod_uid"),
        source=_ENERGY_SOURCE,
        accessor="NodeSnapshot.usage_totals[uuid].energy_joules (kind pod)",
        scope=Scope.IDENTITY,
        read_device=_read_holder_energy("pod"),
        fields=("energy_joules",),
    ),
    MetricSpec(
        name=f"{P}claim_used_seconds_total",
        type="counter",
        unit="seconds",
        help="Physical GPU-seconds of activity of this DRA ResourceClaim on this device, "
        "charged once however many pods share the claim. " + _ACTIVITY_HELP,
        labels=("namespace", "claim", "claim_uid", "activity"),
        source=_USAGE_SOURCE,
        accessor="NodeSnapshot.usage_totals[uuid].used_seconds (kind claim)",
        scope=Scope.IDENTITY,
        read_device=_read_holder_used("claim"),
        fields=("gpm", "gpu_utilization_ratio", "process_utilization"),
    ),
    MetricSpec(
        name=f"{P}claim_energy_joules_total",
        type="counter",
        unit="joules",
        help="Joules of the physical GPU apportioned to this DRA ResourceClaim on this device "
        "(rules as gpu_pod_energy_joules_total).",
        labels=("namespace", "claim", "claim_uid"),
        source=_ENERGY_SOURCE,
        accessor="NodeSnapshot.usage_totals[uuid].energy_joules (kind claim)",
        scope=Scope.IDENTITY,
        read_device=_read_holder_energy("claim"),
        fields=("energy_joules",),
    ),
    MetricSpec(
        name=f"{P}unallocated_energy_joules_total",
        type="counter",
        unit="joules",
        help="Joules the physical GPU drew while nobody held it (on a MIG GPU: the share of "
        "its unheld instances and unpartitioned slices); with pod attribution on.",
        labels=(),
        source=_ENERGY_SOURCE,
        accessor="NodeSnapshot.unallocated_energy[uuid]",
        scope=Scope.IDENTITY,
        read_device=_read_unallocated_energy,
        fields=("energy_joules",),
    ),
    # --- the node and the exporter itself -------------------------------------------------
    MetricSpec(
        name=f"{P}driver_info",
        type="gauge",
        unit="",
        help="NVIDIA driver, NVML and CUDA driver API versions on this node; always 1.",
        labels=("driver_version", "nvml_version", "cuda_driver_version"),
        source="nvmlSystemGetDriverVersion, nvmlSystemGetNVMLVersion, "
        "nvmlSystemGetCudaDriverVersion",
        accessor="NodeSnapshot.driver_version / nvml_version / cuda_driver_version",
        scope=Scope.NODE,
        read_node=_read_driver,
    ),
    MetricSpec(
        name=f"{S}build_info",
        type="gauge",
        unit="",
        help="The running gpu-exporter's version; always 1.",
        labels=("version",),
        source="package metadata",
        accessor="-",
        scope=Scope.NODE,
        read_node=_read_build,
    ),
    MetricSpec(
        name=f"{S}nvml_up",
        type="gauge",
        unit="",
        help="1 when NVML answered in the last collection, 0 when it could not be read at all.",
        labels=(),
        source="nvmlDeviceGetCount",
        accessor="NodeSnapshot.ok",
        scope=Scope.NODE,
        read_node=_node_value(lambda n: float(n.ok)),
    ),
    MetricSpec(
        name=f"{S}pod_resources_up",
        type="gauge",
        unit="",
        help="1 when the last kubelet pod-resources List answered, 0 when it failed or the "
        "socket is missing (attribution then keeps its last mapping for a while); absent "
        "when attribution is off.",
        labels=(),
        source="kubelet pod-resources v1 List",
        accessor="NodeSnapshot.pod_attribution.up",
        scope=Scope.NODE,
        read_node=_node_value(
            lambda n: None if n.pod_attribution is None else n.pod_attribution.up
        ),
    ),
    MetricSpec(
        name=f"{S}pod_resources_errors_total",
        type="counter",
        unit="",
        help="Failed kubelet pod-resources List calls (errors, deadlines, a vanished socket).",
        labels=(),
        source="kubelet pod-resources v1 List",
        accessor="NodeSnapshot.pod_attribution.errors_total",
        scope=Scope.NODE,
        read_node=_node_value(
            lambda n: None if n.pod_attribution is None else n.pod_attribution.errors_total
        ),
    ),
    MetricSpec(
        name=f"{S}dra_slices_up",
        type="gauge",
        unit="",
        help="1 while this node's ResourceSlices are listed and watched (DRA attribution), 0 "
        "without access or while the watch fails; absent when DRA attribution is off.",
        labels=(),
        source="resource.k8s.io/v1 ResourceSlices list+watch",
        accessor="NodeSnapshot.dra.slices_up",
        scope=Scope.NODE,
        read_node=_node_value(lambda n: None if n.dra is None else n.dra.slices_up),
    ),
    MetricSpec(
        name=f"{S}dra_devices",
        type="gauge",
        unit="",
        help="GPU and MIG devices this node's ResourceSlices list (newest pool generation).",
        labels=(),
        source="resource.k8s.io/v1 ResourceSlices list+watch",
        accessor="NodeSnapshot.dra.devices",
        scope=Scope.NODE,
        read_node=_node_value(lambda n: None if n.dra is None else n.dra.devices),
    ),
    MetricSpec(
        name=f"{S}dra_problems_total",
        type="counter",
        unit="",
        help="DRA objects that could not be used, by reason: unknown_driver (a claimed device "
        "of a driver not in --dra-drivers), unknown_device (no slice lists it), bad_slice "
        "(a slice device without a uuid attribute). Each is also logged once.",
        labels=("reason",),
        source="kubelet pod-resources v1 List + ResourceSlices",
        accessor="NodeSnapshot.dra.problems_total",
        scope=Scope.NODE,
        read_node=_read_dra_problems,
    ),
    MetricSpec(
        name=f"{S}dra_taint_rules",
        type="gauge",
        unit="",
        help="DeviceTaintRules this exporter keeps on unhealthy DRA devices of its node; "
        "absent without --dra-device-taints.",
        labels=(),
        source="resource.k8s.io DeviceTaintRules",
        accessor="PublisherStatus.dra_taint_rules",
        scope=Scope.NODE,
        read_publishers=_publisher_value(lambda p: p.dra_taint_rules),
    ),
    MetricSpec(
        name=f"{S}dra_taint_errors_total",
        type="counter",
        unit="",
        help="Failed attempts to create, update or delete this node's DeviceTaintRules "
        "(retried with back-off).",
        labels=(),
        source="resource.k8s.io DeviceTaintRules",
        accessor="PublisherStatus.dra_taint_errors_total",
        scope=Scope.NODE,
        read_publishers=_publisher_value(lambda p: p.dra_taint_errors_total),
    ),
    MetricSpec(
        name=f"{S}api_write_consecutive_failures",
        type="gauge",
        unit="",
        help="Failed Kubernetes API writes of this writer since its last success (node-status: "
        "the Node's taint and condition; dra-taints: DeviceTaintRules); 0 while writes "
        "succeed. Retried with jittered back-off up to 30s; absent when the writer is off.",
        labels=("writer",),
        source="Kubernetes API (Node, DeviceTaintRules)",
        accessor="PublisherStatus.api_writers[].consecutive_failures",
        scope=Scope.NODE,
        read_publishers=_api_writer_reader(lambda w: w.consecutive_failures),
    ),
    MetricSpec(
        name=f"{S}api_write_failures_total",
        type="counter",
        unit="",
        help="Failed Kubernetes API writes of this writer since the exporter started "
        "(each is also one log line).",
        labels=("writer",),
        source="Kubernetes API (Node, DeviceTaintRules)",
        accessor="PublisherStatus.api_writers[].failures_total",
        scope=Scope.NODE,
        read_publishers=_api_writer_reader(lambda w: w.failures_total),
    ),
    MetricSpec(
        name=f"{S}api_write_last_success_timestamp_seconds",
        type="gauge",
        unit="seconds",
        help="Unix time of this writer's last successful Kubernetes API write; absent "
        "before the first.",
        labels=("writer",),
        source="Kubernetes API (Node, DeviceTaintRules)",
        accessor="PublisherStatus.api_writers[].last_success",
        scope=Scope.NODE,
        read_publishers=_api_writer_reader(lambda w: w.last_success),
    ),
    MetricSpec(
        name=f"{S}device_plugin_registered",
        type="gauge",
        unit="",
        help="1 while the device plugin of this resource is registered with the kubelet now "
        "running (a restarted kubelet forgets plugins until they register again), else 0; "
        "absent without --device-plugin.",
        labels=("resource",),
        source="kubelet device plugin Register",
        accessor="PublisherStatus.device_plugin",
        scope=Scope.NODE,
        read_publishers=_read_device_plugin,
    ),
    MetricSpec(
        name=f"{S}collection_duration_seconds",
        type="gauge",
        unit="seconds",
        help="How long the last NVML collection took.",
        labels=(),
        source="exporter",
        accessor="NodeSnapshot.collection_seconds",
        scope=Scope.NODE,
        read_node=_node_value(lambda n: n.collection_seconds),
    ),
    MetricSpec(
        name=f"{S}collections_total",
        type="counter",
        unit="",
        help="NVML collections since the exporter started.",
        labels=(),
        source="exporter",
        accessor="NodeSnapshot.collections_total",
        scope=Scope.NODE,
        read_node=_node_value(lambda n: n.collections_total),
    ),
    MetricSpec(
        name=f"{S}start_time_seconds",
        type="gauge",
        unit="seconds",
        help="Unix time this exporter started: its counters (XIDs, usage) count from then. A "
        "new value is a restart, after which they begin again from zero; the same value "
        "after a silence means they went on counting (the fleet history tells the two apart "
        "with it).",
        labels=(),
        source="exporter",
        accessor="NodeSnapshot.started_at",
        scope=Scope.NODE,
        read_node=_node_value(lambda n: n.started_at),
    ),
    MetricSpec(
        name=f"{S}last_success_timestamp_seconds",
        type="gauge",
        unit="seconds",
        help="Unix time of the last collection in which NVML answered.",
        labels=(),
        source="exporter",
        accessor="NodeSnapshot.last_success_at",
        scope=Scope.NODE,
        read_node=_node_value(lambda n: n.last_success_at),
    ),
    MetricSpec(
        name=f"{S}nvml_errors_total",
        type="counter",
        unit="",
        help="NVML calls that failed (NOT_SUPPORTED excluded), by NVML function.",
        labels=("function",),
        source="exporter",
        accessor="NodeSnapshot.nvml_errors_total",
        scope=Scope.NODE,
        read_node=_read_nvml_errors,
    ),
    MetricSpec(
        name=f"{S}nvml_calls_total",
        type="counter",
        unit="",
        help="NVML calls made, by NVML function (failed ones included).",
        labels=("function",),
        source="exporter (exporter/collect/nvml.py times every call)",
        accessor="NodeSnapshot.nvml_calls[function][0]",
        scope=Scope.NODE,
        read_node=_read_nvml_calls(0),
    ),
    MetricSpec(
        name=f"{S}nvml_call_seconds_total",
        type="counter",
        unit="seconds",
        help="Wall time spent in NVML calls, by NVML function; divided by "
        "gpuquota_exporter_nvml_calls_total it is the mean latency per call.",
        labels=("function",),
        source="exporter (exporter/collect/nvml.py times every call)",
        accessor="NodeSnapshot.nvml_calls[function][1]",
        scope=Scope.NODE,
        read_node=_read_nvml_calls(1),
    ),
    MetricSpec(
        name=f"{S}read_age_seconds",
        type="gauge",
        unit="seconds",
        help="Per GPU and tier (fast, slow, once; see the tier of each metric here), how old "
        "its last complete reading was at the last collection. A GPU whose NVML calls hang "
        "keeps its last readings while this grows; the other GPUs are not held up.",
        labels=("tier",),
        source="exporter",
        accessor="NodeSnapshot.collected_at - DeviceSnapshot.read_at[tier]",
        scope=Scope.IDENTITY,
        read_device=_read_ages,
    ),
    MetricSpec(
        name=f"{S}devices",
        type="gauge",
        unit="",
        help="Devices in the last collection, by kind (gpu, mig).",
        labels=("kind",),
        source="exporter",
        accessor="NodeSnapshot.devices",
        scope=Scope.NODE,
        read_node=_read_device_counts,
    ),
    MetricSpec(
        name=f"{S}devices_lost",
        type="gauge",
        unit="",
        help="Devices NVML reported as lost (NVML_ERROR_GPU_IS_LOST) in the last collection.",
        labels=(),
        source="exporter",
        accessor="NodeSnapshot.devices[].state",
        scope=Scope.NODE,
        read_node=_node_value(_lost),
    ),
    # --- dcgm-exporter default counters (--compat dcgm) -----------------------------------
    device_row(
        "DCGM_FI_DEV_SM_CLOCK",
        "gauge",
        "MHz",
        "SM clock frequency (in MHz).",
        "nvmlDeviceGetClockInfo(NVML_CLOCK_SM)",
        "sm_clock_hertz",
        scale=1e-6,
        compat="dcgm",
    ),
    device_row(
        "DCGM_FI_DEV_MEM_CLOCK",
        "gauge",
        "MHz",
        "Memory clock frequency (in MHz).",
        "nvmlDeviceGetClockInfo(NVML_CLOCK_MEM)",
        "memory_clock_hertz",
        scale=1e-6,
        compat="dcgm",
    ),
    device_row(
        "DCGM_FI_DEV_MEMORY_TEMP",
        "gauge",
        "celsius",
        "Memory temperature (in C).",
        "nvmlDeviceGetFieldValues(NVML_FI_DEV_MEMORY_TEMP)",
        "memory_temperature_celsius",
        compat="dcgm",
    ),
    device_row(
        "DCGM_FI_DEV_GPU_TEMP",
        "gauge",
        "celsius",
        "GPU temperature (in C).",
        "nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)",
        "gpu_temperature_celsius",
        compat="dcgm",
    ),
    device_row(
        "DCGM_FI_DEV_POWER_USAGE",
        "gauge",
        "watts",
        "Power draw (in W).",
        "nvmlDeviceGetPowerUsage",
        "power_watts",
        compat="dcgm",
    ),
    device_row(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "millijoules",
        "Total energy consumption since boot (in mJ).",
        "nvmlDeviceGetFieldValues(NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION)",
        "energy_joules",
        scale=1000.0,
        compat="dcgm",
    ),
    device_row(
        "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
        "counter",
        "KB/second",
        "Total number of bytes transmitted through PCIe TX (in KB) via NVML.",
        "nvmlDeviceGetFieldValues(NVML_FI_DEV_PCIE_COUNT_TX_BYTES), rate",
        "pcie_tx_bytes_per_second",
        scale=1.0 / 1024,
        compat="dcgm",
    ),
    device_row(
        "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
        "counter",
        "KB/second",
        "Total number of bytes received through PCIe RX (in KB) via NVML.",
        "nvmlDeviceGetFieldValues(NVML_FI_DEV_PCIE_COUNT_RX_BYTES), rate",
        "pcie_rx_bytes_per_second",
        scale=1.0 / 1024,
        compat="dcgm",
    ),
    device_row(
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "counter",
        "",
        "Total number of PCIe retries.",
        "nvmlDeviceGetPcieReplayCounter",
        "pcie_replay_total",
        compat="dcgm",
    ),
    device_row(
        "DCGM_FI_DEV_GPU_UTIL",
        "gauge",
        "percent",
        "GPU utilization (in %).",
        "nvmlDeviceGetUtilizationRates",
        "gpu_utilization_ratio",
        scale=100.0,
        compat="dcgm",
    ),
    device_row(
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "gauge",
        "percent",
        "Memory utilization (in %).",
        "nvmlDeviceGetUtilizationRates",
        "memory_utilization_ratio",
        scale=100.0,
        compat="dcgm",
    ),
    device_row(
        "DCGM_FI_DEV_ENC_UTIL",
        "gauge",
        "percent",
        "Encoder utilization (in %).",
        "nvmlDeviceGetEncoderUtilization",
        "encoder_utilization_ratio",
        scale=100.0,
        compat="dcgm",
    ),
    device_row(
        "DCGM_FI_DEV_DEC_UTIL",
        "gauge",
        "percent",
        "Decoder utilization (in %).",
        "nvmlDeviceGetDecoderUtilization",
        "decoder_utilization_ratio",
        scale=100.0,
        compat="dcgm",
    ),
    MetricSpec(
        name="DCGM_FI_DEV_XID_ERRORS",
        type="gauge",
        unit="",
        help="Value of the last XID error encountered.",
        labels=(),
        source="nvmlEventSetWait_v2 (nvmlEventTypeXidCriticalError)",
        accessor="NodeSnapshot.xid_last[uuid]",
        read_device=_read_last_xid,
        compat="dcgm",
    ),
    device_row(
        "DCGM_FI_DEV_FB_FREE",
        "gauge",
        "MiB",
        "Framebuffer memory free (in MiB).",
        "nvmlDeviceGetMemoryInfo_v2",
        "memory_free_bytes",
        scale=MIB,
        compat="dcgm",
    ),
    device_row(
        "DCGM_FI_DEV_FB_USED",
        "gauge",
        "MiB",
        "Framebuffer memory used (in MiB).",
        "nvmlDeviceGetMemoryInfo_v2",
        "memory_used_bytes",
        scale=MIB,
        compat="dcgm",
    ),
    device_row(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "",
        "Number of remapped rows for uncorrectable errors",
        "nvmlDeviceGetRemappedRows",
        "remapped_rows_uncorrectable",
        compat="dcgm",
    ),
    device_row(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "counter",
        "",
        "Number of remapped rows for correctable errors",
        "nvmlDeviceGetRemappedRows",
        "remapped_rows_correctable",
        compat="dcgm",
    ),
    device_row(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "gauge",
        "",
        "Whether remapping of rows has failed",
        "nvmlDeviceGetRemappedRows",
        "remap_failure",
        compat="dcgm",
    ),
    # dcgm-exporter's profiling (DCP) fields, from GPM: ratios 0-1 and bytes per second as
    # DCGM reports them; PCIe/NVLink typed counter as in dcgm-exporter's counters files.
    gpm_row(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "ratio",
        "Ratio of time the graphics engine is active.",
        "graphics_active",
        compat="dcgm",
    ),
    gpm_row(
        "DCGM_FI_PROF_SM_ACTIVE",
        "ratio",
        "The ratio of cycles an SM has at least 1 warp assigned.",
        "sm_active",
        compat="dcgm",
    ),
    gpm_row(
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "ratio",
        "The ratio of number of warps resident on an SM.",
        "sm_occupancy",
        compat="dcgm",
    ),
    gpm_row(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "ratio",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        "tensor_active",
        compat="dcgm",
    ),
    gpm_row(
        "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE",
        "ratio",
        "Ratio of cycles the HMMA tensor pipe is active.",
        "tensor_hmma_active",
        compat="dcgm",
    ),
    gpm_row(
        "DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE",
        "ratio",
        "Ratio of cycles the IMMA tensor pipe is active.",
        "tensor_imma_active",
        compat="dcgm",
    ),
    gpm_row(
        "DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE",
        "ratio",
        "Ratio of cycles the DFMA tensor pipe is active.",
        "tensor_dfma_active",
        compat="dcgm",
    ),
    gpm_row(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "ratio",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        "dram_active",
        compat="dcgm",
    ),
    gpm_row(
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
        "ratio",
        "Ratio of cycles the fp64 pipes are active.",
        "fp64_active",
        compat="dcgm",
    ),
    gpm_row(
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
        "ratio",
        "Ratio of cycles the fp32 pipes are active.",
        "fp32_active",
        compat="dcgm",
    ),
    gpm_row(
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
        "ratio",
        "Ratio of cycles the fp16 pipes are active.",
        "fp16_active",
        compat="dcgm",
    ),
    gpm_row(
        "DCGM_FI_PROF_PIPE_INT_ACTIVE",
        "ratio",
        "Ratio of cycles the integer pipe is active.",
        "integer_active",
        compat="dcgm",
    ),
    gpm_row(
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "bytes/second",
        "The number of bytes of active pcie tx data including both header and payload.",
        "pcie_tx_bytes_per_second",  # GPM, like DCGM's profiling field (native: byte counters)
        type_="counter",
        compat="dcgm",
    ),
    gpm_row(
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "bytes/second",
        "The number of bytes of active pcie rx data including both header and payload.",
        "pcie_rx_bytes_per_second",
        type_="counter",
        compat="dcgm",
    ),
    gpm_row(
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "bytes/second",
        "The number of bytes of active NvLink tx (transmit) data including both header and payload.",
        "nvlink_tx_bytes_per_second",
        type_="counter",
        compat="dcgm",
    ),
    gpm_row(
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "bytes/second",
        "The number of bytes of active NvLink rx (read) data including both header and payload.",
        "nvlink_rx_bytes_per_second",
        type_="counter",
        compat="dcgm",
    ),
]

COMPAT_MODES = frozenset(spec.compat for spec in METRICS if spec.compat is not None)

# dcgm-exporter default counters with no NVML source; documented, never emitted.
DCGM_NOT_EMITTED: tuple[tuple[str, str], ...] = (
    (
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "NVLink throughput counters are DCGM-only; per-link errors are in gpu_nvlink_errors_total",
    ),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "vGPU guests only"),
    (
        "DCGM_FI_PROF_* before Hopper",
        "profiling fields come from NVML's GPM, which needs Hopper or later; DCGM's own "
        "profiling module is not used",
    ),
)


# the metrics the fleet history reads (quota/fleet/source.py): one place says which
HISTORY: tuple[str, ...] = tuple(spec.name for spec in METRICS if spec.history)


def rows(compat: frozenset[str] = frozenset()) -> list[MetricSpec]:
    """The rows emitted with the given compat modes, in table order."""
    return [spec for spec in METRICS if spec.compat is None or spec.compat in compat]


def check_table(table: Iterable[MetricSpec] = METRICS) -> None:
    """Raise ValueError when two rows share a name (the table must stay one-per-metric)."""
    seen: set[str] = set()
    for spec in table:
        if spec.name in seen:
            raise ValueError(f"metric {spec.name} is defined twice")
        seen.add(spec.name)


check_table()
