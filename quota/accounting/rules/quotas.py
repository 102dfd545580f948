"""Namespace and ResourceQuota rules: labels over time, and the GPU lines of a quota."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuquota.quota.accounting.rules.config import DEFAULT_CONFIG, AccountingConfig
from gpuquota.quota.accounting.rules.parse import (
    mapping,
    parse_quantity,
    parse_time,
    sequence,
    string,
)


def namespace_labels(
    namespace: Mapping[str, Any],
) -> tuple[str, dict[str, str], int | None, int | None]:
    """(name, labels, creationTimestamp, deletionTimestamp) of a Namespace object."""
    meta = mapping(namespace.get("metadata"), "metadata")
    name = string(meta.get("name"), "metadata.name", required=True)
    assert name is not None
    labels = {str(k): str(v) for k, v in mapping(meta.get("labels"), "metadata.labels").items()}
    return (
        name,
        labels,
        parse_time(meta.get("creationTimestamp"), "metadata.creationTimestamp"),
        parse_time(meta.get("deletionTimestamp"), "metadata.deletionTimestamp"),
    )


@dataclass(frozen=True)
class QuotaFigure:
    """One GPU line of a ResourceQuota: hard and used (None where absent)."""

    resource_name: str  # as in the quota, e.g. requests.nvidia.com/gpu
    hard: float | None
    used: float | None


@dataclass(frozen=True)
class QuotaFacts:
    namespace: str
    name: str
    scopes: tuple[str, ...]
    figures: tuple[QuotaFigure, ...]


# DRA: ResourceQuota limits a device class's devices with this key (docs/accounting.md)
DEVICE_CLASS_QUOTA_SUFFIX = ".deviceclass.resource.k8s.io/devices"
# the device classes whose ResourceQuota lines are stored with the GPU quota history
DEFAULT_GPU_DEVICE_CLASSES: tuple[str, ...] = ("gpu.nvidia.com", "mig.nvidia.com")


def device_class_quota(key: str, classes: Sequence[str] = DEFAULT_GPU_DEVICE_CLASSES) -> str | None:
    """The device class a ResourceQuota key ``<class>.deviceclass.resource.k8s.io/devices``
    (optionally ``requests.``-prefixed) counts, when it is a GPU class; else None."""
    name = key[len("requests.") :] if key.startswith("requests.") else key
    if not name.endswith(DEVICE_CLASS_QUOTA_SUFFIX):
        return None
    device_class = name[: -len(DEVICE_CLASS_QUOTA_SUFFIX)]
    return device_class if device_class in classes else None


def quota_gpu_resource(key: str, config: AccountingConfig = DEFAULT_CONFIG) -> bool:
    """Whether a ResourceQuota key (requests.nvidia.com/gpu, limits.amd.com/gpu, ...) is a GPU:
    DRA device-class lines (gpu.nvidia.com.deviceclass.resource.k8s.io/devices) included."""
    if device_class_quota(key) is not None:
        return True
    for prefix in ("requests.", "limits."):
        if key.startswith(prefix):
            return config.is_gpu(key[len(prefix) :])
    return config.is_gpu(key)


def quota_facts(quota: Mapping[str, Any], config: AccountingConfig = DEFAULT_CONFIG) -> QuotaFacts:
    meta = mapping(quota.get("metadata"), "metadata")
    spec = mapping(quota.get("spec"), "spec")
    status = mapping(quota.get("status"), "status")
    name = string(meta.get("name"), "metadata.name", required=True)
    assert name is not None
    namespace = string(meta.get("namespace"), "metadata.namespace") or "default"
    scopes = [str(s) for s in sequence(spec.get("scopes"), "spec.scopes")]
    selector = mapping(spec.get("scopeSelector"), "spec.scopeSelector")
    for expr in sequence(selector.get("matchExpressions"), "spec.scopeSelector.matchExpressions"):
        expr = mapping(expr, "spec.scopeSelector.matchExpressions[]")
        values = ",".join(str(v) for v in sequence(expr.get("values"), "values"))
        scopes.append(f"{expr.get('scopeName')} {expr.get('operator')} {values}".rstrip())
    # status.hard is what the quota controller enforces; spec.hard until it has caught up
    hard = mapping(status.get("hard"), "status.hard") or mapping(spec.get("hard"), "spec.hard")
    used = mapping(status.get("used"), "status.used")
    figures = []
    for key in sorted({*hard, *used}):
        if not quota_gpu_resource(key, config):
            continue
        figures.append(
            QuotaFigure(
                resource_name=key,
                hard=float(parse_quantity(hard[key], f"hard[{key!r}]")) if key in hard else None,
                used=float(parse_quantity(used[key], f"used[{key!r}]")) if key in used else None,
            )
        )
    return QuotaFacts(namespace=namespace, name=name, scopes=tuple(scopes), figures=tuple(figures))
