"""GPU accounting: the pure rules, and the Accountant that applies them to watch events.

Layout (watch -> **account** -> store -> report):

- ``rules/``: pure functions of Kubernetes objects (docs/accounting.md): parse, config, pods,
  nodes, quotas, shares (exact physical-GPU shares; the MIG override's one home), ends (end
  evidence, billing end and the one end-reason precedence the store's SQL merge follows).
- ``rows``: the plain row types a flush writes, the Batch, and the RowStore interface; no SQL.
- ``pending``: PendingWrites, the buffer of finished rows kept until a write succeeds.
- ``trackers/``: one tracker per Kubernetes kind (nodes, pods, namespaces, resourcequotas;
  DRA resourceclaims, resourceslices and deviceclasses over one claim state in
  ``trackers/claims.py``), each owning that kind's state and rows.
- ``accountant``: the Accountant, which dispatches events by kind, keeps resourceVersions and
  the heartbeat, and flushes.

Nothing in this package imports SQL, Kubernetes client or I/O modules
(tests/common/test_import_graph.py checks it).

Adding a kind (the seam DRA ResourceClaims plugged into): write a class in ``trackers/`` that
satisfies :class:`gpuquota.quota.accounting.trackers.base.Tracker`:

- ``kind``: the Kubernetes kind it accounts ("ResourceClaim");
- ``load(state)``: take back its open intervals from the StoredState on restart;
- ``apply(obj, deleted, observed_at)``: read the object through a pure rule in ``rules/``
  (a new ``rules/claims.py``; raise AccountingError for a bad object, changing nothing);
- ``identity(obj)`` and ``vanish(listed, heartbeat)``: close what a relist no longer names;
- ``collect(batch)``, ``written(batch)``, ``count()``: its rows for the next flush.

Finished rows go to the shared ``TrackerContext.pending`` (PendingWrites) under their natural
key; rows derived from state that can still change are built in ``collect``. A tracker whose
objects live on nodes appends itself to ``NodeTracker.listeners`` (NodeListener:
``node_deleted`` / ``node_vanished`` / ``node_known``) and reads node facts and exact shares
with ``NodeTracker.gpus`` and ``rules.shares.physical_share``. A claim tracker that needs the
pods holding a claim takes the PodTracker in its constructor, as PodTracker takes the
NodeTracker. Register it in ``Accountant.__init__`` (``self.trackers``) and in ``KINDS``; a
new table needs its row type in ``rows``, a list in ``Batch`` and ``StoredState``, and the
store's upsert and load. The controller loop needs only the kind in ``Kube.KINDS``; replay
takes every kind in ``KINDS``.

The names below are the rules' public API, importable as ``gpuquota.quota.accounting.<name>``.
"""

from gpuquota.quota.accounting.rules.config import (
    DEFAULT_CONFIG,
    DEFAULT_GPU_PREFIXES,
    DEFAULT_GPU_RESOURCES,
    DEFAULT_MIG_SLICES,
    DEFAULT_NODE_POOL_LABELS,
    AccountingConfig,
)
from gpuquota.quota.accounting.rules.ends import (
    END_DELETED,
    END_DELETION_TIMESTAMP,
    END_NODE_DELETED,
    END_REASON_PRECEDENCE,
    END_TERMINATED,
    END_VANISHED,
    BillingEnd,
    EndEvidence,
    StoredEnd,
    billing_end,
    end_wins,
    observed_evidence,
    reason_rank,
)
from gpuquota.quota.accounting.rules.nodes import (
    LABEL_COUNT,
    LABEL_MIG_STRATEGY,
    LABEL_PRODUCT,
    LABEL_REPLICAS,
    LABEL_SHARING,
    RECORDED_NODE_LABELS,
    NodeGpus,
    node_gpus,
)
from gpuquota.quota.accounting.rules.parse import (
    CLOCK_SKEW,
    AccountingError,
    format_time,
    last_written,
    latest_timestamp,
    parse_quantity,
    parse_time,
    timestamps,
    unseen_time,
    without_unseen_times,
)
from gpuquota.quota.accounting.rules.pods import (
    TERMINAL_PHASES,
    PodFacts,
    PodRequest,
    effective_units,
    in_quota_view,
    pod_facts,
    pod_request,
    qos_class,
)
from gpuquota.quota.accounting.rules.quotas import (
    QuotaFacts,
    QuotaFigure,
    namespace_labels,
    quota_facts,
    quota_gpu_resource,
)
from gpuquota.quota.accounting.rules.shares import (
    PhysicalShare,
    mig_override,
    mig_share,
    physical_gpus,
    physical_share,
)

__all__ = [
    "CLOCK_SKEW",
    "DEFAULT_CONFIG",
    "DEFAULT_GPU_PREFIXES",
    "DEFAULT_GPU_RESOURCES",
    "DEFAULT_MIG_SLICES",
    "DEFAULT_NODE_POOL_LABELS",
    "END_DELETED",
    "END_DELETION_TIMESTAMP",
    "END_NODE_DELETED",
    "END_REASON_PRECEDENCE",
    "END_TERMINATED",
    "END_VANISHED",
    "LABEL_COUNT",
    "LABEL_MIG_STRATEGY",
    "LABEL_PRODUCT",
    "LABEL_REPLICAS",
    "LABEL_SHARING",
    "RECORDED_NODE_LABELS",
    "TERMINAL_PHASES",
    "AccountingConfig",
    "AccountingError",
    "BillingEnd",
    "EndEvidence",
    "NodeGpus",
    "PhysicalShare",
    "PodFacts",
    "PodRequest",
    "QuotaFacts",
    "QuotaFigure",
    "StoredEnd",
    "billing_end",
    "effective_units",
    "end_wins",
    "format_time",
    "in_quota_view",
    "last_written",
    "latest_timestamp",
    "mig_override",
    "mig_share",
    "namespace_labels",
    "node_gpus",
    "observed_evidence",
    "parse_quantity",
    "parse_time",
    "physical_gpus",
    "physical_share",
    "pod_facts",
    "pod_request",
    "qos_class",
    "quota_facts",
    "quota_gpu_resource",
    "reason_rank",
    "timestamps",
    "unseen_time",
    "without_unseen_times",
]
