"""Physical and priced GPU-seconds of a grouped row: the one place either is computed.

Physical GPU-seconds (GPU-h phys, share, the idle table, spread idle, the ledger's efficiency,
the Prometheus columns) come from the store's exact per-unit share alone; a rate card prices
(``mig_fractions``: the share of a GPU-hour a MIG instance costs) and never enters them.
"""

from __future__ import annotations

from fractions import Fraction

from gpuquota.quota.report.allocations import UsageRow
from gpuquota.quota.report.capacity import CapacityRow
from gpuquota.quota.report.ratecard import RateCard

HOUR = 3600  # seconds in a GPU-hour


def physical_per_row(row: UsageRow | CapacityRow) -> Fraction:
    """Physical-GPU equivalent of the row's units, as the store recorded it (time-slicing
    units/replicas, MIG N/7 or the controller's configured share; migration 0005 keeps it
    exact): the one source of physical GPU-seconds of every table of a report (GPU-h phys,
    share, idle, the ledger's efficiency). A rate card never changes it (:func:`priced_per_row`)."""
    units = row.raw_units if isinstance(row, UsageRow) else row.allocatable_units
    return row.share * units


def priced_per_row(row: UsageRow, card: RateCard | None) -> Fraction:
    """GPUs the row's units are priced as: the physical equivalent, unless the rate card
    sets a fraction for the row's MIG profile (``mig_fractions``: a price, charged at the
    model's rate per GPU-hour; it moves cost columns only, never a measurement)."""
    override = card.mig_fraction(row.resource_name, row.mig_profile) if card is not None else None
    return physical_per_row(row) if override is None else override * row.raw_units
