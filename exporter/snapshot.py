"""The immutable picture of one node's GPUs that the collect loop produces.

Data flows one way: collect (NVML) -> enrich (pod attribution) -> render (Prometheus), and
the health checker reads the same snapshots. Its verdict (exporter/health/verdict.py) lives
beside a snapshot, never inside it: the renderer takes both. Nothing downstream of this
module ever calls NVML. A field is ``None`` when NVML said NOT_SUPPORTED (or the value is
otherwise unavailable) for that device: renderers leave such a series out, never emit 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

# NVML clock event (throttle) reason bits, nvmlClocksEventReason*, as read into
# DeviceSnapshot.clock_event_reasons; label value -> bit. The metric table and the health
# rules both read them from here.
CLOCK_EVENT_REASONS: tuple[tuple[str, int], ...] = (
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100),
)


class DeviceState(Enum):
    """Whether NVML could talk to the device during this collection."""

    OK = "ok"
    LOST = "lost"  # NVML_ERROR_GPU_IS_LOST: fell off the bus
    RESET_REQUIRED = "reset_required"  # NVML_ERROR_RESET_REQUIRED
    ERROR = "error"  # any other failure reading the device's identity


@dataclass(frozen=True, slots=True)
class ProcessUsage:
    pid: int
    used_memory_bytes: int | None
    kind: str  # "compute" or "graphics"


@dataclass(frozen=True, slots=True)
class NvLinkCounters:
    link: int
    replay_errors: int | None = None
    recovery_errors: int | None = None
    crc_flit_errors: int | None = None
    crc_data_errors: int | None = None


@dataclass(frozen=True, slots=True)
class MigInfo:
    """Present on MIG instances only; the parent is the physical GPU."""

    parent_uuid: str
    parent_index: int
    gpu_instance_id: int
    compute_instance_id: int
    profile: str  # e.g. "1g.10gb", as in the resource name nvidia.com/mig-1g.10gb


@dataclass(frozen=True, slots=True)
class GpmMetrics:
    """GPM (Hopper and later) averages between two samples: ratios 0-1, bytes per second.
    A field is None where NVML did not answer that metric."""

    graphics_active: float | None = None  # GR engine busy (any graphics/compute work)
    sm_active: float | None = None  # SMs with at least one warp resident
    sm_occupancy: float | None = None  # resident warps / maximum
    dram_active: float | None = None  # DRAM bandwidth used / peak
    tensor_active: float | None = None  # any tensor pipe
    tensor_hmma_active: float | None = None
    tensor_imma_active: float | None = None
    tensor_dfma_active: float | None = None
    tensor_dmma_active: float | None = None
    fp64_active: float | None = None
    fp32_active: float | None = None
    fp16_active: float | None = None
    integer_active: float | None = None
    pcie_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None
    nvlink_tx_bytes_per_second: float | None = None
    nvlink_rx_bytes_per_second: float | None = None


@dataclass(frozen=True, slots=True)
class ProcessUtilization:
    """nvmlDeviceGetProcessUtilization's latest sample for one process, as ratios 0-1."""

    pid: int
    sm_ratio: float
    memory_ratio: float  # memory controller (bandwidth), not capacity
    encoder_ratio: float
    decoder_ratio: float
    # True: no new sample came for this process in the latest ask, and this is its last one,
    # kept a few seconds for the gauges. A sum over time takes only new samples: a process
    # with no sample in a second used nothing in it (docs/real-h100.md).
    held: bool = False
    # The time the latest ask's samples cover (since the ask before; 0 when held or a first
    # ask) and the SM-seconds in it: what the usage counters add.
    sampled_seconds: float = 0.0
    sm_seconds: float = 0.0
    # True: the answer this sample came in was a baseline (asked from 0: the first after the
    # agent started or the GPU came back, or a driver on another clock), so the time it
    # covers is unknown: it measures nothing, it is not a second of no use
    baseline: bool = False


@dataclass(frozen=True, slots=True)
class PodUsage:
    """What one pod's (or the host's) processes use of one device (exporter/enrich/usage.py)."""

    owner: str  # "pod", "host" (a process in no pod) or "unknown" (a process /proc does not show)
    namespace: str
    pod: str
    container: str
    processes: int
    memory_used_bytes: int | None  # framebuffer, summed over its processes
    sm_ratio: float | None  # None where NVML has no per-process utilisation (MIG)
    memory_ratio: float | None
    # SM-seconds of the processes' new samples (none held): what the usage counters add
    sm_seconds_sampled: float | None = None
    # owner "pod": its UID, always (namespace and pod are "" where the node cannot name it)
    pod_uid: str = ""


@dataclass(frozen=True, slots=True)
class HolderTotals:
    """One holder's usage counters on one device since the agent first saw it
    (exporter/enrich/ledger.py): the usage ledger's input (issue 19)."""

    kind: str  # "pod" or "claim" (a DRA ResourceClaim, charged once however many pods share it)
    namespace: str
    name: str
    uid: str  # the pod's or claim's UID (only holders whose UID is known are published)
    used_seconds: float  # physical GPU-seconds of activity, however measured
    # how the latest round measured it: sm_active, utilization or process_sm ("" when the
    # holder's latest round could not measure it: the used counter is left out of the scrape)
    activity: str
    energy_joules: float  # joules of the physical GPU apportioned to this holder


@dataclass(frozen=True, slots=True)
class DeviceSnapshot:
    """One physical GPU or one MIG instance, as read in one collection."""

    index: int  # NVML index of the physical GPU (for MIG: the instance's own position)
    uuid: str  # "GPU-..." or "MIG-..."
    state: DeviceState = DeviceState.OK
    name: str | None = None  # model, e.g. "NVIDIA H100 80GB HBM3"
    pci_bus_id: str | None = None
    minor_number: int | None = None  # /dev/nvidiaN
    serial: str | None = None
    vbios_version: str | None = None
    compute_capability: str | None = None  # "9.0"
    mig_mode_enabled: bool | None = None
    mig: MigInfo | None = None

    gpu_utilization_ratio: float | None = None  # 0-1
    memory_utilization_ratio: float | None = None  # memory controller, 0-1
    encoder_utilization_ratio: float | None = None
    decoder_utilization_ratio: float | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    gpu_temperature_celsius: float | None = None
    memory_temperature_celsius: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules: float | None = None  # since driver load
    sm_clock_hertz: float | None = None
    memory_clock_hertz: float | None = None
    pcie_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None
    pcie_replay_total: int | None = None
    pcie_tx_bytes: int | None = None  # cumulative counters (NVML_FI_DEV_PCIE_COUNT_*_BYTES)
    pcie_rx_bytes: int | None = None
    fan_speed_ratio: float | None = None
    performance_state: int | None = None  # P0..P15
    clock_event_reasons: int | None = None  # NVML bitmask (nvmlClocksEventReason*)
    # (reason, nanoseconds clocks were held down for it), NVML's clock event reason counters
    clock_event_time_ns: tuple[tuple[str, float], ...] = ()
    ecc_mode_enabled: bool | None = None
    ecc_corrected_volatile: int | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_corrected_aggregate: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    retired_pages_single_bit: int | None = None
    retired_pages_double_bit: int | None = None
    retired_pages_pending: bool | None = None
    # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: the driver's nvmlDeviceGpuRecoveryAction_t (0 none)
    recovery_action: int | None = None
    nvlinks: tuple[NvLinkCounters, ...] = ()
    processes: tuple[ProcessUsage, ...] = ()
    # (tier, unix time its readings were last completed): metrics.Tier values fast/slow/once
    read_at: tuple[tuple[str, float], ...] = ()
    # NVML function name -> error string for the calls that failed this collection
    # (NOT_SUPPORTED is not an error and never appears here).
    errors: tuple[tuple[str, str], ...] = ()
    # Profiling (exporter/collect/profiling.py): None where the device has no GPM (before Hopper)
    # or the first sample pair is not complete yet.
    gpm: GpmMetrics | None = None
    # Per-process utilisation; None where NVML has none (MIG instances, MIG-enabled GPUs).
    process_utilization: tuple[ProcessUtilization, ...] | None = None


@dataclass(frozen=True, slots=True)
class PodRef:
    namespace: str
    pod: str
    container: str


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A container holding a device through a DRA ResourceClaim (exporter/dra/)."""

    claim_namespace: str
    claim: str
    namespace: str
    pod: str
    container: str
    driver: str
    pool: str
    device: str  # the device's name in its ResourceSlice


@dataclass(frozen=True, slots=True)
class DraStatus:
    """How DRA attribution is doing (exporter/dra/)."""

    slices_up: bool  # the node's ResourceSlices are listed and watched
    devices: int  # GPU/MIG devices the slices list
    problems_total: dict[str, int]  # reason -> unresolved results and bad slices seen


@dataclass(frozen=True, slots=True)
class PodAttributionStatus:
    """How pod attribution from the kubelet pod-resources API is doing (exporter/enrich/podresources.py)."""

    socket_present: bool
    up: bool  # the last List call succeeded
    errors_total: int  # failed List calls (and socket losses) since the exporter started
    devices_attributed: int  # devices in the mapping in use (0 once it went stale)


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """Everything one collection saw, plus the enrichment joined onto it."""

    hostname: str
    driver_version: str | None
    nvml_version: str | None
    cuda_driver_version: int | None
    devices: tuple[DeviceSnapshot, ...]
    collected_at: float  # unix time
    collection_seconds: float
    # XID code -> count since the exporter started, per device UUID (from the event thread)
    xid_counts: dict[str, dict[int, int]] = field(default_factory=dict)
    # device UUID (GPU- or MIG-) -> pods holding it; several on time-sliced GPUs
    pods: dict[str, tuple[PodRef, ...]] = field(default_factory=dict)
    ok: bool = True  # False when NVML itself could not be read this round
    # The most recent XID code per device UUID (dcgm-exporter's DCGM_FI_DEV_XID_ERRORS).
    xid_last: dict[str, int] = field(default_factory=dict)
    # NVML function name -> failed calls since the exporter started (all devices together).
    nvml_errors_total: dict[str, int] = field(default_factory=dict)
    # Unix time of the last collection in which NVML answered (ok=True), this one or earlier.
    last_success_at: float | None = None
    collections_total: int = 0  # collections since the exporter started, this one included
    # Unix time the collector (and so the exporter's counters: XIDs, usage) started; a new
    # value tells a restart (counters from zero) from a silence (counters went on)
    started_at: float | None = None
    # Pod attribution's own state, set by its enricher (None: attribution turned off).
    pod_attribution: PodAttributionStatus | None = None
    # device UUID -> the DRA claims through which pods hold it (exporter/dra/)
    claims: dict[str, tuple[ClaimRef, ...]] = field(default_factory=dict)
    # DRA attribution's own state (None: DRA attribution off)
    dra: DraStatus | None = None
    # device UUID -> usage per pod (and host) on it; empty unless per-pod usage is on
    pod_usage: dict[str, tuple[PodUsage, ...]] = field(default_factory=dict)
    # NVML function -> (calls, seconds spent in them) since the exporter started
    nvml_calls: dict[str, tuple[int, float]] = field(default_factory=dict)
    # device UUID -> usage counters per holder (exporter/enrich/ledger.py); empty when off
    usage_totals: dict[str, tuple[HolderTotals, ...]] = field(default_factory=dict)
    # physical GPU UUID -> joules it drew while nobody held it (its unheld MIG share included)
    unallocated_energy: dict[str, float] = field(default_factory=dict)


# --- the GPU interconnect (collect/interconnect.py reads it, the device plugin's
# GetPreferredAllocation ranks with it: exporter/deviceplugin/topology.py)

LINK_GPU = "gpu"
LINK_SWITCH = "switch"


@dataclass(frozen=True, slots=True)
class GpuLinks:
    uuid: str
    pci_bus_id: str
    # One entry per active link: (far end's PCI bus ID, LINK_GPU or LINK_SWITCH).
    links: tuple[tuple[str, str], ...] = field(default_factory=tuple)


@dataclass(frozen=True, slots=True)
class Interconnect:
    """What NVML says about how this node's GPUs are wired (read rarely: it rarely changes)."""

    gpus: tuple[GpuLinks, ...] = ()
    # (uuid, uuid) -> NVML's topology level of the pair's PCIe common ancestor
    pcie_levels: dict[tuple[str, str], int] = field(default_factory=dict)
    numa_nodes: dict[str, int] = field(default_factory=dict)  # uuid -> NUMA node
