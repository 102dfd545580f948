"""The FOCUS CSV of `gpuquota report --format focus`: FOCUS 1.3 (default) or 1.2 columns, the
identity settings (focus_settings.py), one line per charge (focus.py).

Every column of the version's Cost and Usage dataset is present, each once (nullable ones
empty where this product has no such notion: commitments, capacity reservations, contracts,
regions), then the custom columns ``x_Cluster``, ``x_NodePool`` and ``x_Owner``. What differs
between the versions:

- 1.3 adds ServiceProviderName and HostProviderName (ProviderName and PublisherName stay, as
  the 1.3 pages still require them, deprecated) and the split cost allocation columns: an
  allocation row is an allocated charge of its node pool's GPUs (ResourceId the node pool,
  AllocatedResourceId the namespace), with the share rule and ratio; so is a spread idle row.
  SkuPriceId is the SkuId (1.3 keeps prices and currencies out of it).
- 1.2 has no allocation columns: ResourceId is the namespace, SkuPriceId carries the price.

Pure: formatting only.
"""

from __future__ import annotations

import csv
import functools
import io
import json
from datetime import UTC, datetime
from fractions import Fraction
from typing import Literal

from gpuquota.quota.report.compute import Report
from gpuquota.quota.report.focus import Charge, charges
from gpuquota.quota.report.focus_settings import FocusSettings
from gpuquota.quota.report.period import Period
from gpuquota.quota.report.ratecard import RateCard

VERSIONS = ("1.3", "1.2")
DEFAULT_VERSION = "1.3"
DECIMALS = 6
# every column of the FOCUS 1.2 Cost and Usage dataset, in the specification's order
COLUMNS_12 = (
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
# the Cost and Usage columns FOCUS 1.3 added
ADDED_13 = (
    "AllocatedMethodDetails",
    "AllocatedMethodId",
    "AllocatedResourceId",
    "AllocatedResourceName",
    "AllocatedTags",
    "ContractApplied",
    "HostProviderName",
    "ServiceProviderName",
)
COLUMNS_13 = tuple(sorted((*COLUMNS_12, *ADDED_13)))
# ours (FOCUS custom columns are x_-prefixed): where each row's GPUs were
CUSTOM = ("x_Cluster", "x_NodePool", "x_Owner")
# provider-defined tag keys carry our prefix (FOCUS Tags: user-defined keys, the namespace
# labels, have none)
TAG_PREFIX = "gpuquota.io/"


def columns(version: str) -> tuple[str, ...]:
    return (*(COLUMNS_13 if version == "1.3" else COLUMNS_12), *CUSTOM)


@functools.lru_cache(maxsize=4096)
def _time(t: int) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def invoice_id(account: str, cluster: str, period: Period) -> str:
    """The provisional invoice of one billing account's cluster over one period: unique per
    account, cluster and period to the second (two periods of one day differ)."""
    stamp = "%Y%m%dT%H%M%SZ"
    start = datetime.fromtimestamp(period.start, UTC).strftime(stamp)
    end = datetime.fromtimestamp(period.end, UTC).strftime(stamp)
    return f"{account}-{cluster}-{start}-{end}"


def decimal(value: Fraction) -> str:
    scaled = round(value * 10**DECIMALS)
    sign = "-" if scaled < 0 else ""
    whole, frac = divmod(abs(scaled), 10**DECIMALS)
    return f"{sign}{whole}.{frac:0{DECIMALS}d}"


@functools.lru_cache(maxsize=4096)  # a few prices, on many rows
def price(value: Fraction) -> str:
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


def _tags(c: Charge, allocated: bool) -> tuple[dict[str, str], dict[str, str]]:
    """Tags and (1.3, an allocated charge) AllocatedTags: the tag labels' values, and our own
    keys for the charged resource; the allocated namespace's key moves to AllocatedTags (1.3
    keeps a tag in one of the two)."""
    tags = {k: v for k, v in c.labels if v is not None}
    own = {
        "cluster": c.cluster,
        "node-pool": c.pool,
        "gpu-model": c.model,
        "resource": c.resource,
    }
    tags.update({TAG_PREFIX + k: v for k, v in own.items() if v is not None})
    namespace = {TAG_PREFIX + "namespace": c.namespace}
    if allocated:
        return tags, namespace
    return {**tags, **namespace}, {}


def _allocation(c: Charge) -> dict[str, str]:
    """The FOCUS 1.3 split cost allocation columns of an allocated charge."""
    assert c.ratio is not None and c.method is not None
    element: dict[str, float | str] = {"AllocatedRatio": round(float(c.ratio), 12)}
    if c.basis is not None:
        element["UsageUnit"] = c.basis[0]
        element["UsageQuantity"] = round(float(c.basis[1]), DECIMALS)
    return {
        "AllocatedMethodId": c.method,
        "AllocatedMethodDetails": json.dumps({"Elements": [element]}, sort_keys=True),
        "AllocatedResourceId": f"{c.cluster}/namespace/{c.namespace}",
        "AllocatedResourceName": c.namespace,
    }


def render(
    report: Report,
    period: Period,
    card: RateCard,
    settings: FocusSettings,
    version: str = DEFAULT_VERSION,
    spread_idle: Literal["proportional", "even"] | None = None,
) -> str:
    """The FOCUS CSV of ``charges`` (header, then one line per charge)."""
    if version not in VERSIONS:
        raise ValueError(f"FOCUS version {version!r} (known: {', '.join(VERSIONS)})")
    currency = report.currency or ""
    buf = io.StringIO()
    header = columns(version)
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    base = {
        "BillingAccountId": settings.account_id,
        "BillingAccountName": settings.account_name,
        "BillingAccountType": "GPU fleet",
        "BillingCurrency": currency,
        "BillingPeriodStart": _time(period.start),
        "BillingPeriodEnd": _time(period.end),
        "ChargeCategory": "Usage",
        "ChargeFrequency": "Usage-Based",
        "InvoiceIssuerName": settings.issuer,
        "PricingCategory": "Standard",
        "PricingCurrency": currency,
        "ProviderName": settings.service_provider,
        "PublisherName": settings.publisher_name,
        "ServiceCategory": "Compute",
        "ServiceSubcategory": "Containers",
        "SubAccountType": "Kubernetes namespace",
    }
    if version == "1.3":
        base["ServiceProviderName"] = settings.service_provider
        base["HostProviderName"] = settings.host
    for c in charges(report, card, spread_idle):
        unit_price, cost, quantity = price(c.unit_price), decimal(c.cost), decimal(c.quantity)
        allocated = version == "1.3" and c.ratio is not None
        tags, allocated_tags = _tags(c, allocated)
        row = {
            **base,
            "BilledCost": cost,
            "ChargeDescription": c.description,
            "ChargePeriodStart": _time(c.start),
            "ChargePeriodEnd": _time(c.end),
            "ConsumedQuantity": quantity,
            "ConsumedUnit": c.unit,
            "ContractedCost": cost,
            "ContractedUnitPrice": unit_price,
            "EffectiveCost": cost,
            "InvoiceId": invoice_id(settings.account_id, c.cluster, period),
            "ListCost": cost,
            "ListUnitPrice": unit_price,
            "PricingCurrencyContractedUnitPrice": unit_price,
            "PricingCurrencyEffectiveCost": cost,
            "PricingCurrencyListUnitPrice": unit_price,
            "PricingQuantity": quantity
            if c.pricing_quantity is None
            else decimal(c.pricing_quantity),
            "PricingUnit": c.unit,
            "ServiceName": c.service,
            "SkuId": c.sku,
            "SkuMeter": c.meter,
            "SkuPriceDetails": json.dumps(c.details, sort_keys=True) if c.details else "",
            "SubAccountId": f"{c.cluster}/{c.namespace}",
            "SubAccountName": c.namespace,
            "Tags": json.dumps(tags, sort_keys=True),
            "x_Cluster": c.cluster,
            "x_NodePool": c.pool,
            "x_Owner": c.owner or "",
        }
        if version == "1.3":
            # the charged resource is the cluster's node pool whose GPUs the row is about
            row["ResourceId"] = f"{c.cluster}/nodepool/{c.pool}"
            row["ResourceName"] = c.pool
            row["ResourceType"] = "Kubernetes node pool"
            row["SkuPriceId"] = c.sku
            if allocated:
                row.update(_allocation(c))
                row["AllocatedTags"] = json.dumps(allocated_tags, sort_keys=True)
        else:
            row["ResourceId"] = f"{c.cluster}/namespace/{c.namespace}"
            row["ResourceName"] = c.namespace
            row["ResourceType"] = "Kubernetes namespace"
            row["SkuPriceId"] = f"{c.sku}@{unit_price}{currency}"
        writer.writerow([row.get(name, "") for name in header])
    return buf.getvalue()
