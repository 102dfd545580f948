"""`gpuquota report --format focus`: the report as a FinOps FOCUS 1.2 cost and usage CSV.

One row per SKU and charge period, so that every row has one real unit price:

- allocated GPU-hours: per namespace, GPU model and resource (a MIG profile's resource is its
  own SKU) and charge period (a calendar day in the report's zone, split where the rate card's
  price changes), priced per physical GPU-hour at the model's rate in force;
- GPU energy (kWh, from the usage ledger, where the rate card prices energy): per namespace and
  charge period, at the energy price in force;
- used GPU-hours (the ledger's measured activity of those allocations), per namespace and SKU
  over the covered period: a usage row priced at 0, because the allocation is what is billed;
  it says how much of the billed GPU-hours did work;
- idle GPU-hours, with ``--spread-idle``: each namespace's share of each GPU model's idle
  capacity over the covered period, priced at the idle cost the report computes.

Every FOCUS 1.2 column is present (nullable ones empty where this product has no such notion:
commitments, capacity reservations, regions); no two column names are equal ignoring case. The
FinOps Foundation's own validator (PyPI focus-validator 2.2.1, its bundled 1.2 rules) checks
the output in the tests. Periods with nothing to charge give no row. Pure: rendering only, from
a computed report.
"""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from fractions import Fraction
from typing import Literal

from gpuquota.quota.report import compute
from gpuquota.quota.report.compute import HOUR, KWH, Group, Report
from gpuquota.quota.report.period import Period
from gpuquota.quota.report.ratecard import RateCard

FOCUS_VERSION = "1.2"
# the report's grouping behind the rows: one SKU is a GPU model and resource name
KEYS = ("namespace", "model", "resource")
# every column of the FOCUS 1.2 CostAndUsage dataset, in the specification's order
COLUMNS = (
    "AvailabilityZone",
    "BilledCost",
    "BillingAccountId",
    "BillingAccountName",
    "BillingAccountType",
    "BillingCurrency",
    "BillingPeriodEnd",
    "BillingPeriodStart",
    "CapacityReservationId",
    "CapacityReservationStatus",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargeFrequency",
    "ChargePeriodEnd",
    "ChargePeriodStart",
    "CommitmentDiscountCategory",
    "CommitmentDiscountId",
    "CommitmentDiscountName",
    "CommitmentDiscountQuantity",
    "CommitmentDiscountStatus",
    "CommitmentDiscountType",
    "CommitmentDiscountUnit",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ContractedCost",
    "ContractedUnitPrice",
    "EffectiveCost",
    "InvoiceId",
    "InvoiceIssuerName",
    "ListCost",
    "ListUnitPrice",
    "PricingCategory",
    "PricingCurrency",
    "PricingCurrencyContractedUnitPrice",
    "PricingCurrencyEffectiveCost",
    "PricingCurrencyListUnitPrice",
    "PricingQuantity",
    "PricingUnit",
    "ProviderName",
    "PublisherName",
    "RegionId",
    "RegionName",
    "ResourceId",
    "ResourceName",
    "ResourceType",
    "ServiceCategory",
    "ServiceName",
    "ServiceSubcategory",
    "SkuId",
    "SkuMeter",
    "SkuPriceDetails",
    "SkuPriceId",
    "SubAccountId",
    "SubAccountName",
    "SubAccountType",
    "Tags",
)
PROVIDER = "gpuquota"
GPU_UNIT = "GPU-Hours"
ENERGY_UNIT = "kWh"
DECIMALS = 6
NONE = "(none)"


def _time(t: int) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _decimal(value: Fraction) -> str:
    scaled = round(value * 10**DECIMALS)
    sign = "-" if scaled < 0 else ""
    whole, frac = divmod(abs(scaled), 10**DECIMALS)
    return f"{sign}{whole}.{frac:0{DECIMALS}d}"


def _price(value: Fraction) -> str:
    """A unit price: exact where it has a finite decimal form (rate cards are decimals),
    else to 12 places; never without a decimal point (a reader infers the column's type
    from its values, and FOCUS prices are decimals: "2" would make it an integer column)."""
    for places in range(1, 13):
        if (value * 10**places).denominator == 1:
            break
    scaled = round(value * 10**places)
    whole, frac = divmod(abs(scaled), 10**places)
    sign = "-" if scaled < 0 else ""
    return f"{sign}{whole}.{frac:0{places}d}"


@dataclass(frozen=True)
class Charge:
    """One FOCUS row before formatting."""

    namespace: str
    sku: str  # SkuId
    meter: str  # SkuMeter
    unit: str
    quantity: Fraction
    unit_price: Fraction
    cost: Fraction
    start: int
    end: int
    description: str
    service: str
    details: dict[str, str]
    # PricingQuantity where it differs from the consumed quantity: the GPU-hours a rate card
    # prices a MIG profile as (mig_fractions) against the physical ones consumed
    pricing_quantity: Fraction | None = None


def charges(
    report: Report,
    card: RateCard,
    spread_idle: Literal["proportional", "even"] | None = None,
) -> list[Charge]:
    """The export's rows: allocated GPU-hours and energy per charge period, used and (spread)
    idle GPU-hours over the covered period. The report must be grouped by ``KEYS``, priced, and
    computed with day buckets (cli.py sees to it)."""
    if report.keys != KEYS or report.currency is None:
        raise ValueError(f"a FOCUS export needs a priced report grouped by {', '.join(KEYS)}")
    edges = report.bucket_edges
    end = report.window_end or edges[-1]
    groups = sorted(report.groups, key=lambda g: tuple(k or "" for k in g.keys))
    out: list[Charge] = []
    for b in range(len(edges) - 1):
        lo, hi = edges[b], min(edges[b + 1], end)
        if hi <= lo:
            continue
        energy: dict[str, list[Fraction]] = defaultdict(lambda: [Fraction(0), Fraction(0)])
        for g in groups:
            namespace, model, resource = _keys(g)
            hours = g.series[b] / HOUR if g.series else Fraction(0)
            if hours:
                rate = card.rate(model if model != NONE else None, lo)[0]
                cost = g.bucket_cost[b] if g.bucket_cost else Fraction(0)
                priced = g.priced_series[b] / HOUR if g.priced_series else hours
                # buckets are split where a price changes: the bucket's cost is rate x the
                # GPU-hours priced (physical, but for a MIG profile the card prices apart)
                assert cost == rate * priced, (g.keys, lo, cost, rate, priced)
                charge = _gpu(namespace, model, resource, hours, rate, cost, lo, hi)
                out.append(charge if priced == hours else replace(charge, pricing_quantity=priced))
            if report.energy_priced and g.bucket_energy and g.bucket_energy[b]:
                energy[namespace][0] += g.bucket_energy[b] / KWH
                energy[namespace][1] += g.bucket_energy_cost[b]
        for namespace, (kwh, cost) in sorted(energy.items()):
            price = card.energy_price(lo) or Fraction(0)
            out.append(
                Charge(
                    namespace,
                    "gpu-energy",
                    "GPU energy",
                    ENERGY_UNIT,
                    kwh,
                    price,
                    cost,
                    lo,
                    hi,
                    f"GPU energy (usage ledger) of namespace {namespace}",
                    "GPU energy",
                    {},
                )
            )
    start = edges[0]
    for g in groups:
        if g.used_seconds is None or not g.used_seconds:
            continue
        namespace, model, resource = _keys(g)
        out.append(
            Charge(
                namespace,
                f"gpu-used/{model}/{resource}",
                "GPU activity",
                GPU_UNIT,
                g.used_seconds / HOUR,
                Fraction(0),
                Fraction(0),
                start,
                end,
                f"Used GPU-hours (usage ledger) of the {model} {resource} allocations of "
                f"namespace {namespace}: not charged again, the allocation is",
                "GPU compute",
                {"gpu_model": model, "resource": resource},
            )
        )
    if spread_idle is not None and report.idle is not None:
        out += _idle(report, spread_idle, start, end)
    return out


def _keys(g: Group) -> tuple[str, str, str]:
    namespace, model, resource = (k if k else NONE for k in g.keys)
    return namespace, model, resource


def _gpu(
    namespace: str,
    model: str,
    resource: str,
    hours: Fraction,
    rate: Fraction,
    cost: Fraction,
    lo: int,
    hi: int,
) -> Charge:
    return Charge(
        namespace,
        f"gpu/{model}/{resource}",
        "GPU allocation",
        GPU_UNIT,
        hours,
        rate,
        cost,
        lo,
        hi,
        f"Allocated physical GPU-hours of {model} ({resource}) of namespace {namespace}",
        "GPU compute",
        {"gpu_model": model, "resource": resource},
    )


def _idle(
    report: Report, how: Literal["proportional", "even"], start: int, end: int
) -> list[Charge]:
    """Each namespace's share of each model's idle GPU-hours and cost: the report's own spread
    rule (compute.spread_idle) applied to the namespaces, whatever the SKU rows beneath."""
    assert report.idle is not None
    per_namespace: dict[str | None, Fraction] = defaultdict(Fraction)
    for g in report.groups:
        per_namespace[g.keys[0]] += g.physical_seconds
    namespaces = compute.Report(
        ("namespace",),
        [compute.Group((ns,), physical_seconds=s) for ns, s in per_namespace.items()],
        True,
        report.currency,
        idle=report.idle,
    )
    compute.spread_idle(namespaces, how)
    idle_seconds: dict[str, Fraction] = defaultdict(Fraction)
    idle_cost: dict[str, Fraction] = defaultdict(Fraction)
    for row in report.idle:
        idle_seconds[row.gpu_model or NONE] += row.idle_seconds
        idle_cost[row.gpu_model or NONE] += row.idle_cost
    total = sum(idle_seconds.values(), Fraction(0))
    out = []
    for ns in sorted(namespaces.groups, key=lambda g: g.keys[0] or ""):
        if not total or not ns.idle_seconds:
            continue
        share = ns.idle_seconds / total
        namespace = ns.keys[0] or NONE
        for model in sorted(idle_seconds):
            hours = idle_seconds[model] * share / HOUR
            if not hours:
                continue
            cost = idle_cost[model] * share
            out.append(
                Charge(
                    namespace,
                    f"gpu-idle/{model}",
                    "Idle GPU capacity",
                    GPU_UNIT,
                    hours,
                    cost / hours,
                    cost,
                    start,
                    end,
                    f"Idle {model} GPU-hours of the fleet spread to namespace {namespace} ({how})",
                    "GPU compute",
                    {"gpu_model": model, "spread": how},
                )
            )
    return out


def render_focus(
    report: Report,
    period: Period,
    card: RateCard,
    spread_idle: Literal["proportional", "even"] | None = None,
    account: str | None = None,
) -> str:
    """The FOCUS 1.2 CSV of ``charges`` (header, then one line per charge)."""
    account = account or PROVIDER
    currency = report.currency or ""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    base = {
        "BillingAccountId": account,
        "BillingAccountName": account,
        "BillingAccountType": "GPU fleet",
        "BillingCurrency": currency,
        "BillingPeriodStart": _time(period.start),
        "BillingPeriodEnd": _time(period.end),
        "ChargeCategory": "Usage",
        "ChargeFrequency": "Usage-Based",
        "InvoiceId": f"{account}-{_time(period.start)[:10]}-{_time(period.end)[:10]}",
        "InvoiceIssuerName": PROVIDER,
        "PricingCategory": "Standard",
        "PricingCurrency": currency,
        "ProviderName": PROVIDER,
        "PublisherName": PROVIDER,
        "ServiceCategory": "Compute",
        "ServiceSubcategory": "Containers",
        "SubAccountType": "Kubernetes namespace",
    }
    for c in charges(report, card, spread_idle):
        price, cost, quantity = _price(c.unit_price), _decimal(c.cost), _decimal(c.quantity)
        pricing = quantity if c.pricing_quantity is None else _decimal(c.pricing_quantity)
        writer.writerow(
            {
                **base,
                "BilledCost": cost,
                "ChargeDescription": c.description,
                "ChargePeriodStart": _time(c.start),
                "ChargePeriodEnd": _time(c.end),
                "ConsumedQuantity": quantity,
                "ConsumedUnit": c.unit,
                "ContractedCost": cost,
                "ContractedUnitPrice": price,
                "EffectiveCost": cost,
                "ListCost": cost,
                "ListUnitPrice": price,
                "PricingCurrencyContractedUnitPrice": price,
                "PricingCurrencyEffectiveCost": cost,
                "PricingCurrencyListUnitPrice": price,
                "PricingQuantity": pricing,
                "PricingUnit": c.unit,
                "ResourceId": f"namespace/{c.namespace}",
                "ResourceName": c.namespace,
                "ResourceType": "Kubernetes namespace",
                "ServiceName": c.service,
                "SkuId": c.sku,
                "SkuMeter": c.meter,
                "SkuPriceDetails": json.dumps(c.details, sort_keys=True),
                "SkuPriceId": f"{c.sku}@{price}{currency}",
                "SubAccountId": c.namespace,
                "SubAccountName": c.namespace,
                "Tags": json.dumps({"namespace": c.namespace, **c.details}, sort_keys=True),
            }
        )
    return buf.getvalue()
