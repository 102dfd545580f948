"""Hand-made snapshots for the health and device plugin tests (test data, not mocks)."""

from __future__ import annotations

from typing import Any

from gpuquota.exporter.snapshot import DeviceSnapshot, MigInfo, NodeSnapshot


def gpu(index: int, **values: Any) -> DeviceSnapshot:
    values.setdefault("minor_number", index)
    return DeviceSnapshot(index=index, uuid=f"GPU-{index:08d}", **values)


def mig(
    parent: int, gi: int, ci: int = 0, profile: str = "1g.10gb", **values: Any
) -> DeviceSnapshot:
    return DeviceSnapshot(
        index=gi,
        uuid=f"MIG-{parent:02d}-{gi:02d}-{ci:02d}",
        mig=MigInfo(f"GPU-{parent:08d}", parent, gi, ci, profile),
        **values,
    )


def node(*devices: DeviceSnapshot, ok: bool = True, at: float = 0.0) -> NodeSnapshot:
    return NodeSnapshot(
        hostname="node-a",
        driver_version="550.0",
        nvml_version="12.550",
        cuda_driver_version=12040,
        devices=tuple(devices),
        collected_at=at,
        collection_seconds=0.01,
        ok=ok,
    )


def gpus(count: int, **values: Any) -> tuple[DeviceSnapshot, ...]:
    return tuple(gpu(i, **values) for i in range(count))
