"""Node rules: a node's GPU facts as recorded when an interval starts (GPU feature discovery)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuquota.quota.accounting.rules.config import DEFAULT_CONFIG, AccountingConfig
from gpuquota.quota.accounting.rules.parse import (
    AccountingError,
    int_label,
    mapping,
    parse_time,
    string,
    units_of,
)

# The node labels recorded with an interval (GPU feature discovery's names).
LABEL_PRODUCT = "nvidia.com/gpu.product"
LABEL_COUNT = "nvidia.com/gpu.count"
LABEL_REPLICAS = "nvidia.com/gpu.replicas"
LABEL_SHARING = "nvidia.com/gpu.sharing-strategy"
LABEL_MIG_STRATEGY = "nvidia.com/mig.strategy"
RECORDED_NODE_LABELS = (
    LABEL_PRODUCT,
    LABEL_COUNT,
    LABEL_REPLICAS,
    LABEL_SHARING,
    LABEL_MIG_STRATEGY,
)

_MIG_PRODUCT = re.compile(r"^(?P<model>.+)-MIG-(?P<profile>\d+g\.\d+gb(?:\+\S*)?)$")


@dataclass(frozen=True)
class NodeGpus:
    """A node's GPU facts as recorded when an interval starts."""

    name: str
    node_pool: str | None
    gpu_model: str | None  # nvidia.com/gpu.product without -SHARED / -MIG-<profile>
    gpu_count: int | None
    replicas: int | None
    sharing_strategy: str | None
    mig_strategy: str | None
    mig_profile: str | None  # single-strategy MIG: the profile every nvidia.com/gpu is
    capacity: Mapping[str, int]
    allocatable: Mapping[str, int]
    labels: Mapping[str, str]  # the recorded labels, as served
    created_at: int | None
    deletion_at: int | None

    def replica_count(self) -> int | None:
        """Replicas each physical GPU is shared into (time-slicing or MPS), if shared."""
        if self.sharing_strategy in (None, "", "none") and self.replicas is None:
            return None
        if self.replicas is not None and self.replicas > 1:
            return self.replicas
        return None


def node_gpus(node: Mapping[str, Any], config: AccountingConfig = DEFAULT_CONFIG) -> NodeGpus:
    if not isinstance(node, Mapping):
        raise AccountingError("node: expected an object")
    meta = mapping(node.get("metadata"), "metadata")
    status = mapping(node.get("status"), "status")
    name = string(meta.get("name"), "metadata.name", required=True)
    assert name is not None
    labels = {str(k): str(v) for k, v in mapping(meta.get("labels"), "metadata.labels").items()}
    capacity = {
        k: units_of(v, f"status.capacity[{k!r}]")
        for k, v in mapping(status.get("capacity"), "status.capacity").items()
        if config.is_gpu(k)
    }
    allocatable = {
        k: units_of(v, f"status.allocatable[{k!r}]")
        for k, v in mapping(status.get("allocatable"), "status.allocatable").items()
        if config.is_gpu(k)
    }
    product = labels.get(LABEL_PRODUCT)
    model: str | None = product
    mig_profile: str | None = None
    if model is not None:
        if model.endswith("-SHARED"):
            model = model[: -len("-SHARED")]
        match = _MIG_PRODUCT.match(model)
        if match is not None:
            model, mig_profile = match.group("model"), match.group("profile")
    sharing = labels.get(LABEL_SHARING)
    replicas = int_label(labels, LABEL_REPLICAS)
    count = int_label(labels, LABEL_COUNT)
    if replicas is None and product is not None and product.endswith("-SHARED") and count:
        # older GPU feature discovery marks shared GPUs only by the product suffix
        shared_capacity = capacity.get("nvidia.com/gpu") or capacity.get("nvidia.com/gpu.shared")
        if shared_capacity and shared_capacity > count:
            replicas = shared_capacity // count
    pool = next((labels[k] for k in config.node_pool_labels if labels.get(k)), None)
    return NodeGpus(
        name=name,
        node_pool=pool,
        gpu_model=model or None,
        gpu_count=count,
        replicas=replicas,
        sharing_strategy=sharing,
        mig_strategy=labels.get(LABEL_MIG_STRATEGY),
        mig_profile=mig_profile,
        capacity=capacity,
        allocatable=allocatable,
        labels={k: labels[k] for k in RECORDED_NODE_LABELS if k in labels},
        created_at=parse_time(meta.get("creationTimestamp"), "metadata.creationTimestamp"),
        deletion_at=parse_time(meta.get("deletionTimestamp"), "metadata.deletionTimestamp"),
    )
