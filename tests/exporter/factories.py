"""Hand-made snapshots for the pure tests (metric table, renderer, docs)."""

from __future__ import annotations

from gpuquota.exporter.snapshot import (
    DeviceSnapshot,
    DeviceState,
    MigInfo,
    NodeSnapshot,
    NvLinkCounters,
    PodRef,
    ProcessUsage,
)

GIB = 1024**3


def gpu(index: int = 0, **overrides: object) -> DeviceSnapshot:
    values: dict[str, object] = dict(
        index=index,
        uuid=f"GPU-{index:08d}-aaaa-bbbb-cccc-000000000000",
        name="NVIDIA H100 80GB HBM3",
        pci_bus_id=f"00000000:{0x18 + index:02X}:00.0",
        minor_number=index,
        serial=f"16520230{index:05d}",
        vbios_version="96.00.89.00.01",
        compute_capability="9.0",
        mig_mode_enabled=False,
        gpu_utilization_ratio=0.75,
        memory_utilization_ratio=0.25,
        encoder_utilization_ratio=0.0,
        decoder_utilization_ratio=0.05,
        memory_total_bytes=80 * GIB,
        memory_used_bytes=20 * GIB,
        memory_free_bytes=59 * GIB,
        memory_reserved_bytes=1 * GIB,
        gpu_temperature_celsius=45.0,
        memory_temperature_celsius=50.0,
        power_watts=312.5,
        power_limit_watts=700.0,
        energy_joules=123456.789,
        sm_clock_hertz=1980e6,
        memory_clock_hertz=2619e6,
        pcie_tx_bytes_per_second=1024.0 * 500,
        pcie_rx_bytes_per_second=1024.0 * 700,
        pcie_replay_total=3,
        fan_speed_ratio=None,
        performance_state=0,
        clock_event_reasons=0x4 | 0x40,
        ecc_mode_enabled=True,
        ecc_corrected_volatile=5,
        ecc_uncorrected_volatile=0,
        ecc_corrected_aggregate=7,
        ecc_uncorrected_aggregate=1,
        remapped_rows_correctable=2,
        remapped_rows_uncorrectable=0,
        remap_pending=False,
        remap_failure=False,
        retired_pages_single_bit=None,
        retired_pages_double_bit=None,
        retired_pages_pending=None,
        nvlinks=(NvLinkCounters(0, 1, 0, 2, 0), NvLinkCounters(1, 0, 0, 0, 0)),
        processes=(ProcessUsage(4242, 8 * GIB, "compute"),),
    )
    values.update(overrides)
    return DeviceSnapshot(**values)  # type: ignore[arg-type]


def mig(parent: DeviceSnapshot, slot: int, gi: int, profile: str = "1g.5gb") -> DeviceSnapshot:
    return DeviceSnapshot(
        index=slot,
        uuid=f"MIG-{parent.index:04d}{slot:04d}-0000-0000-0000-000000000000",
        mig=MigInfo(parent.uuid, parent.index, gi, 0, profile),
        memory_total_bytes=5 * GIB,
        memory_used_bytes=1 * GIB,
        memory_free_bytes=4 * GIB,
    )


def node(*devices: DeviceSnapshot, **overrides: object) -> NodeSnapshot:
    values: dict[str, object] = dict(
        hostname="node-a",
        driver_version="550.54.15",
        nvml_version="12.550.54.15",
        cuda_driver_version=12040,
        devices=devices or (gpu(0), gpu(1)),
        collected_at=1_700_000_000.0,
        collection_seconds=0.004,
        collections_total=10,
        last_success_at=1_700_000_000.0,
        started_at=1_699_990_000.0,
    )
    values.update(overrides)
    return NodeSnapshot(**values)  # type: ignore[arg-type]


__all__ = ["DeviceState", "PodRef", "gpu", "mig", "node"]
