"""The shape of the health tables: one row type per kind of source, and the whole config.

The rows themselves are data (exporter/health/defaults.yaml, overlaid by ``--health-config``)
read by exporter/health/config.py; the state machine (exporter/health/engine.py) only reads
a ``RulesConfig``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from gpuquota.exporter.health.verdict import Action, State
from gpuquota.exporter.snapshot import CLOCK_EVENT_REASONS


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


@dataclass(frozen=True, slots=True)
class ConditionRule:
    """A non-XID health source, read from NVML snapshots."""

    code: str
    description: str
    state: State
    action: Action
    edge: bool  # True: an event that expires after the quiet period; False: true while observed


@dataclass(frozen=True, slots=True)
class RulesConfig:
    xid_rules: Mapping[int, XidRule]
    unknown_xid: XidRule  # the verdict for XIDs not in ``xid_rules``
    conditions: Mapping[str, ConditionRule]
    quiet_period_s: float

    def xid_rule(self, xid: int) -> XidRule:
        rule = self.xid_rules.get(xid)
        if rule is not None:
            return rule
        return replace(self.unknown_xid, xid=xid, description=f"XID {xid} is not in the table")

    def clock_event_bits(self) -> dict[str, int]:
        """Conditions named after a clock event reason, with that reason's bit.

        Idle, power cap and sync boost are normal operation and have no condition; the
        reasons that mean the hardware is protecting itself do.
        """
        return {name: bit for name, bit in CLOCK_EVENT_REASONS if name in self.conditions}
