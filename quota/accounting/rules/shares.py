"""Physical-GPU equivalents: how many physical GPUs one unit of a resource is on a node.

Shares are exact :class:`~fractions.Fraction`s (1/7, 3/7, 1/4, 2): the store keeps the
numerator and denominator of the per-unit share, so nothing is recovered from a float later.
The per-profile MIG override (the controller's configuration, or a rate card's
``mig_fractions``) is read in one place, :func:`mig_override`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

from gpuquota.quota.accounting.rules.config import DEFAULT_CONFIG, AccountingConfig
from gpuquota.quota.accounting.rules.nodes import NodeGpus

MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
_MIG_PROFILE = re.compile(r"^(\d+)g\.(\d+)gb(?:\+.*)?$")
WHOLE = Fraction(1)


def mig_override(
    resource_name: str,
    mig_profile: str | None,
    overrides: Mapping[str, Fraction | float | int],
) -> Fraction | None:
    """The overridden share of one MIG instance, or None: the profile comes from the resource
    name (mixed strategy: nvidia.com/mig-1g.10gb) or, on a single-strategy node, from its
    recorded profile. The one home of the MIG-share override."""
    if resource_name.startswith(MIG_RESOURCE_PREFIX):
        mig_profile = resource_name[len(MIG_RESOURCE_PREFIX) :]
    if mig_profile is None or mig_profile not in overrides:
        return None
    value = overrides[mig_profile]
    # a float from a configuration file (0.125) is the decimal the user wrote
    return value if isinstance(value, Fraction) else Fraction(str(value))


def mig_share(profile: str, config: AccountingConfig = DEFAULT_CONFIG) -> Fraction | None:
    """Physical share of one GPU that one MIG instance of ``profile`` ("3g.40gb") is:
    N compute slices of the GPU's 7, unless the configuration overrides the profile."""
    override = mig_override(MIG_RESOURCE_PREFIX + profile, profile, config.mig_profile_share)
    if override is not None:
        return override
    match = _MIG_PROFILE.match(profile)
    if match is None:
        return None
    return min(WHOLE, Fraction(int(match.group(1)), config.mig_slices))


@dataclass(frozen=True)
class PhysicalShare:
    """How raw units of one resource on one node convert to physical GPUs."""

    per_unit: Fraction
    replicas: int | None
    sharing_strategy: str | None
    mig_profile: str | None = None


def physical_share(
    resource_name: str, node: NodeGpus | None, config: AccountingConfig = DEFAULT_CONFIG
) -> PhysicalShare:
    """Physical GPUs one unit of ``resource_name`` is worth on ``node``.

    nvidia.com/mig-<N>g.<M>gb: N/7 (overridable per profile); a single-strategy MIG node's
    nvidia.com/gpu: the share of its profile; a time-sliced or MPS replica: 1/replicas;
    anything else one whole GPU. Without node facts a unit counts as one GPU.
    """
    if resource_name.startswith(MIG_RESOURCE_PREFIX):
        profile = resource_name[len(MIG_RESOURCE_PREFIX) :]
        share = mig_share(profile, config)
        return PhysicalShare(
            per_unit=share if share is not None else WHOLE,
            replicas=None,
            sharing_strategy="mig",
            mig_profile=profile,
        )
    if node is None:
        return PhysicalShare(per_unit=WHOLE, replicas=None, sharing_strategy=None)
    if resource_name.startswith("nvidia.com/gpu") and node.mig_profile is not None:
        share = mig_share(node.mig_profile, config)
        return PhysicalShare(
            per_unit=share if share is not None else WHOLE,
            replicas=None,
            sharing_strategy="mig",
            mig_profile=node.mig_profile,
        )
    replicas = node.replica_count()
    if resource_name.startswith("nvidia.com/gpu") and replicas is not None:
        strategy = node.sharing_strategy or "time-slicing"
        return PhysicalShare(
            per_unit=Fraction(1, replicas), replicas=replicas, sharing_strategy=strategy
        )
    return PhysicalShare(per_unit=WHOLE, replicas=None, sharing_strategy=node.sharing_strategy)


def physical_gpus(
    resource_name: str, units: int, node: NodeGpus | None, config: AccountingConfig = DEFAULT_CONFIG
) -> Fraction:
    """Physical GPUs ``units`` of ``resource_name`` are on ``node``, exactly."""
    return units * physical_share(resource_name, node, config).per_unit
