"""SQLAlchemy 2 models of the quota store (Alembic migrations in alembic/ must match them).

Every row carries the cluster name so several clusters can share one database. Times are
unix seconds (UTC) in BIGINT columns: Kubernetes timestamps have one-second resolution, and
integer seconds let the report clip intervals to a window with the same plain arithmetic on
SQLite and PostgreSQL, inside the database.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    REAL,
    BigInteger,
    Boolean,
    Float,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Length classes of a closed allocation, in seconds: class k holds lengths below
# SPAN_CLASS_BOUNDS[k]; the last class (len(SPAN_CLASS_BOUNDS)) the longer ones and, as its
# comparisons are NULL, open intervals. Indexed by ix_allocations_span; changing it needs a
# migration that rebuilds that index.
SPAN_CLASS_BOUNDS = (3600, 86400, 7 * 86400, 35 * 86400)
# written the way PostgreSQL reflects it back, so Alembic finds models and migrations equal
SPAN_CLASS_SQL = (
    "(\nCASE\n"
    + "".join(
        f"    WHEN (ended_at - started_at) < {b} THEN {k}\n"
        for k, b in enumerate(SPAN_CLASS_BOUNDS)
    )
    + f"    ELSE {len(SPAN_CLASS_BOUNDS)}\nEND)"
)


# the partial index ix_allocations_best_effort's condition; queries repeat it word for word
BEST_EFFORT_SQL = "qos_class = 'BestEffort'"


class Base(DeclarativeBase):
    pass


class Cluster(Base):
    __tablename__ = "clusters"

    name: Mapped[str] = mapped_column(String(253), primary_key=True)
    created_at: Mapped[int] = mapped_column(BigInteger)


class NamespaceLabels(Base):
    """A namespace's labels over time: one row per distinct label set, [valid_from, valid_to)."""

    __tablename__ = "namespace_labels"
    __table_args__ = (
        Index("ix_namespace_labels_lookup", "cluster", "namespace", "valid_from"),
        # a replayed namespace event updates its row instead of adding a second one
        UniqueConstraint("cluster", "namespace", "valid_from", name="uq_namespace_labels_from"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    cluster: Mapped[str] = mapped_column(String(253))
    namespace: Mapped[str] = mapped_column(String(253))
    labels: Mapped[dict[str, Any]] = mapped_column(JSON)
    valid_from: Mapped[int] = mapped_column(BigInteger)
    valid_to: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # None: current


class Allocation(Base):
    """GPUs of one resource bound to one pod: a half-open interval [started_at, ended_at).

    Keyed by (cluster, pod_uid, resource_name): a replayed or duplicated event updates the same
    row, so nothing is counted twice. ``ended_at`` is None while the pod still holds the GPUs.
    """

    __tablename__ = "allocations"
    __table_args__ = (
        UniqueConstraint("cluster", "pod_uid", "resource_name", name="uq_allocation_pod"),
        # the report clips intervals to a window: rows that end after its start and start
        # before its end, grouped by namespace (or another column)
        Index("ix_allocations_window", "cluster", "started_at", "ended_at"),
        Index("ix_allocations_open", "cluster", "ended_at"),
        Index("ix_allocations_namespace", "cluster", "namespace", "started_at"),
        # the report's window scans (migrations 0002, 0003): "overlaps [lo, hi)" is not one
        # B-tree range, but "of length class k and started in [lo - bound_k, hi)" is; the
        # longest closed interval bounds the last class, read in one probe of the first index
        Index("ix_allocations_duration", text("(ended_at - started_at)")),
        Index("ix_allocations_span", "cluster", text(SPAN_CLASS_SQL), "started_at"),
        # the report's BestEffort-pod check (migration 0008): the few rows of BestEffort pods
        # only, not a scan of the window's rows (the condition must be written literally)
        Index(
            "ix_allocations_best_effort",
            "cluster",
            "started_at",
            postgresql_where=text(BEST_EFFORT_SQL),
            sqlite_where=text(BEST_EFFORT_SQL),
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    cluster: Mapped[str] = mapped_column(String(253))
    pod_uid: Mapped[str] = mapped_column(String(64))
    namespace: Mapped[str] = mapped_column(String(253))
    pod_name: Mapped[str] = mapped_column(String(253))
    owner_kind: Mapped[str | None] = mapped_column(String(63), nullable=True)
    owner_name: Mapped[str | None] = mapped_column(String(253), nullable=True)
    node: Mapped[str | None] = mapped_column(String(253), nullable=True)
    node_pool: Mapped[str | None] = mapped_column(String(253), nullable=True)
    gpu_model: Mapped[str | None] = mapped_column(String(253), nullable=True)
    resource_name: Mapped[str] = mapped_column(
        String(253)
    )  # nvidia.com/gpu, nvidia.com/mig-1g.10gb
    raw_units: Mapped[int] = mapped_column(Integer)  # effective request of the pod
    # physical-GPU equivalent of all raw_units (time-slicing: units/replicas; MIG: units*N/7)
    physical_gpus: Mapped[float] = mapped_column(Float)
    # the physical share of one raw unit, exactly (1/7, 3/7, 1/4): physical_gpus is
    # raw_units * numerator / denominator, kept as a float for SQL sums (migration 0005)
    share_numerator: Mapped[int] = mapped_column(BigInteger, server_default=text("1"))
    share_denominator: Mapped[int] = mapped_column(BigInteger, server_default=text("1"))
    replicas: Mapped[int | None] = mapped_column(Integer, nullable=True)  # time-slicing/MPS
    sharing_strategy: Mapped[str | None] = mapped_column(String(63), nullable=True)
    # the MIG profile one unit is (1g.10gb), from the resource name or a single-strategy node's
    # product label, so a rate card can price a profile its own way (migration 0004)
    mig_profile: Mapped[str | None] = mapped_column(String(32), nullable=True)
    started_at: Mapped[int] = mapped_column(BigInteger)
    ended_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # terminated | deletion_timestamp | deleted | node_deleted | vanished (estimated)
    end_reason: Mapped[str | None] = mapped_column(String(32), nullable=True)
    estimated: Mapped[bool] = mapped_column(Boolean, default=False)
    # the pod's QoS class; BestEffort GPU pods escape NotBestEffort-scoped quotas
    qos_class: Mapped[str | None] = mapped_column(String(16), nullable=True)
    updated_at: Mapped[int] = mapped_column(BigInteger)


class NodeCapacity(Base):
    """A GPU node's allocatable GPUs over time, for idle GPU-hours: [started_at, ended_at)."""

    __tablename__ = "node_capacity"
    __table_args__ = (
        Index("ix_node_capacity_window", "cluster", "started_at", "ended_at"),
        Index("ix_node_capacity_node", "cluster", "node", "resource_name", "started_at"),
        UniqueConstraint(
            "cluster", "node", "resource_name", "started_at", name="uq_node_capacity_from"
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    cluster: Mapped[str] = mapped_column(String(253))
    node: Mapped[str] = mapped_column(String(253))
    node_pool: Mapped[str | None] = mapped_column(String(253), nullable=True)
    gpu_model: Mapped[str | None] = mapped_column(String(253), nullable=True)
    resource_name: Mapped[str] = mapped_column(String(253))
    allocatable_units: Mapped[int] = mapped_column(Integer)
    physical_gpus: Mapped[float] = mapped_column(Float)
    # the exact physical share of one allocatable unit (migration 0005)
    share_numerator: Mapped[int] = mapped_column(BigInteger, server_default=text("1"))
    share_denominator: Mapped[int] = mapped_column(BigInteger, server_default=text("1"))
    mig_profile: Mapped[str | None] = mapped_column(String(32), nullable=True)  # migration 0004
    labels: Mapped[dict[str, Any]] = mapped_column(JSON)  # nvidia.com/gpu.* labels at start
    started_at: Mapped[int] = mapped_column(BigInteger)
    ended_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class QuotaSample(Base):
    """A namespace quota's hard and used for one GPU resource, stored whenever either changes."""

    __tablename__ = "quota_samples"
    __table_args__ = (
        Index("ix_quota_samples_lookup", "cluster", "namespace", "resource_name", "observed_at"),
        UniqueConstraint(
            "cluster",
            "namespace",
            "quota_name",
            "resource_name",
            "observed_at",
            "seq",
            name="uq_quota_sample",
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    cluster: Mapped[str] = mapped_column(String(253))
    namespace: Mapped[str] = mapped_column(String(253))
    quota_name: Mapped[str] = mapped_column(String(253))
    resource_name: Mapped[str] = mapped_column(String(253))  # e.g. requests.nvidia.com/gpu
    hard: Mapped[float | None] = mapped_column(Float, nullable=True)
    used: Mapped[float | None] = mapped_column(Float, nullable=True)
    scopes: Mapped[list[str]] = mapped_column(JSON)
    observed_at: Mapped[int] = mapped_column(BigInteger)
    # the order among the samples of one second: every change is kept (migration 0007)
    seq: Mapped[int] = mapped_column(Integer, server_default=text("0"))


class ClaimAllocation(Base):
    """GPUs of one device class held by a DRA ResourceClaim, charged through one pod using it.

    Keyed by (cluster, claim_uid, pod_uid, resource_name), resource_name being the device
    class. ``[pod_started_at, pod_ended_at)`` is the pod's own billing interval;
    ``[started_at, ended_at)`` the piece of the claim's charged time (the union of its pods'
    intervals) this pod carries: pieces of one claim are disjoint and add up to the union
    (quota/dra.py charged_pieces), so rows add up like allocations. Migration 0006.
    """

    __tablename__ = "claim_allocations"
    __table_args__ = (
        UniqueConstraint(
            "cluster", "claim_uid", "pod_uid", "resource_name", name="uq_claim_allocation"
        ),
        Index("ix_claim_allocations_window", "cluster", "started_at", "ended_at"),
        Index("ix_claim_allocations_open", "cluster", "pod_ended_at"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    cluster: Mapped[str] = mapped_column(String(253))
    claim_uid: Mapped[str] = mapped_column(String(64))
    pod_uid: Mapped[str] = mapped_column(String(64))
    resource_name: Mapped[str] = mapped_column(String(253))  # the device class
    namespace: Mapped[str] = mapped_column(String(253))
    claim_name: Mapped[str] = mapped_column(String(253))
    pod_name: Mapped[str] = mapped_column(String(253))
    owner_kind: Mapped[str | None] = mapped_column(String(63), nullable=True)
    owner_name: Mapped[str | None] = mapped_column(String(253), nullable=True)
    node: Mapped[str | None] = mapped_column(String(253), nullable=True)
    node_pool: Mapped[str | None] = mapped_column(String(253), nullable=True)
    gpu_model: Mapped[str | None] = mapped_column(String(253), nullable=True)
    raw_units: Mapped[int] = mapped_column(Integer)  # allocated GPU devices of the class
    physical_gpus: Mapped[float] = mapped_column(Float)
    # the exact physical share of one device: physical_gpus = raw_units * numerator / denominator
    share_numerator: Mapped[int] = mapped_column(BigInteger)
    share_denominator: Mapped[int] = mapped_column(BigInteger)
    sharing_strategy: Mapped[str | None] = mapped_column(String(63), nullable=True)
    mig_profile: Mapped[str | None] = mapped_column(String(32), nullable=True)
    # a device shared through consumable capacity the driver declares no capacity for
    share_estimated: Mapped[bool] = mapped_column(Boolean, default=False)
    pod_started_at: Mapped[int] = mapped_column(BigInteger)
    pod_ended_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    started_at: Mapped[int] = mapped_column(BigInteger)
    ended_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    end_reason: Mapped[str | None] = mapped_column(String(32), nullable=True)
    estimated: Mapped[bool] = mapped_column(Boolean, default=False)
    updated_at: Mapped[int] = mapped_column(BigInteger)


class Gap(Base):
    """A span [started_at, ended_at) in which the controller could not follow one kind of a
    cluster (a 410 Gone followed by a relist; downtime its resumed watch could not replay):
    objects created and deleted inside it may be missing. Migration 0007."""

    __tablename__ = "gaps"
    __table_args__ = (
        UniqueConstraint("cluster", "kind", "started_at", name="uq_gap"),
        Index("ix_gaps_window", "cluster", "started_at", "ended_at"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    cluster: Mapped[str] = mapped_column(String(253))
    kind: Mapped[str] = mapped_column(String(63))
    started_at: Mapped[int] = mapped_column(BigInteger)
    ended_at: Mapped[int] = mapped_column(BigInteger)
    reason: Mapped[str] = mapped_column(String(32))  # gone | restart


class UsageDevice(Base):
    """One device of the usage ledger: its UUID (unique cluster-wide) and its labels, once per
    device instead of on each of its series. Migration 0010.

    ``node``, ``gpu_model`` and ``mig_profile``: the last non-null value seen in the node
    agents' samples (the GPU model, where the samples name none, from the allocation of a pod
    holding it). Reports of holders without allocation rows show them.
    """

    __tablename__ = "usage_devices"
    __table_args__ = (UniqueConstraint("cluster", "device_uuid", name="uq_usage_devices"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    cluster: Mapped[str] = mapped_column(String(253))
    device_uuid: Mapped[str] = mapped_column(String(64))  # GPU-<uuid>, MIG-<uuid>
    node: Mapped[str | None] = mapped_column(String(253), nullable=True)
    gpu_model: Mapped[str | None] = mapped_column(String(253), nullable=True)
    mig_profile: Mapped[str | None] = mapped_column(String(32), nullable=True)


class UsageSeries(Base):
    """One series of the usage ledger: what one holder used of one device. Migrations 0008,
    0010 (the device's columns moved to usage_devices).

    A holder is a pod (device plugin), a DRA ResourceClaim, or nobody ("unallocated": the
    device's energy while no one held it, the node's idle energy). Keyed by the device
    (``device_id``: usage_devices.id) and the holder's UID, unique cluster-wide; names are kept
    for reports of holders that have no allocation row. ``activity`` is what the node agent
    measured activity with (sm_active, utilization, process_sm): the last value seen.
    """

    __tablename__ = "usage_series"
    # the holder's UID leads the key after the cluster: it serves the look-ups by holder
    # (ingestion, idle allocations) too, with no index of its own
    __table_args__ = (
        UniqueConstraint(
            "cluster", "holder_uid", "holder_kind", "device_id", name="uq_usage_series"
        ),
    )

    # columns in this order: the two 8-byte integers first, so PostgreSQL pads nothing
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    device_id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"))
    cluster: Mapped[str] = mapped_column(String(253))
    holder_kind: Mapped[str] = mapped_column(String(16))  # pod | claim | unallocated
    holder_uid: Mapped[str] = mapped_column(String(64))  # "" for unallocated
    namespace: Mapped[str] = mapped_column(String(253))  # "" for unallocated
    holder_name: Mapped[str] = mapped_column(String(253))  # pod or claim name, "" unallocated
    activity: Mapped[str | None] = mapped_column(String(32), nullable=True)


class UsageWindow(Base):
    """What one ledger series used in one closed window [window_start, window_start +
    window_seconds). Migration 0008.

    ``used_gpu_seconds`` are physical GPU-seconds of activity (a MIG instance's activity times
    its share of the GPU); ``sampled_seconds`` the seconds of the window that had samples (the
    coverage numerator); ``end_used``/``end_energy`` the counters' values at the window's last
    sample, the baseline of the series' next window (counters reset when the agent restarts:
    a value below the baseline counts from zero, as Prometheus' increase() does).
    Re-ingesting a window replaces its rows: the ledger is idempotent.
    """

    __tablename__ = "usage_windows"
    # SQLite: the primary key's B-tree is the table (no rowid, no second copy of the key)
    __table_args__ = (Index("ix_usage_windows_start", "window_start"), {"sqlite_with_rowid": False})

    # columns in this order: PostgreSQL aligns each to its size, so this order pads nothing
    series_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    window_start: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    end_used: Mapped[float | None] = mapped_column(Float, nullable=True)
    end_energy: Mapped[float | None] = mapped_column(Float, nullable=True)
    window_seconds: Mapped[int] = mapped_column(Integer)
    # one window's figures in single precision (PostgreSQL REAL: 4 bytes; SQLite stores 8):
    # a relative rounding of at most 2**-24 (6e-8), e.g. 0.2 mJ of a GPU-hour at 700 W, under
    # any meter's accuracy; queries sum them in double precision (cast first), so a month's total
    # keeps that bound. The counters' end values stay double: they are large (a month of
    # joules) and the next window's increase is a difference from them.
    used_gpu_seconds: Mapped[float] = mapped_column(REAL)
    energy_joules: Mapped[float] = mapped_column(REAL)
    sampled_seconds: Mapped[float] = mapped_column(REAL)


class LedgerProgress(Base):
    """How far the usage ledger of one cluster is ingested: every window that ends at or
    before ``ingested_until`` has its rows (or had no samples). Migration 0008. Its rows
    before ``rolled_until`` are rolled up into day rows and final (migration 0009)."""

    __tablename__ = "ledger_progress"

    cluster: Mapped[str] = mapped_column(String(253), primary_key=True)
    window_seconds: Mapped[int] = mapped_column(Integer)
    ingested_until: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[int] = mapped_column(BigInteger)
    rolled_until: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class Heartbeat(Base):
    """The controller's durable heartbeat: the last time it knew the cluster's state."""

    __tablename__ = "heartbeats"

    cluster: Mapped[str] = mapped_column(String(253), primary_key=True)
    holder: Mapped[str] = mapped_column(String(253))
    at: Mapped[int] = mapped_column(BigInteger)
    resource_versions: Mapped[dict[str, Any]] = mapped_column(JSON)


class GpuBoard(Base):
    """One physical GPU of the fleet history, by its board serial (migration i29): the serial
    is the identity that survives a move to another node or slot, where the UUID-to-node
    pairing does not. ``first_seen``/``last_seen``: the first and last second it was observed
    (quota/fleet; docs/health.md)."""

    __tablename__ = "gpu_boards"
    __table_args__ = (UniqueConstraint("cluster", "serial", name="uq_gpu_boards"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    cluster: Mapped[str] = mapped_column(String(253))
    serial: Mapped[str] = mapped_column(String(64))
    first_seen: Mapped[int] = mapped_column(BigInteger)
    last_seen: Mapped[int] = mapped_column(BigInteger)


class GpuObservation(Base):
    """A stretch [started_at, ended_at) of one ingestion window in which a board was observed
    with the same attributes and health verdict (migration i29). Time no row covers is
    unknown, never healthy. Re-ingesting a window replaces its rows."""

    __tablename__ = "gpu_observations"
    __table_args__ = (
        Index("ix_gpu_observations_board", "board_id", "started_at"),
        Index("ix_gpu_observations_window", "cluster", "window_start"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    board_id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"))
    window_start: Mapped[int] = mapped_column(BigInteger)
    started_at: Mapped[int] = mapped_column(BigInteger)
    ended_at: Mapped[int] = mapped_column(BigInteger)
    cluster: Mapped[str] = mapped_column(String(253))
    uuid: Mapped[str] = mapped_column(String(64))
    node: Mapped[str] = mapped_column(String(253))
    pci_bus_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    model: Mapped[str | None] = mapped_column(String(253), nullable=True)
    driver_version: Mapped[str | None] = mapped_column(String(64), nullable=True)
    vbios_version: Mapped[str | None] = mapped_column(String(64), nullable=True)
    state: Mapped[str] = mapped_column(String(16))  # healthy | degraded | unhealthy | unknown
    lost: Mapped[bool] = mapped_column(Boolean)


class GpuEvent(Base):
    """One change in a board's history (migration i29): a health verdict (``verdict``), XIDs
    of one code (``xid``), a counter or flag of its memory (``counter``: ECC, remapped rows,
    retired pages, pending remap), lost/returned (``lost``), its placement or versions
    (``identity``), or a stretch it was not seen (``gap``). ``at`` is when it happened (a
    verdict's second from the agent), ``seen`` the sample that showed it; ``key`` names what
    changed (the latest event per key is the board's state). Re-ingesting a window replaces
    the events seen in it."""

    __tablename__ = "gpu_events"
    __table_args__ = (
        Index("ix_gpu_events_board", "board_id", "key", "seen"),
        Index("ix_gpu_events_seen", "cluster", "seen"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    board_id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"))
    at: Mapped[int] = mapped_column(BigInteger)
    seen: Mapped[int] = mapped_column(BigInteger)
    cluster: Mapped[str] = mapped_column(String(253))
    kind: Mapped[str] = mapped_column(String(16))
    key: Mapped[str] = mapped_column(String(128))
    detail: Mapped[dict[str, Any]] = mapped_column(JSON)


class GpuHistoryProgress(Base):
    """How far the fleet history of one cluster is ingested (migration i29): every window that
    ends at or before ``ingested_until`` has its rows (or had no samples)."""

    __tablename__ = "gpu_history_progress"

    cluster: Mapped[str] = mapped_column(String(253), primary_key=True)
    window_seconds: Mapped[int] = mapped_column(Integer)
    ingested_until: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[int] = mapped_column(BigInteger)


class RemediationAction(Base):
    """One act of the central pod remediation (migration 0012; quota/remediation): a pod
    evicted or marked for a fenced GPU, or refused, or the circuit breaker opening or closing.
    ``action``: evict | condition | breaker; ``result``: evicting (budget reserved, the call
    under way), evicted, dry_run, dry_run_blocked, dry_run_failed, blocked_by_pdb, refused,
    gone, failed, marked, cleared, open, closed. Evictions reserved, done or failed in the
    last window count against the fleet-wide budget, so it holds across restarts and
    replicas; a dry run's ``dry_run`` ones against a dry run's budget of its own."""

    __tablename__ = "remediation_actions"
    __table_args__ = (Index("ix_remediation_actions_at", "cluster", "action", "at"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    cluster: Mapped[str] = mapped_column(String(253))
    at: Mapped[int] = mapped_column(BigInteger)
    action: Mapped[str] = mapped_column(String(16))
    result: Mapped[str] = mapped_column(String(16))
    node: Mapped[str] = mapped_column(String(253))
    namespace: Mapped[str] = mapped_column(String(253))
    pod: Mapped[str] = mapped_column(String(253))
    pod_uid: Mapped[str] = mapped_column(String(64))
    devices: Mapped[list[str]] = mapped_column(JSON)  # the fenced GPU / MIG UUIDs
    message: Mapped[str] = mapped_column(Text)
