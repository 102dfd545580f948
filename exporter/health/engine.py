"""The health state machine: snapshots, XID events and the time in, one ``NodeHealth`` out.

Pure: no NVML, gRPC, HTTP, file or clock. exporter/health/checker.py feeds it from its own
thread; the tables it applies come in as a ``RulesConfig`` (exporter/health/table.py, read
from data by exporter/health/config.py), and what it concludes is a verdict
(exporter/health/verdict.py) that every publication channel renders.

* A reason is either *level* (true while a snapshot says so: GPU lost, remap pending,
  thermal slowdown) or *edge* (an event: an XID, an ECC or NVLink counter increase). Edge
  reasons stay active until no new occurrence was seen for the quiet period.
* A device's state is the worst state of its active reasons, its action the most drastic
  action; a MIG instance also carries its parent GPU's reasons (marked inherited).
* A snapshot value that is None is unknown this round (not read, its read failed, the GPU's
  reader has not answered in time, the device could not be read at all), never "nothing
  wrong": the level reasons that value gave last stay as they were until a reading says
  otherwise. Otherwise one missed reading would clear a verdict for a round and the next
  reading would raise it again (a NoExecute taint removed and put back, pods evicted twice,
  a broken GPU handed out in between).
* Fences survive restarts: the fences this exporter put up before it (re)started (its
  DeviceTaintRules, its Node condition) come back in through :meth:`DeviceTracker.restore`
  as the level reason ``fence_restored``, with the action they were put up for. NVML's
  persistent state (recovery action, pending row remaps, retired pages pending) raises its
  own reasons anyway; the restored one is what holds a GPU whose XID the new process never
  saw. It is released only once the device answers NVML with nothing pending, and, for a
  fence put up for a reboot, once the node has booted since the fence was set (a restart of
  the exporter is not a reboot); other fences, after a quiet period without a repeat. A
  restored fence's device that an answering NVML does not list at all (a MIG instance
  reconfigured away, a board replaced) is released by the same clock, without NVML's word,
  and forgotten: it is not "missing", there is nothing left to hand out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpuquota.exporter.health.table import RulesConfig, XidRule
from gpuquota.exporter.health.verdict import Action, DeviceHealth, NodeHealth, Reason, State
from gpuquota.exporter.snapshot import DeviceSnapshot, DeviceState, NodeSnapshot

# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (nvmlDeviceGpuRecoveryAction_t) value -> the condition
# (defaults.yaml) and its detail; 0 (NONE) is no condition
RECOVERY_ACTIONS: Mapping[int, tuple[str, str]] = {
    1: ("recovery_reset", "GPU_RESET"),
    2: ("recovery_reboot", "NODE_REBOOT"),
    3: ("recovery_drain", "DRAIN_P2P"),
    4: ("recovery_reset", "DRAIN_AND_RESET: drain peer-to-peer work, then reset"),
    5: ("recovery_reset", "RECOVER_IMEX_DOMAIN"),
    6: ("recovery_reset", "BUS_RESET"),
    7: ("recovery_reboot", "SYSTEM_REBOOT"),
}

UNKNOWN_RECOVERY_ACTION = "recovery_reset"  # a value newer than this table: reset, until told

NO_INSTANCE = 0xFFFFFFFF  # NVML's "not a MIG event" marker for GPU/compute instance IDs


@dataclass(frozen=True, slots=True)
class Fence:
    """A fence this exporter set before it started, read back from the Kubernetes API."""

    uuid: str  # the device it fences (GPU- or MIG-)
    action: Action  # what it was put up for
    reasons: str  # the reason codes it recorded, for the message
    since: float  # unix time it was set


RESTORED = "fence_restored"  # the condition (defaults.yaml) a restored fence raises


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


class DeviceTracker:
    """The state machine: inputs (snapshots, XIDs, time) in, ``NodeHealth`` out.

    Not thread-safe; exporter/health/checker.py serialises calls from one worker thread.
    """

    def __init__(self, config: RulesConfig, boot_time: float | None = None) -> None:
        self.config = config
        self.boot_time = boot_time  # unix time this node booted (None: unknown)
        # uuid -> (a restored fence, when it was restored)
        self._restored: dict[str, tuple[Fence, float]] = {}
        self._clock_bits = config.clock_event_bits()
        # the level reasons each snapshot value can give (kept while the value is unknown)
        self._reasons_from: dict[str, frozenset[str]] = {
            "recovery_action": frozenset(code for code, _ in RECOVERY_ACTIONS.values())
            | {UNKNOWN_RECOVERY_ACTION},
            "remap_failure": frozenset({"row_remap_failure"}),
            "remap_pending": frozenset({"row_remap_pending"}),
            "retired_pages_pending": frozenset({"retired_pages_pending"}),
            "clock_event_reasons": frozenset(self._clock_bits),
        }
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
            self._release(device, now)
            self._level[device.uuid] = self._levels_of(device, now)
            self._counters(device, now)
        for uuid in list(self._known):
            if uuid in seen:
                continue
            if snapshot.ok and uuid in self._restored and self._known[uuid].index < 0:
                # a restored fence's device that NVML, answering, does not list (and this
                # process never saw): not "missing", nothing to hand out; released as a
                # listed one would be, without NVML's word on it
                if self._release_unlisted(uuid, now):
                    self._forget(uuid)
                continue
            parent = self._known[uuid].parent_uuid
            if parent is not None and parent in answering:
                # A MIG instance gone from a GPU that answers: MIG was reconfigured, not broken.
                self._forget(uuid)
                continue
            code = "nvml_unavailable" if not snapshot.ok else "device_missing"
            levels = self._carry(uuid, {code: None}, now)
            self._level[uuid] = self._keep_unknown(uuid, levels, self._reasons_from)
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

    def restore(self, fences: Iterable[Fence], now: float) -> NodeHealth:
        """Holds every device that one of ``fences`` covers as it was fenced (the most
        drastic action where two fences name one device), until NVML clears it."""
        if self.config.conditions[RESTORED].state is not State.HEALTHY:
            for fence in fences:
                held = self._restored.get(fence.uuid)
                if held is None or fence.action > held[0].action:
                    self._restored[fence.uuid] = (fence, now)
        return self._recompute(now)

    @property
    def restored(self) -> frozenset[str]:
        """The devices a restored fence still holds."""
        return frozenset(self._restored)

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

    def _release(self, device: DeviceSnapshot, now: float) -> None:
        """Drops a restored fence once NVML says the device is fine for what it was put up for."""
        held = self._restored.get(device.uuid)
        if held is None:
            return
        fence, restored_at = held
        pending = (
            device.state is not DeviceState.OK
            or device.recovery_action  # a nonzero action: the driver still asks for it
            or device.remap_failure
            or device.remap_pending
            or device.retired_pages_pending
        )
        if pending:
            return
        if fence.action >= Action.REBOOT_NODE:
            if self.boot_time is None or self.boot_time <= fence.since:
                return  # not rebooted since: what the fence asked for has not happened
        elif now - restored_at < self.config.quiet_period_s:
            return  # as an XID would: held until a quiet period without a repeat passed
        del self._restored[device.uuid]

    def _release_unlisted(self, uuid: str, now: float) -> bool:
        """Whether the restored fence of a device NVML does not list can go: a fence for a
        reboot once the node has booted since it was set (a GPU that fell off the bus may
        come back with it), any other after a quiet period (a MIG instance reconfigured away,
        a board replaced)."""
        fence, restored_at = self._restored[uuid]
        if fence.action >= Action.REBOOT_NODE:
            return self.boot_time is not None and self.boot_time > fence.since
        return now - restored_at >= self.config.quiet_period_s

    def _forget(self, uuid: str) -> None:
        self._restored.pop(uuid, None)
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
                device.recovery_action,
                (UNKNOWN_RECOVERY_ACTION, f"value {device.recovery_action}"),
            )
            wanted[code] = detail
        reasons = device.clock_event_reasons or 0
        for code, bit in self._clock_bits.items():
            if reasons & bit:
                wanted[code] = None
        unknown = [name for name in self._reasons_from if getattr(device, name) is None]
        return self._keep_unknown(device.uuid, self._carry(device.uuid, wanted, now), unknown)

    def _keep_unknown(
        self, uuid: str, levels: dict[str, _Active], unknown: Iterable[str]
    ) -> dict[str, _Active]:
        """Adds the level reasons that the `unknown` snapshot values gave last, unchanged
        (``last_seen`` stays the last reading that showed them)."""
        previous = self._level.get(uuid, {})
        for name in unknown:
            for code in self._reasons_from[name] & previous.keys():
                levels.setdefault(code, previous[code])
        return levels

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
        held = self._restored.get(uuid)
        if held is not None:
            fence, restored_at = held
            rule = self.config.conditions[RESTORED]
            message = f"{rule.description} (was: {fence.reasons}; action {fence.action.label})"
            out.append(
                Reason(RESTORED, rule.state, fence.action, message, fence.since, restored_at, 1,
                       inherited)
            )  # fmt: skip
        return out

    def _recompute(self, now: float) -> NodeHealth:
        self._expire_edges(now)
        for uuid in self._edge.keys() | self._level.keys() | self._restored.keys():
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
