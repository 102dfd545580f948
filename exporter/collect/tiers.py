"""How often the collector reads each DeviceSnapshot field from NVML: the cadence, in one table.

A field is read every round (fast), every ``--slow-interval`` (slow: counters, slowly
changing state and GPM's averages, where a reading costs milliseconds on an H100), or once
per device, again after it was lost, reset or re-identified (its identity). GPM is slow
because it is an average between two samples: sampled on the GPU's slow turn, each pair spans
one slow interval and the pairs follow each other, so the averages cover all the time, while
a round computes at most a few GPUs' pairs (5.2 ms of NVML each on an H100) instead of all. The metric table
(exporter/expose/metrics.py) shows each row's tier from this table in docs/metrics.md, so the
cadence is declared here, where the reads are, and nowhere else.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum


class Tier(Enum):
    """How often the NVML values behind a snapshot field are read."""

    FAST = "fast"  # every collection (--interval): cheap and quickly changing
    SLOW = "slow"  # every --slow-interval: counters, slowly changing state, GPM averages
    ONCE = "once"  # once per device, again after it was lost, reset or re-identified
    NONE = "none"  # not an NVML reading (exporter state, kubelet, events, health verdicts)


TIER_RANK = {Tier.FAST: 0, Tier.SLOW: 1, Tier.ONCE: 2, Tier.NONE: 3}

_F, _S, _O = Tier.FAST, Tier.SLOW, Tier.ONCE
# DeviceSnapshot field -> its tier.
FIELD_TIERS: dict[str, Tier] = {
    # identity: static while the driver runs
    "name": _O,
    "serial": _O,
    "pci_bus_id": _O,
    "vbios_version": _O,
    "compute_capability": _O,
    "mig_mode_enabled": _O,
    "mig": _O,
    "ecc_mode_enabled": _O,
    # every round: what moves from second to second
    "gpu_utilization_ratio": _F,
    "memory_utilization_ratio": _F,
    "encoder_utilization_ratio": _F,
    "decoder_utilization_ratio": _F,
    "memory_total_bytes": _F,
    "memory_used_bytes": _F,
    "memory_free_bytes": _F,
    "memory_reserved_bytes": _F,
    "gpu_temperature_celsius": _F,
    "memory_temperature_celsius": _F,
    "power_watts": _F,
    "fan_speed_ratio": _F,
    "sm_clock_hertz": _F,
    "memory_clock_hertz": _F,
    "performance_state": _F,
    "clock_event_reasons": _F,
    "pcie_tx_bytes_per_second": _F,
    "pcie_tx_bytes": _F,
    "pcie_rx_bytes_per_second": _F,
    "pcie_rx_bytes": _F,
    "recovery_action": _F,
    "process_utilization": _F,  # asked on the GPU's own turn, at most once a second
    # every --slow-interval: counters and slowly changing state
    "gpm": _S,  # a sample pair per slow turn: averages over the slow interval
    "power_limit_watts": _S,
    "energy_joules": _S,
    "clock_event_time_ns": _S,
    "pcie_replay_total": _S,
    "ecc_corrected_volatile": _S,
    "ecc_uncorrected_volatile": _S,
    "ecc_corrected_aggregate": _S,
    "ecc_uncorrected_aggregate": _S,
    "remapped_rows_correctable": _S,
    "remapped_rows_uncorrectable": _S,
    "remap_pending": _S,
    "remap_failure": _S,
    "retired_pages_single_bit": _S,
    "retired_pages_double_bit": _S,
    "retired_pages_pending": _S,
    "nvlinks": _S,
    "processes": _S,
}


def tier_of(fields: Iterable[str]) -> Tier:
    """The tier of these snapshot fields (the fastest of them); NONE for no field. KeyError
    names a field the collector does not read."""
    found = [FIELD_TIERS[name] for name in fields]
    return min(found, key=TIER_RANK.__getitem__) if found else Tier.NONE
