"""NVML's units -> the snapshot's base units, and rates from cumulative counters.

Pure functions: no NVML, no threads, no clock (the caller passes the times), so each rule is
tested on its own. NVML answers percentages, milliwatts, megahertz, millijoules and raw byte
counters; the snapshot holds ratios, watts, hertz, joules and bytes per second.
"""

from __future__ import annotations

from typing import Any

# (monotonic time, tx bytes, rx bytes): one reading of the PCIe byte counters.
CounterReading = tuple[float, float | None, float | None]


def as_int(value: float | None) -> int | None:
    return None if value is None else int(value)


def scale(value: float | None, factor: float) -> float | None:
    """``value * factor`` (NVML units -> base units); None stays None (not supported)."""
    return None if value is None else value * factor


def percent_pair(util: tuple[int, int] | None) -> tuple[float | None, float | None]:
    """nvmlDeviceGetUtilizationRates' (gpu %, memory %) as ratios."""
    return (None, None) if util is None else (util[0] / 100.0, util[1] / 100.0)


def memory_fields(info: Any) -> dict[str, Any]:
    """nvmlDeviceGetMemoryInfo's answer as the snapshot's memory fields (bytes)."""
    if info is None:
        return {}
    return {
        "memory_total_bytes": info.total,
        "memory_used_bytes": info.used,
        "memory_free_bytes": info.free,
        "memory_reserved_bytes": info.reserved,
    }


def counter_rates(previous: CounterReading | None, now: CounterReading) -> dict[str, float | None]:
    """PCIe bytes/s between two readings of the cumulative counters (fields 197/198).

    No rate without an earlier reading, when time did not move, or when a counter went back
    (NVML says it may wrap; a reset does the same): a wrong rate is worse than none."""
    keys = ("pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second")
    if previous is None or now[0] <= previous[0]:
        return dict.fromkeys(keys)
    span = now[0] - previous[0]
    out: dict[str, float | None] = {}
    for key, now_value, then_value in zip(keys, now[1:], previous[1:], strict=True):
        ok = now_value is not None and then_value is not None and now_value >= then_value
        out[key] = (now_value - then_value) / span if ok else None  # type: ignore[operator]
    return out
