"""The rows accounting produces, one frozen dataclass per stored table (without the surrogate id
and the cluster), the :class:`Batch` one flush writes, and the :class:`RowStore` interface the
Accountant writes through. Plain data: no SQL here (quota/store/db.py maps them to tables).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Protocol


@dataclass(frozen=True)
class AllocationRow:
    pod_uid: str
    resource_name: str
    namespace: str
    pod_name: str
    owner_kind: str | None
    owner_name: str | None
    node: str | None
    node_pool: str | None
    gpu_model: str | None
    raw_units: int
    physical_gpus: float
    replicas: int | None
    sharing_strategy: str | None
    mig_profile: str | None
    started_at: int
    ended_at: int | None
    end_reason: str | None
    estimated: bool
    qos_class: str | None
    updated_at: int
    # the physical share of one raw unit, exactly: physical_gpus = raw_units * share
    share_numerator: int
    share_denominator: int

    @property
    def share(self) -> Fraction:
        return Fraction(self.share_numerator, self.share_denominator)


@dataclass(frozen=True)
class ClaimAllocationRow:
    """A DRA claim's GPUs of one device class, charged through one pod: the piece of the
    claim's charged time (the union of its pods' intervals) this pod carries."""

    claim_uid: str
    pod_uid: str
    resource_name: str  # the device class
    namespace: str
    claim_name: str
    pod_name: str
    owner_kind: str | None
    owner_name: str | None
    node: str | None
    node_pool: str | None
    gpu_model: str | None
    raw_units: int
    physical_gpus: float
    sharing_strategy: str | None
    mig_profile: str | None
    share_estimated: bool
    pod_started_at: int
    pod_ended_at: int | None
    started_at: int
    ended_at: int | None
    end_reason: str | None
    estimated: bool
    updated_at: int
    # the exact physical share of one device: physical_gpus = raw_units * share
    share_numerator: int
    share_denominator: int

    @property
    def share(self) -> Fraction:
        return Fraction(self.share_numerator, self.share_denominator)


@dataclass(frozen=True)
class NodeCapacityRow:
    node: str
    resource_name: str
    node_pool: str | None
    gpu_model: str | None
    allocatable_units: int
    physical_gpus: float
    mig_profile: str | None
    labels: dict[str, Any]
    started_at: int
    ended_at: int | None
    # the physical share of one allocatable unit, exactly
    share_numerator: int
    share_denominator: int

    @property
    def share(self) -> Fraction:
        return Fraction(self.share_numerator, self.share_denominator)


@dataclass(frozen=True)
class NamespaceLabelsRow:
    namespace: str
    labels: dict[str, Any]
    valid_from: int
    valid_to: int | None


@dataclass(frozen=True)
class QuotaSampleRow:
    namespace: str
    quota_name: str
    resource_name: str
    hard: float | None
    used: float | None
    scopes: list[str]
    observed_at: int
    # the order of this sample among those of the same second (quota admission can update
    # ``used`` several times in one second: each change is kept, the last one holds)
    seq: int = 0


@dataclass(frozen=True)
class GapRow:
    """A span in which the controller could not follow ``kind``: [started_at, ended_at).
    Objects created and deleted inside it may be missing from the store (a 410 Gone followed by
    a relist, or downtime whose events the resumed watch could not replay)."""

    kind: str
    started_at: int
    ended_at: int
    reason: str  # gone (410 Gone while running) | restart (downtime not replayed)


@dataclass(frozen=True)
class HeartbeatRow:
    holder: str
    at: int
    resource_versions: dict[str, Any]


@dataclass
class Batch:
    """Everything one flush writes, for one cluster, in one transaction."""

    allocations: list[AllocationRow] = field(default_factory=list)
    node_capacity: list[NodeCapacityRow] = field(default_factory=list)
    namespace_labels: list[NamespaceLabelsRow] = field(default_factory=list)
    quota_samples: list[QuotaSampleRow] = field(default_factory=list)
    heartbeat: HeartbeatRow | None = None
    observed_at: int = 0  # the latest observation in the batch
    claim_allocations: list[ClaimAllocationRow] = field(default_factory=list)
    gaps: list[GapRow] = field(default_factory=list)
    # the first observation this writer made: where the store's data of the cluster begins
    # when this is its first write (a replay's first event, a controller's first list)
    first_observed_at: int | None = None

    def __len__(self) -> int:
        return (
            len(self.gaps)
            + len(self.allocations)
            + len(self.claim_allocations)
            + len(self.node_capacity)
            + len(self.namespace_labels)
            + len(self.quota_samples)
            + (self.heartbeat is not None)
        )


@dataclass
class StoredState:
    """What a restarting Accountant needs: every open interval and the latest samples."""

    allocations: list[AllocationRow]
    node_capacity: list[NodeCapacityRow]
    namespace_labels: list[NamespaceLabelsRow]
    quota_samples: list[QuotaSampleRow]
    heartbeat: HeartbeatRow | None
    # every row of each claim that still has a pod inside its billing interval
    claim_allocations: list[ClaimAllocationRow] = field(default_factory=list)


class RowStore(Protocol):
    """Where the Accountant's rows go (gpuquota.quota.store.db.Store): ``write`` applies a batch in one
    transaction or raises, keeping nothing half-written; ``load`` reads the open state back."""

    def load(self, cluster: str) -> StoredState: ...

    def write(self, cluster: str, batch: Batch) -> None: ...
