"""GPU health rules: the XID table, the condition table, and the state machine over them.

Pure: no NVML, gRPC, HTTP or clock. Callers feed snapshots (exporter/snapshot.py), XID
events and the current time in; out comes one immutable ``NodeHealth`` that every
publication channel (metrics, HTTP JSON, device plugin) renders. docs/health.md is
generated from the tables here (``python -m exporter.health.doc --write docs/health.md``).

Vocabulary:

* State: HEALTHY < DEGRADED < UNHEALTHY. DEGRADED devices stay schedulable (the kubelet
  only knows Healthy/Unhealthy); UNHEALTHY ones are withdrawn from new pods.
* Action: what NVIDIA recommends an operator does, NONE < RESTART_APP < RESET_GPU <
  REBOOT_NODE. A device's action is the most drastic action of its active reasons.
* A reason is either *level* (true while a snapshot says so: GPU lost, remap pending,
  thermal slowdown) or *edge* (an event: an XID, an ECC or NVLink counter increase). Edge
  reasons stay active until no new occurrence was seen for the quiet period.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import IntEnum

from exporter.snapshot import CLOCK_EVENT_REASONS as SNAPSHOT_CLOCK_REASONS
from exporter.snapshot import DeviceSnapshot, DeviceState, NodeSnapshot


class State(IntEnum):
    HEALTHY = 0
    DEGRADED = 1
    UNHEALTHY = 2

    @property
    def label(self) -> str:
        return self.name.lower()


class Action(IntEnum):
    NONE = 0
    RESTART_APP = 1
    RESET_GPU = 2
    REBOOT_NODE = 3

    @property
    def label(self) -> str:
        return self.name.lower()


def parse_state(text: str) -> State:
    try:
        return State[text.strip().upper()]
    except KeyError:
        names = ", ".join(s.label for s in State)
        raise ValueError(f"unknown health state {text!r} (expected one of: {names})") from None


def parse_action(text: str) -> Action:
    try:
        return Action[text.strip().upper()]
    except KeyError:
        names = ", ".join(a.label for a in Action)
        raise ValueError(f"unknown action {text!r} (expected one of: {names})") from None


@dataclass(frozen=True, slots=True)
class XidRule:
    """How one XID code affects the GPU (or MIG instance) that reported it."""

    xid: int
    mnemonic: str
    description: str
    state: State
    action: Action
    catalog: str  # NVIDIA's "Resolution Bucket (Immediate Action)" for the code
    note: str = ""  # why we differ from the catalog or from NVIDIA's device plugin, if we do


_H, _D, _U = State.HEALTHY, State.DEGRADED, State.UNHEALTHY
_NO, _APP, _RESET, _REBOOT = Action.NONE, Action.RESTART_APP, Action.RESET_GPU, Action.REBOOT_NODE

# NVIDIA's XID catalog (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html) gives
# each code an immediate action. We map IGNORE -> healthy, RESTART_APP -> degraded (the GPU
# still serves new pods; the failing application must restart), RESET_GPU -> unhealthy +
# reset, RESTART_BM -> unhealthy + reboot. Workflow buckets that need register decoding we
# cannot do from an NVML event are mapped to the safest reading and say so in `note`.
_APP_ENGINE = "engine exception reported to the application"
_CATALOG: tuple[tuple[int, str, str, State, Action, str, str], ...] = (
    (
        8,
        "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT",
        "GPU stopped processing",
        _D,
        _APP,
        "RESTART_APP",
        "",
    ),
    (
        11,
        "ROBUST_CHANNEL_GR_ERROR_MISSING_HW",
        "invalid or corrupted push buffer stream",
        _D,
        _APP,
        "RESTART_APP",
        "",
    ),
    (
        13,
        "ROBUST_CHANNEL_GR_EXCEPTION",
        "graphics engine exception (application error)",
        _D,
        _APP,
        "RESTART_APP",
        "NVIDIA's device plugin skips it too: an application fault, the GPU keeps serving pods",
    ),
    (14, "ROBUST_CHANNEL_FAKE_ERROR", "injected test error", _H, _NO, "IGNORE", ""),
    (
        25,
        "ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY",
        "invalid or corrupted push buffer stream",
        _D,
        _APP,
        "RESTART_APP",
        "",
    ),
    (
        31,
        "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT",
        "GPU memory page fault (application error)",
        _D,
        _APP,
        "RESTART_APP",
        "NVIDIA's device plugin skips it too",
    ),
    (
        32,
        "ROBUST_CHANNEL_PBDMA_ERROR",
        "invalid or corrupted push buffer stream",
        _D,
        _APP,
        "RESTART_APP",
        "",
    ),
    (
        37,
        "ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD",
        "unimplemented firmware method",
        _H,
        _NO,
        "IGNORE",
        "",
    ),
    (
        38,
        "ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT",
        "firmware watchdog timeout",
        _H,
        _NO,
        "IGNORE",
        "",
    ),
    (39, "ROBUST_CHANNEL_CE0_ERROR", f"copy engine 0 {_APP_ENGINE}", _D, _APP, "RESTART_APP", ""),
    (40, "ROBUST_CHANNEL_CE1_ERROR", f"copy engine 1 {_APP_ENGINE}", _D, _APP, "RESTART_APP", ""),
    (41, "ROBUST_CHANNEL_CE2_ERROR", f"copy engine 2 {_APP_ENGINE}", _D, _APP, "RESTART_APP", ""),
    (
        43,
        "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR",
        "GPU stopped processing (application stopped)",
        _H,
        _NO,
        "IGNORE",
        "logged when an application is stopped; NVIDIA's device plugin skips it too",
    ),
    (
        44,
        "ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW",
        "graphics engine fault during context switch",
        _H,
        _NO,
        "IGNORE",
        "",
    ),
    (
        45,
        "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL",
        "preemptive cleanup after a previous error",
        _H,
        _NO,
        "WORKFLOW_XID_45",
        "follows another XID, which carries the real verdict; NVIDIA's device plugin skips it too",
    ),
    (
        46,
        "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR",
        "GPU stopped processing (timeout)",
        _U,
        _RESET,
        "RESET_GPU",
        "",
    ),
    (
        48,
        "ROBUST_CHANNEL_GPU_ECC_DBE",
        "double-bit (uncorrectable) ECC error",
        _U,
        _RESET,
        "WORKFLOW_XID_48",
        "the catalog says a GPU reset or node reboot is needed",
    ),
    (
        54,
        "SILENT_RUNNING_PWR_REDUCED_CLOCKING",
        "auxiliary power missing, clocks reduced",
        _D,
        _NO,
        "CHECK_MECHANICALS",
        "",
    ),
    (60, "ROBUST_CHANNEL_SEC2_ERROR", "SEC2 engine exception", _D, _APP, "RESTART_APP", ""),
    (62, "PMU_HALT_ERROR", "internal micro-controller halt", _U, _RESET, "RESET_GPU", ""),
    (
        63,
        "INFOROM_DRAM_RETIREMENT_EVENT",
        "row-remapping / page-retirement event recorded",
        _H,
        _NO,
        "IGNORE",
        "the pending remap itself is tracked from NVML (row_remap_pending)",
    ),
    (
        64,
        "INFOROM_DRAM_RETIREMENT_FAILURE",
        "row-remapping / page-retirement failure",
        _U,
        _RESET,
        "RESET_GPU",
        "",
    ),
    (
        66,
        "ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION",
        "firmware register access violation",
        _H,
        _NO,
        "IGNORE",
        "",
    ),
    (
        67,
        "ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION",
        "firmware verification violation",
        _H,
        _NO,
        "IGNORE",
        "",
    ),
    (
        68,
        "ROBUST_CHANNEL_NVDEC0_ERROR",
        "video decoder exception",
        _D,
        _APP,
        "RESTART_APP",
        "NVIDIA's device plugin skips it; we keep it visible as degraded",
    ),
    (
        69,
        "ROBUST_CHANNEL_GR_CLASS_ERROR",
        "graphics engine class error",
        _D,
        _APP,
        "RESTART_APP",
        "",
    ),
    (70, "ROBUST_CHANNEL_CE3_ERROR", f"copy engine 3 {_APP_ENGINE}", _D, _APP, "RESTART_APP", ""),
    (71, "ROBUST_CHANNEL_CE4_ERROR", f"copy engine 4 {_APP_ENGINE}", _D, _APP, "RESTART_APP", ""),
    (72, "ROBUST_CHANNEL_CE5_ERROR", f"copy engine 5 {_APP_ENGINE}", _D, _APP, "RESTART_APP", ""),
    (
        74,
        "NVLINK_ERROR",
        "NVLink error",
        _U,
        _RESET,
        "WORKFLOW_NVLINK_ERR",
        "the catalog says a GPU reset or node reboot is needed to clear it; the register bits that "
        "would mark some as ignorable are not in the NVML event",
    ),
    (75, "ROBUST_CHANNEL_CE6_ERROR", f"copy engine 6 {_APP_ENGINE}", _D, _APP, "RESTART_APP", ""),
    (76, "ROBUST_CHANNEL_CE7_ERROR", f"copy engine 7 {_APP_ENGINE}", _D, _APP, "RESTART_APP", ""),
    (77, "ROBUST_CHANNEL_CE8_ERROR", f"copy engine 8 {_APP_ENGINE}", _D, _APP, "RESTART_APP", ""),
    (78, "VGPU_START_ERROR", "vGPU start error", _D, _NO, "UPDATE_SWFW", ""),
    (
        79,
        "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS",
        "GPU has fallen off the bus",
        _U,
        _REBOOT,
        "RESTART_BM",
        "",
    ),
    (
        80,
        "PBDMA_PUSHBUFFER_CRC_MISMATCH",
        "corrupted data sent to the GPU",
        _D,
        _APP,
        "RESTART_APP",
        "",
    ),
    (82, "ROBUST_CHANNEL_NVJPG0_ERROR", "JPEG engine exception", _D, _APP, "RESTART_APP", ""),
    (83, "ROBUST_CHANNEL_NVDEC1_ERROR", "video decoder exception", _D, _APP, "RESTART_APP", ""),
    (84, "ROBUST_CHANNEL_NVDEC2_ERROR", "video decoder exception", _D, _APP, "RESTART_APP", ""),
    (85, "ROBUST_CHANNEL_CE9_ERROR", f"copy engine 9 {_APP_ENGINE}", _D, _APP, "RESTART_APP", ""),
    (86, "ROBUST_CHANNEL_OFA0_ERROR", "optical flow engine exception", _D, _APP, "RESTART_APP", ""),
    (88, "ROBUST_CHANNEL_NVDEC3_ERROR", "video decoder exception", _D, _APP, "RESTART_APP", ""),
    (89, "ROBUST_CHANNEL_NVDEC4_ERROR", "video decoder exception", _D, _APP, "RESTART_APP", ""),
    (
        92,
        "EXCESSIVE_SBE_INTERRUPTS",
        "high single-bit ECC error rate",
        _D,
        _NO,
        "IGNORE",
        "the catalog's investigatory action is CONTACT_SUPPORT; we keep it visible as degraded",
    ),
    (
        93,
        "INFOROM_ERASE_LIMIT_EXCEEDED",
        "InfoROM wear limit exceeded (non-fatal)",
        _H,
        _NO,
        "IGNORE",
        "",
    ),
    (
        94,
        "ROBUST_CHANNEL_CONTAINED_ERROR",
        "contained ECC error: only the affected application must restart",
        _D,
        _APP,
        "RESTART_APP",
        "NVIDIA recommends a GPU reset when convenient; the GPU keeps serving pods",
    ),
    (
        95,
        "ROBUST_CHANNEL_UNCONTAINED_ERROR",
        "uncontained ECC error: the GPU must be reset",
        _U,
        _RESET,
        "RESET_GPU",
        "",
    ),
    (106, "SMBPBI_TEST_MESSAGE", "out-of-band test message", _H, _NO, "IGNORE", ""),
    (107, "SMBPBI_TEST_MESSAGE_SILENT", "out-of-band test message", _H, _NO, "IGNORE", ""),
    (
        108,
        "NVLINK_REMOTE_TRANSLATION_ERROR",
        "NVLink remote translation error",
        _H,
        _NO,
        "IGNORE",
        "",
    ),
    (
        109,
        "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR",
        "context switch timeout",
        _U,
        _RESET,
        "RESET_GPU",
        "NVIDIA's device plugin skips it as an application error; the current catalog says RESET_GPU",
    ),
    (110, "SEC_FAULT_ERROR", "security fault", _U, _RESET, "RESET_GPU", ""),
    (119, "GSP_RPC_TIMEOUT", "GSP firmware RPC timeout", _U, _RESET, "RESET_GPU", ""),
    (120, "GSP_ERROR", "error in code running on the GSP", _U, _RESET, "RESET_GPU", ""),
    (121, "C2C_ERROR", "chip-to-chip link error (corrected)", _H, _NO, "IGNORE", ""),
    (136, "ALI_TRAINING_FAIL", "NVLink link training failure", _U, _RESET, "RESET_GPU", ""),
    (137, "NVLINK_PRIV_ERR", "NVLink FLA privilege error", _H, _NO, "IGNORE", ""),
    (140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "unrecovered ECC error", _U, _RESET, "RESET_GPU", ""),
    (141, "ROBUST_CHANNEL_FAST_PATH_ERROR", "fast path error", _H, _NO, "IGNORE", ""),
    (143, "GPU_INIT_ERROR", "GPU initialization failure", _U, _RESET, "RESET_GPU", ""),
    (
        144,
        "NVLINK_SAW_ERROR",
        "NVLink5 SAW error",
        _D,
        _RESET,
        "WORKFLOW_NVLINK5_ERR",
        "needs register decoding to tell fatal from benign; degraded until an operator looks",
    ),
    (145, "NVLINK_RLW_ERROR", "NVLink5 RLW error", _D, _RESET, "WORKFLOW_NVLINK5_ERR", "as 144"),
    (146, "NVLINK_TLW_ERROR", "NVLink5 TLW error", _D, _RESET, "WORKFLOW_NVLINK5_ERR", "as 144"),
    (
        147,
        "NVLINK_TREX_ERROR",
        "NVLink5 TREX error",
        _H,
        _NO,
        "WORKFLOW_NVLINK5_ERR",
        "all its entries are IGNORE",
    ),
    (
        148,
        "NVLINK_NVLPW_CTRL_ERROR",
        "NVLink5 NVLPW control error",
        _H,
        _NO,
        "WORKFLOW_NVLINK5_ERR",
        "as 147",
    ),
    (
        149,
        "NVLINK_NETIR_ERROR",
        "NVLink5 NETIR error",
        _D,
        _RESET,
        "WORKFLOW_NVLINK5_ERR",
        "as 144",
    ),
    (
        150,
        "NVLINK_MSE_ERROR",
        "NVLink5 MSE error",
        _U,
        _RESET,
        "WORKFLOW_NVLINK5_ERR",
        "all its entries are RESET_GPU",
    ),
    (
        151,
        "ROBUST_CHANNEL_KEY_ROTATION_ERROR",
        "confidential-computing key rotation error",
        _U,
        _REBOOT,
        "RESTART_VM",
        "",
    ),
    (
        154,
        "GPU_RECOVERY_ACTION_CHANGED",
        "driver's recovery action changed (summary of another XID)",
        _H,
        _NO,
        "XID_154",
        "informational; the XID it summarises carries the verdict",
    ),
    (155, "NVLINK_SW_DEFINED_ERROR", "NVLink software-defined error", _U, _RESET, "RESET_GPU", ""),
    (156, "RESOURCE_RETIREMENT_EVENT", "resource retirement event", _U, _RESET, "RESET_GPU", ""),
    (
        157,
        "RESOURCE_RETIREMENT_FAILURE",
        "resource retirement failure",
        _D,
        _NO,
        "IGNORE",
        "the catalog's investigatory action is CONTACT_SUPPORT; we keep it visible as degraded",
    ),
    (158, "GPU_FATAL_TIMEOUT", "fatal GPU timeout", _U, _RESET, "RESET_GPU", ""),
)

DEFAULT_XID_RULES: Mapping[int, XidRule] = {row[0]: XidRule(*row) for row in _CATALOG}

# XIDs missing from the table: visible, schedulable, no action, until an operator classifies
# them in the configuration. (NVIDIA's device plugin treats every unlisted XID as fatal.)
DEFAULT_UNKNOWN_XID = XidRule(0, "UNKNOWN", "XID not in the table", _D, _NO, "", "")


@dataclass(frozen=True, slots=True)
class ConditionRule:
    """A non-XID health source, read from NVML snapshots."""

    code: str
    description: str
    state: State
    action: Action
    edge: bool  # True: an event that expires after the quiet period; False: true while observed


DEFAULT_CONDITION_RULES: Mapping[str, ConditionRule] = {
    rule.code: rule
    for rule in (
        ConditionRule(
            "gpu_lost",
            "NVML_ERROR_GPU_IS_LOST: the GPU does not answer (fell off the bus)",
            _U,
            _REBOOT,
            edge=False,
        ),
        ConditionRule(
            "reset_required",
            "NVML_ERROR_RESET_REQUIRED: the GPU needs a reset",
            _U,
            _RESET,
            edge=False,
        ),
        ConditionRule(
            "device_missing",
            "a GPU seen earlier is no longer enumerated by NVML",
            _U,
            _REBOOT,
            edge=False,
        ),
        ConditionRule(
            "nvml_unavailable",
            "NVML could not be read at all (driver unloaded or hung)",
            _U,
            _REBOOT,
            edge=False,
        ),
        ConditionRule(
            "nvml_error", "NVML could not read the device's identity", _D, _NO, edge=False
        ),
        ConditionRule(
            "ecc_uncorrectable",
            "the volatile uncorrectable ECC error count increased",
            _U,
            _RESET,
            edge=True,
        ),
        ConditionRule("row_remap_failure", "row remapping failed", _U, _RESET, edge=False),
        ConditionRule(
            "row_remap_pending",
            "a row remap is pending; it takes effect at the next GPU reset",
            _D,
            _RESET,
            edge=False,
        ),
        ConditionRule(
            "retired_pages_pending",
            "a page retirement is pending; it takes effect at the next GPU reset",
            _D,
            _RESET,
            edge=False,
        ),
        ConditionRule(
            "hw_slowdown",
            "hardware slowdown: clocks cut by the hardware (temperature, power)",
            _D,
            _NO,
            edge=False,
        ),
        ConditionRule("hw_thermal_slowdown", "hardware thermal slowdown", _D, _NO, edge=False),
        ConditionRule("sw_thermal_slowdown", "driver thermal slowdown", _D, _NO, edge=False),
        ConditionRule(
            "hw_power_brake_slowdown",
            "hardware power brake slowdown (external power brake asserted)",
            _D,
            _NO,
            edge=False,
        ),
        ConditionRule(
            "nvlink_errors",
            "NVLink replay, recovery or CRC error counters increased",
            _D,
            _NO,
            edge=True,
        ),
        # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: held while the driver asks for it, so an XID's
        # verdict does not clear after the quiet period while the GPU still needs recovering
        ConditionRule("recovery_reset", "the driver asks for a GPU reset", _U, _RESET, edge=False),
        ConditionRule(
            "recovery_reboot", "the driver asks for a node reboot", _U, _REBOOT, edge=False
        ),
        ConditionRule(
            "recovery_drain",
            "the driver asks to drain peer-to-peer work from the GPU",
            _U,
            Action.RESTART_APP,
            edge=False,
        ),
    )
}

# nvmlDeviceGpuRecoveryAction_t value -> (condition, detail); 0 (NONE) is healthy
RECOVERY_ACTIONS: Mapping[int, tuple[str, str]] = {
    1: ("recovery_reset", "GPU_RESET"),
    2: ("recovery_reboot", "NODE_REBOOT"),
    3: ("recovery_drain", "DRAIN_P2P"),
    4: ("recovery_reset", "DRAIN_AND_RESET: drain peer-to-peer work, then reset"),
    5: ("recovery_reset", "RECOVER_IMEX_DOMAIN"),
    6: ("recovery_reset", "BUS_RESET"),
    7: ("recovery_reboot", "SYSTEM_REBOOT"),
}

# Clock event reasons (exporter/snapshot.py) that mean the hardware is protecting itself;
# each is a condition of the same name. Idle, power cap and sync boost are normal operation.
SLOWDOWN_REASONS = (
    "hw_slowdown",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
)
CLOCK_EVENT_REASONS: Mapping[str, int] = {
    name: bit for name, bit in SNAPSHOT_CLOCK_REASONS if name in SLOWDOWN_REASONS
}

DEFAULT_QUIET_PERIOD_S = 300.0
NO_INSTANCE = 0xFFFFFFFF  # NVML's "not a MIG event" marker for GPU/compute instance IDs


@dataclass(frozen=True, slots=True)
class HealthConfig:
    xid_rules: Mapping[int, XidRule] = field(default_factory=lambda: dict(DEFAULT_XID_RULES))
    unknown_xid: XidRule = DEFAULT_UNKNOWN_XID
    conditions: Mapping[str, ConditionRule] = field(
        default_factory=lambda: dict(DEFAULT_CONDITION_RULES)
    )
    quiet_period_s: float = DEFAULT_QUIET_PERIOD_S

    def xid_rule(self, xid: int) -> XidRule:
        rule = self.xid_rules.get(xid)
        if rule is not None:
            return rule
        return replace(self.unknown_xid, xid=xid, description=f"XID {xid} is not in the table")


@dataclass(frozen=True, slots=True)
class Reason:
    code: str  # "xid_79", "gpu_lost", ...
    state: State
    action: Action
    message: str
    since: float  # first occurrence in this episode (unix time)
    last_seen: float
    count: int = 1
    inherited: bool = False  # on a MIG instance: the reason belongs to the parent GPU


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    uuid: str
    index: int
    state: State
    action: Action
    since: float  # when the device entered its current state
    reasons: tuple[Reason, ...] = ()
    parent_uuid: str | None = None  # MIG instances only
    mig_profile: str | None = None
    minor_number: int | None = None


@dataclass(frozen=True, slots=True)
class NodeHealth:
    devices: tuple[DeviceHealth, ...]
    generation: int  # bumps on every change; consumers wait on it
    updated_at: float
    _index: dict[str, DeviceHealth] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", {d.uuid: d for d in self.devices})

    def by_uuid(self) -> dict[str, DeviceHealth]:
        return dict(self._index)

    def get(self, uuid: str) -> DeviceHealth | None:
        return self._index.get(uuid)


@dataclass(slots=True)
class _Known:
    uuid: str
    index: int
    parent_uuid: str | None
    gpu_instance_id: int | None
    compute_instance_id: int | None
    profile: str | None
    minor_number: int | None


@dataclass(slots=True)
class _Active:
    rule_state: State
    action: Action
    message: str
    since: float
    last_seen: float
    count: int = 1

    def freeze(self, code: str, inherited: bool = False) -> Reason:
        return Reason(
            code,
            self.rule_state,
            self.action,
            self.message,
            self.since,
            self.last_seen,
            self.count,
            inherited,
        )


def _nvlink_total(device: DeviceSnapshot) -> int:
    total = 0
    for link in device.nvlinks:
        for value in (
            link.replay_errors,
            link.recovery_errors,
            link.crc_flit_errors,
            link.crc_data_errors,
        ):
            total += value or 0
    return total


class HealthTracker:
    """The state machine: inputs (snapshots, XIDs, time) in, ``NodeHealth`` out.

    Not thread-safe; exporter/health/checker.py serialises calls from one worker thread.
    """

    def __init__(self, config: HealthConfig | None = None) -> None:
        self.config = config or HealthConfig()
        self._known: dict[str, _Known] = {}
        self._level: dict[str, dict[str, _Active]] = {}
        self._edge: dict[str, dict[str, _Active]] = {}
        self._ecc: dict[str, int] = {}
        self._nvlink: dict[str, int] = {}
        self._state_since: dict[str, tuple[State, float]] = {}
        self._health = NodeHealth((), 0, 0.0)

    @property
    def health(self) -> NodeHealth:
        return self._health

    # -- inputs -------------------------------------------------------------------------

    def observe_snapshot(self, snapshot: NodeSnapshot, now: float) -> NodeHealth:
        seen: set[str] = set()
        answering: set[str] = set()
        for device in snapshot.devices:
            seen.add(device.uuid)
            if device.state is DeviceState.OK:
                answering.add(device.uuid)
            self._remember(device)
            self._level[device.uuid] = self._levels_of(device, now)
            self._counters(device, now)
        for uuid in list(self._known):
            if uuid in seen:
                continue
            parent = self._known[uuid].parent_uuid
            if parent is not None and parent in answering:
                # A MIG instance gone from a GPU that answers: MIG was reconfigured, not broken.
                self._forget(uuid)
                continue
            code = "nvml_unavailable" if not snapshot.ok else "device_missing"
            self._level[uuid] = self._carry(uuid, {code: None}, now)
        return self._recompute(now)

    def observe_xid(
        self,
        uuid: str,
        xid: int,
        at: float,
        gpu_instance_id: int | None = None,
        compute_instance_id: int | None = None,
    ) -> NodeHealth:
        rule = self.config.xid_rule(xid)
        if rule.state is not State.HEALTHY:  # ignored XIDs only count in the metrics
            message = f"XID {xid} {rule.mnemonic}: {rule.description}"
            for target in self._xid_targets(uuid, rule, gpu_instance_id, compute_instance_id):
                edge = self._edge.setdefault(target, {})
                self._bump(edge, f"xid_{xid}", rule.state, rule.action, message, at)
        return self._recompute(at)

    def expire(self, now: float) -> NodeHealth:
        return self._recompute(now)

    def next_expiry(self) -> float | None:
        """When the earliest edge reason runs out (so a timer can recompute then)."""
        times = [
            a.last_seen + self.config.quiet_period_s
            for per in self._edge.values()
            for a in per.values()
        ]
        return min(times) if times else None

    # -- internals ----------------------------------------------------------------------

    def _remember(self, device: DeviceSnapshot) -> None:
        mig = device.mig
        self._known[device.uuid] = _Known(
            uuid=device.uuid,
            index=device.index,
            parent_uuid=mig.parent_uuid if mig else None,
            gpu_instance_id=mig.gpu_instance_id if mig else None,
            compute_instance_id=mig.compute_instance_id if mig else None,
            profile=mig.profile if mig else None,
            minor_number=device.minor_number,
        )

    def _forget(self, uuid: str) -> None:
        for table in (
            self._known,
            self._level,
            self._edge,
            self._ecc,
            self._nvlink,
            self._state_since,
        ):
            table.pop(uuid, None)

    def _carry(self, uuid: str, wanted: Mapping[str, str | None], now: float) -> dict[str, _Active]:
        """Level reasons for one device: keep `since` of those already active."""
        previous = self._level.get(uuid, {})
        result: dict[str, _Active] = {}
        for code, detail in wanted.items():
            rule = self.config.conditions[code]
            if rule.state is State.HEALTHY:
                continue
            message = rule.description + (f" ({detail})" if detail else "")
            old = previous.get(code)
            since = old.since if old is not None else now
            result[code] = _Active(rule.state, rule.action, message, since, now)
        return result

    def _levels_of(self, device: DeviceSnapshot, now: float) -> dict[str, _Active]:
        wanted: dict[str, str | None] = {}
        if device.state is DeviceState.LOST:
            wanted["gpu_lost"] = None
        elif device.state is DeviceState.RESET_REQUIRED:
            wanted["reset_required"] = None
        elif device.state is DeviceState.ERROR:
            wanted["nvml_error"] = "; ".join(f"{fn}: {err}" for fn, err in device.errors) or None
        if device.remap_failure:
            wanted["row_remap_failure"] = None
        if device.remap_pending:
            wanted["row_remap_pending"] = None
        if device.retired_pages_pending:
            wanted["retired_pages_pending"] = None
        if device.recovery_action:  # unknown future values: a reset, until told otherwise
            code, detail = RECOVERY_ACTIONS.get(
                device.recovery_action, ("recovery_reset", f"value {device.recovery_action}")
            )
            wanted[code] = detail
        reasons = device.clock_event_reasons or 0
        for code, bit in CLOCK_EVENT_REASONS.items():
            if reasons & bit:
                wanted[code] = None
        return self._carry(device.uuid, wanted, now)

    def _counters(self, device: DeviceSnapshot, now: float) -> None:
        edge = self._edge.setdefault(device.uuid, {})
        ecc = device.ecc_uncorrected_volatile
        if ecc is not None:
            before = self._ecc.get(device.uuid)
            if before is not None and ecc > before:
                self._bump_condition(edge, "ecc_uncorrectable", f"+{ecc - before}, now {ecc}", now)
            self._ecc[device.uuid] = ecc
        if device.nvlinks:
            total = _nvlink_total(device)
            before = self._nvlink.get(device.uuid)
            if before is not None and total > before:
                self._bump_condition(edge, "nvlink_errors", f"+{total - before}", now)
            self._nvlink[device.uuid] = total

    def _bump_condition(self, edge: dict[str, _Active], code: str, detail: str, now: float) -> None:
        rule = self.config.conditions[code]
        if rule.state is not State.HEALTHY:
            self._bump(edge, code, rule.state, rule.action, f"{rule.description} ({detail})", now)

    @staticmethod
    def _bump(
        edge: dict[str, _Active], code: str, state: State, action: Action, message: str, at: float
    ) -> None:
        active = edge.get(code)
        if active is None:
            edge[code] = _Active(state, action, message, at, at)
        else:
            active.last_seen = max(active.last_seen, at)
            active.message = message
            active.count += 1

    def _xid_targets(self, uuid: str, rule: XidRule, gi: int | None, ci: int | None) -> list[str]:
        """A MIG-scoped XID that only needs an application restart stays on its instance(s)
        (every compute instance of the GPU instance when no compute instance is named);
        anything needing a reset or reboot takes the whole GPU (all its instances) with it."""
        if gi is None or gi == NO_INSTANCE or rule.action > Action.RESTART_APP:
            return [uuid]
        targets = [
            known.uuid
            for known in self._known.values()
            if known.parent_uuid == uuid
            and known.gpu_instance_id == gi
            and (ci is None or ci == NO_INSTANCE or known.compute_instance_id == ci)
        ]
        return targets or [uuid]

    def _expire_edges(self, now: float) -> None:
        quiet = self.config.quiet_period_s
        for per in self._edge.values():
            for code in [c for c, a in per.items() if now - a.last_seen >= quiet]:
                del per[code]

    def _reasons(self, uuid: str, inherited: bool) -> list[Reason]:
        out = [a.freeze(c, inherited) for c, a in self._level.get(uuid, {}).items()]
        out += [a.freeze(c, inherited) for c, a in self._edge.get(uuid, {}).items()]
        return out

    def _recompute(self, now: float) -> NodeHealth:
        self._expire_edges(now)
        for uuid in self._edge.keys() | self._level.keys():
            if uuid not in self._known:  # an XID for a device no snapshot has shown yet
                self._known[uuid] = _Known(uuid, -1, None, None, None, None, None)
        devices: list[DeviceHealth] = []
        for known in self._ordered():
            reasons = self._reasons(known.uuid, inherited=False)
            if known.parent_uuid is not None:
                reasons += self._reasons(known.parent_uuid, inherited=True)
            reasons.sort(key=lambda r: (-r.state, -r.action, r.code))
            state = max((r.state for r in reasons), default=State.HEALTHY)
            action = max((r.action for r in reasons), default=Action.NONE)
            prev = self._state_since.get(known.uuid)
            since = prev[1] if prev is not None and prev[0] is state else now
            self._state_since[known.uuid] = (state, since)
            devices.append(
                DeviceHealth(
                    uuid=known.uuid,
                    index=known.index,
                    state=state,
                    action=action,
                    since=since,
                    reasons=tuple(reasons),
                    parent_uuid=known.parent_uuid,
                    mig_profile=known.profile,
                    minor_number=known.minor_number,
                )
            )
        new = tuple(devices)
        if new != self._health.devices:
            self._health = NodeHealth(new, self._health.generation + 1, now)
        return self._health

    def _ordered(self) -> Iterable[_Known]:
        def key(k: _Known) -> tuple[int, int, int, int, str]:
            parent = self._known.get(k.parent_uuid) if k.parent_uuid else None
            top = parent.index if parent is not None else k.index
            return (
                top,
                1 if k.parent_uuid else 0,
                k.gpu_instance_id or 0,
                k.compute_instance_id or 0,
                k.uuid,
            )

        return sorted(self._known.values(), key=key)
