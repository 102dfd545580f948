"""`gpuquota report --format focus`: the report as a FinOps FOCUS 1.0 cost and usage CSV.

One row per charge period (a calendar day in the report's zone, clipped to the period) and
namespace and charge: the allocated physical GPU-hours priced by the rate card (``GPU-Hours``),
and, where the usage ledger has the namespace's energy and the rate card prices energy, its
energy (``kWh``), as a separate charge. Every column FOCUS 1.0 requires is present (nullable
ones empty where this product has no such notion: commitments, regions, SKUs); the FinOps
Foundation's own validator (PyPI focus-validator 1.0.0) checks the output in the tests.
Periods with nothing to charge give no row. Pure: rendering only, from a computed report.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime
from fractions import Fraction

from gpuquota.quota.report.compute import HOUR, KWH, Report
from gpuquota.quota.report.period import Period

# the columns focus-validator 1.0.0 requires for FOCUS 1.0 (its *_Required rules) and
# ChargeFrequency (not null there), in the specification's alphabetical order
COLUMNS = (
    "BilledCost",
    "BillingAccountId",
    "BillingAccountName",
    "BillingCurrency",
    "BillingPeriodEnd",
    "BillingPeriodStart",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargeFrequency",
    "ChargePeriodEnd",
    "ChargePeriodStart",
    "CommitmentDiscountCategory",
    "CommitmentDiscountId",
    "CommitmentDiscountName",
    "CommitmentDiscountStatus",
    "CommitmentDiscountType",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ContractedCost",
    "ContractedUnitPrice",
    "EffectiveCost",
    "InvoiceIssuer",
    "ListCost",
    "ListUnitPrice",
    "PricingCategory",
    "PricingQuantity",
    "PricingUnit",
    "Provider",
    "Publisher",
    "RegionId",
    "RegionName",
    "ResourceId",
    # focus-validator 1.0.0 requires the column as ResourceID (the specification's text
    # spells it ResourceId): both carry the same value, so either reader finds it
    "ResourceID",
    "ResourceName",
    "ResourceType",
    "ServiceCategory",
    "ServiceName",
    "SkuId",
    "SkuPriceId",
    "SubAccountId",
    "SubAccountName",
    "Tags",
)
PROVIDER = "gpuquota"
GPU_UNIT = "GPU-Hours"
ENERGY_UNIT = "kWh"
DECIMALS = 6


def _time(t: int) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _decimal(value: Fraction) -> str:
    scaled = round(value * 10**DECIMALS)
    sign = "-" if scaled < 0 else ""
    whole, frac = divmod(abs(scaled), 10**DECIMALS)
    return f"{sign}{whole}.{frac:0{DECIMALS}d}"


def render_focus(report: Report, period: Period, account: str | None = None) -> str:
    """FOCUS 1.0 rows per day, namespace and charge (GPU-hours, energy). The report must be
    grouped by namespace alone, priced, and computed with day buckets (cli.py sees to it)."""
    if report.keys != ("namespace",) or report.currency is None:
        raise ValueError("a FOCUS export needs a priced report grouped by namespace")
    edges = report.bucket_edges
    account = account or PROVIDER
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    base = {
        "BillingAccountId": account,
        "BillingAccountName": account,
        "BillingCurrency": report.currency,
        "BillingPeriodStart": _time(period.start),
        "BillingPeriodEnd": _time(period.end),
        "ChargeCategory": "Usage",
        "ChargeFrequency": "Usage-Based",
        "InvoiceIssuer": PROVIDER,
        "PricingCategory": "Standard",
        "Provider": PROVIDER,
        "Publisher": PROVIDER,
        "ServiceCategory": "Compute",
    }
    for b in range(len(edges) - 1):
        lo, hi = edges[b], min(edges[b + 1], report.window_end or edges[b + 1])
        if hi <= lo:
            continue
        for g in sorted(report.groups, key=lambda g: g.keys[0] or ""):
            namespace = g.keys[0] or "(none)"
            charges: list[tuple[str, str, Fraction, Fraction, str]] = []
            gpu_hours = g.series[b] / HOUR if g.series else Fraction(0)
            if gpu_hours:
                cost = g.bucket_cost[b] if g.bucket_cost else Fraction(0)
                charges.append(("gpu", GPU_UNIT, gpu_hours, cost, "Allocated physical GPU-hours"))
            if report.energy_priced and g.bucket_energy and g.bucket_energy[b]:
                charges.append(
                    (
                        "energy",
                        ENERGY_UNIT,
                        g.bucket_energy[b] / KWH,
                        g.bucket_energy_cost[b],
                        "GPU energy (usage ledger)",
                    )
                )
            for kind, unit, quantity, cost, what in charges:
                writer.writerow(
                    {
                        **base,
                        "BilledCost": _decimal(cost),
                        "ChargeDescription": f"{what} of namespace {namespace}",
                        "ChargePeriodStart": _time(lo),
                        "ChargePeriodEnd": _time(hi),
                        "ConsumedQuantity": _decimal(quantity),
                        "ConsumedUnit": unit,
                        "ContractedCost": _decimal(cost),
                        "EffectiveCost": _decimal(cost),
                        "ListCost": _decimal(cost),
                        "PricingQuantity": _decimal(quantity),
                        "PricingUnit": unit,
                        "ResourceId": f"namespace/{namespace}/{kind}",
                        "ResourceID": f"namespace/{namespace}/{kind}",
                        "ResourceName": namespace,
                        "ResourceType": "GPU" if kind == "gpu" else "GPU energy",
                        "ServiceName": "GPU compute" if kind == "gpu" else "GPU energy",
                        "SubAccountId": namespace,
                        "SubAccountName": namespace,
                        "Tags": json.dumps({"namespace": namespace}, sort_keys=True),
                    }
                )
    return buf.getvalue()
