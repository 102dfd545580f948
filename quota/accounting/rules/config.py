"""What counts as a GPU and how partitions convert to physical GPUs: the rules' one config."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction

DEFAULT_GPU_RESOURCES: tuple[str, ...] = ("nvidia.com/gpu", "nvidia.com/gpu.shared", "amd.com/gpu")
DEFAULT_GPU_PREFIXES: tuple[str, ...] = ("nvidia.com/mig-",)
# Labels that name a node's pool on the common managed Kubernetes offerings, first match wins.
DEFAULT_NODE_POOL_LABELS: tuple[str, ...] = (
    "cloud.google.com/gke-nodepool",
    "eks.amazonaws.com/nodegroup",
    "karpenter.sh/nodepool",
    "kubernetes.azure.com/agentpool",
    "agentpool",
    "node.kubernetes.io/pool",
)
# Compute slices of one GPU that support MIG (A100, H100, H200, B200 all have 7).
DEFAULT_MIG_SLICES = 7


@dataclass(frozen=True)
class AccountingConfig:
    """What counts as a GPU and how partitions convert to physical GPUs."""

    gpu_resources: tuple[str, ...] = DEFAULT_GPU_RESOURCES
    gpu_resource_prefixes: tuple[str, ...] = DEFAULT_GPU_PREFIXES
    node_pool_labels: tuple[str, ...] = DEFAULT_NODE_POOL_LABELS
    mig_slices: int = DEFAULT_MIG_SLICES
    # per-profile override of the physical share of one MIG instance, e.g. {"1g.10gb": 0.125};
    # read through gpuquota.quota.accounting.rules.shares.mig_override, the override's one home
    mig_profile_share: Mapping[str, Fraction | float | int] = field(default_factory=dict)

    def is_gpu(self, resource_name: str) -> bool:
        return resource_name in self.gpu_resources or any(
            resource_name.startswith(p) for p in self.gpu_resource_prefixes
        )


DEFAULT_CONFIG = AccountingConfig()
