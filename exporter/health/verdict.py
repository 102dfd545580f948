"""The health verdict: what the checker concludes about every device, as immutable values.

These types are the only thing the publication channels (metrics, the JSON endpoint, the
device plugin, node status) know about health. They import nothing from the exporter, so
every channel can read a verdict without pulling in the rules, the snapshot or each other.
A verdict lives beside the collector's snapshot, never inside it: the renderer takes both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum


class State(IntEnum):
    """HEALTHY < DEGRADED < UNHEALTHY. DEGRADED devices stay schedulable (the kubelet only
    knows Healthy/Unhealthy); UNHEALTHY ones are withdrawn from new pods."""

    HEALTHY = 0
    DEGRADED = 1
    UNHEALTHY = 2

    @property
    def label(self) -> str:
        return self.name.lower()


class Action(IntEnum):
    """What NVIDIA recommends an operator does, least drastic first."""

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
    """The verdict for every device of the node at one moment.

    ``generation`` bumps on every change and only then is a new ``NodeHealth`` published,
    so consumers wait on it and caches key on it.
    """

    devices: tuple[DeviceHealth, ...]
    generation: int
    updated_at: float
    _index: dict[str, DeviceHealth] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", {d.uuid: d for d in self.devices})

    def by_uuid(self) -> dict[str, DeviceHealth]:
        return dict(self._index)

    def get(self, uuid: str) -> DeviceHealth | None:
        return self._index.get(uuid)
