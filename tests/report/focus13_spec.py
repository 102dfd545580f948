"""What FOCUS 1.3 says of each column of its Cost and Usage dataset: data type, whether it
allows nulls, feature level and allowed values, from each column's page ("Content
Constraints" and "Requirements") of the specification repository
FinOps-Open-Cost-and-Usage-Spec/FOCUS_Spec, 1.3 (ratified December 2025: the pages introduced
in 1.3, such as Allocated Method ID, say "Introduced (version) 1.3"; ProviderName and
PublisherName say "Deprecated (version) 1.3"). ``page`` names the column page (its title)
each rule comes from. The checker (``problems``) applies them, and the row-level rules those
pages state, to an export; tests/report/test_focus13.py runs it.

The validator of the FinOps Foundation (focus-validator 2.2.1) bundles only the 1.2 rules, so
for 1.3 this is the check.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

import pycountry


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # String, Decimal, Date/Time, JSON
    nulls: bool  # "Allows nulls"
    level: str  # "Feature level": Mandatory, Recommended, Conditional
    page: str  # the column page (its title)
    allowed: tuple[str, ...] = ()  # "Allowed values" (empty: not an allowed-values column)


def _c(name: str, type_: str, nulls: bool, level: str, page: str, *allowed: str) -> Column:
    return Column(name, type_, nulls, level, page, allowed)


S, D, T, J = "String", "Decimal", "Date/Time", "JSON"
M, R, C = "Mandatory", "Recommended", "Conditional"
SERVICE_CATEGORIES = (
    "AI and Machine Learning", "Analytics", "Business Applications", "Compute", "Databases",
    "Developer Tools", "Multicloud", "Identity", "Integration", "Internet of Things",
    "Management and Governance", "Media", "Migration", "Mobile", "Networking", "Security",
    "Storage", "Web", "Other",
)  # fmt: skip
# Service Subcategory page: each allowed subcategory and its one parent category
SUBCATEGORIES = {
    "AI and Machine Learning": ("AI Platforms", "Bots", "Generative AI", "Machine Learning",
                                "Natural Language Processing", "Other (AI and Machine Learning)"),
    "Analytics": ("Analytics Platforms", "Business Intelligence", "Data Processing", "Search",
                  "Streaming Analytics", "Other (Analytics)"),
    "Business Applications": ("Productivity and Collaboration", "Other (Business Applications)"),
    "Compute": ("Containers", "End User Computing", "Quantum Compute", "Serverless Compute",
                "Virtual Machines", "Other (Compute)"),
    "Databases": ("Caching", "Data Warehouses", "Ledger Databases", "NoSQL Databases",
                  "Relational Databases", "Time Series Databases", "Other (Databases)"),
    "Developer Tools": ("Developer Platforms", "Continuous Integration and Deployment",
                        "Development Environments", "Source Code Management",
                        "Quality Assurance", "Other (Developer Tools)"),
    "Identity": ("Identity and Access Management", "Other (Identity)"),
    "Integration": ("API Management", "Messaging", "Workflow Orchestration",
                    "Other (Integration)"),
    "Internet of Things": ("IoT Analytics", "IoT Platforms", "Other (Internet of Things)"),
    "Management and Governance": ("Architecture", "Compliance", "Cost Management",
                                  "Data Governance", "Disaster Recovery", "Endpoint Management",
                                  "Observability", "Support",
                                  "Other (Management and Governance)"),
    "Media": ("Content Creation", "Gaming", "Media Streaming", "Mixed Reality", "Other (Media)"),
    "Migration": ("Data Migration", "Resource Migration", "Other (Migration)"),
    "Mobile": ("Other (Mobile)",),
    "Multicloud": ("Multicloud Integration", "Other (Multicloud)"),
    "Networking": ("Application Networking", "Content Delivery", "Network Connectivity",
                   "Network Infrastructure", "Network Routing", "Network Security",
                   "Other (Networking)"),
    "Security": ("Secret Management", "Security Posture Management",
                 "Threat Detection and Response", "Other (Security)"),
    "Storage": ("Backup Storage", "Block Storage", "File Storage", "Object Storage",
                "Storage Platforms", "Other (Storage)"),
    "Web": ("Application Platforms", "Other (Web)"),
    "Other": ("Other (Other)",),
}  # fmt: skip

COLUMNS = (
    _c("AllocatedMethodDetails", J, True, R, "Allocated Method Details"),
    _c("AllocatedMethodId", S, True, C, "Allocated Method ID"),
    _c("AllocatedResourceId", S, True, C, "Allocated Resource ID"),
    _c("AllocatedResourceName", S, True, C, "Allocated Resource Name"),
    _c("AllocatedTags", J, True, C, "Allocated Tags"),
    _c("AvailabilityZone", S, True, R, "Availability Zone"),
    _c("BilledCost", D, False, M, "Billed Cost"),
    _c("BillingAccountId", S, False, M, "Billing Account ID"),
    _c("BillingAccountName", S, True, M, "Billing Account Name"),
    _c("BillingAccountType", S, False, C, "Billing Account Type"),
    _c("BillingCurrency", S, False, M, "Billing Currency"),
    _c("BillingPeriodEnd", T, False, M, "Billing Period End"),
    _c("BillingPeriodStart", T, False, M, "Billing Period Start"),
    _c("CapacityReservationId", S, True, C, "Capacity Reservation ID"),
    _c("CapacityReservationStatus", S, True, C, "Capacity Reservation Status", "Used", "Unused"),
    _c("ChargeCategory", S, False, M, "Charge Category",
       "Usage", "Purchase", "Tax", "Credit", "Adjustment"),
    _c("ChargeClass", S, True, M, "Charge Class", "Correction"),
    _c("ChargeDescription", S, True, M, "Charge Description"),
    _c("ChargeFrequency", S, False, R, "Charge Frequency", "One-Time", "Recurring", "Usage-Based"),
    _c("ChargePeriodEnd", T, False, M, "Charge Period End"),
    _c("ChargePeriodStart", T, False, M, "Charge Period Start"),
    _c("CommitmentDiscountCategory", S, True, C, "Commitment Discount Category", "Spend", "Usage"),
    _c("CommitmentDiscountId", S, True, C, "Commitment Discount ID"),
    _c("CommitmentDiscountName", S, True, C, "Commitment Discount Name"),
    _c("CommitmentDiscountQuantity", D, True, C, "Commitment Discount Quantity"),
    _c("CommitmentDiscountStatus", S, True, C, "Commitment Discount Status", "Used", "Unused"),
    _c("CommitmentDiscountType", S, True, C, "Commitment Discount Type"),
    _c("CommitmentDiscountUnit", S, True, C, "Commitment Discount Unit"),
    _c("ConsumedQuantity", D, True, C, "Consumed Quantity"),
    _c("ConsumedUnit", S, True, C, "Consumed Unit"),
    _c("ContractApplied", J, True, C, "Contract Applied"),
    _c("ContractedCost", D, False, M, "Contracted Cost"),
    _c("ContractedUnitPrice", D, True, C, "Contracted Unit Price"),
    _c("EffectiveCost", D, False, M, "Effective Cost"),
    _c("HostProviderName", S, True, M, "Host Provider Name"),
    _c("InvoiceId", S, True, R, "Invoice ID"),
    _c("InvoiceIssuerName", S, False, M, "Invoice Issuer Name"),
    _c("ListCost", D, False, M, "List Cost"),
    _c("ListUnitPrice", D, True, C, "List Unit Price"),
    _c("PricingCategory", S, True, C, "Pricing Category",
       "Standard", "Dynamic", "Committed", "Other"),
    _c("PricingCurrency", S, True, C, "Pricing Currency"),
    _c("PricingCurrencyContractedUnitPrice", D, True, C, "Pricing Currency Contracted Unit Price"),
    _c("PricingCurrencyEffectiveCost", D, True, C, "Pricing Currency Effective Cost"),
    _c("PricingCurrencyListUnitPrice", D, True, C, "Pricing Currency List Unit Price"),
    _c("PricingQuantity", D, True, M, "Pricing Quantity"),
    _c("PricingUnit", S, True, M, "Pricing Unit"),
    _c("ProviderName", S, False, M, "Provider - DEPRECATED"),
    _c("PublisherName", S, False, M, "Publisher - DEPRECATED"),
    _c("RegionId", S, True, C, "Region ID"),
    _c("RegionName", S, True, C, "Region Name"),
    _c("ResourceId", S, True, C, "Resource ID"),
    _c("ResourceName", S, True, C, "Resource Name"),
    _c("ResourceType", S, True, C, "Resource Type"),
    _c("ServiceCategory", S, False, M, "Service Category", *SERVICE_CATEGORIES),
    _c("ServiceName", S, False, M, "Service Name"),
    _c("ServiceProviderName", S, False, M, "Service Provider Name"),
    _c("ServiceSubcategory", S, False, R, "Service Subcategory",
       *(s for subs in SUBCATEGORIES.values() for s in subs)),
    _c("SkuId", S, True, C, "SKU ID"),
    _c("SkuMeter", S, True, C, "SKU Meter"),
    _c("SkuPriceDetails", J, True, C, "SKU Price Details"),
    _c("SkuPriceId", S, True, C, "SKU Price ID"),
    _c("SubAccountId", S, True, C, "Sub Account ID"),
    _c("SubAccountName", S, True, C, "Sub Account Name"),
    _c("SubAccountType", S, True, C, "Sub Account Type"),
    _c("Tags", J, True, C, "Tags"),
)  # fmt: skip
BY_NAME = {c.name: c for c in COLUMNS}
# Date/Time Format (attribute page): ISO 8601 in UTC, "Z"
DATETIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")
# Numeric Format (attribute page): a decimal number, no exponent, no thousands separators
NUMERIC = re.compile(r"-?\d+(\.\d+)?")
# Allocated Method Details page: the FOCUS-defined keys of an Elements object
ALLOCATION_KEYS = {"AllocatedRatio", "UsageUnit", "UsageQuantity"}


def _number(text: str) -> Decimal | None:
    if not NUMERIC.fullmatch(text):
        return None
    try:
        return Decimal(text)
    except InvalidOperation:
        return None


def _json_object(text: str) -> dict[str, object] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def problems(header: Sequence[str], rows: Sequence[dict[str, str]]) -> list[str]:
    """Every way the export breaks a rule of the 1.3 column pages (empty: none found)."""
    out: list[str] = []
    missing = [c.name for c in COLUMNS if c.name not in header]
    # every column this export can fill, whatever its feature level, is there: the Mandatory
    # ones must be (each page: "MUST be present"); the export writes the rest too
    out += [f"{name}: missing ({BY_NAME[name].page}: MUST be present)" for name in missing]
    out += [
        f"{name}: neither a FOCUS 1.3 column nor a custom x_ column"
        for name in header
        if name not in BY_NAME and not name.startswith("x_")
    ]
    if len({h.lower() for h in header}) != len(header):
        out.append("two column names equal ignoring case")
    for i, row in enumerate(rows):
        out += [f"row {i}: {p}" for p in _row_problems(row)]
    out += _ratio_problems(rows)
    return out


def _row_problems(row: dict[str, str]) -> list[str]:
    out = []
    for column in COLUMNS:
        value = row.get(column.name, "")
        where = f"{column.name} ({column.page})"
        if value == "":
            if not column.nulls:
                out.append(f"{where}: null, the page allows none")
            continue
        if column.type == D and _number(value) is None:
            out.append(f"{where}: {value!r} is no decimal (Numeric Format)")
        if column.type == T and not DATETIME.fullmatch(value):
            out.append(f"{where}: {value!r} is no UTC date/time (Date/Time Format)")
        if column.type == J and _json_object(value) is None:
            out.append(f"{where}: {value!r} is no JSON object")
        if column.allowed and value not in column.allowed:
            out.append(f"{where}: {value!r} is none of the allowed values")
    out += _relations(row)
    return out


def _null(row: dict[str, str], name: str) -> bool:
    return row.get(name, "") == ""


def _relations(row: dict[str, str]) -> list[str]:
    """The rules between columns that the column pages state."""
    out = []
    pairs = [
        # (a, b, page): b null exactly when a is
        ("ConsumedQuantity", "ConsumedUnit", "Consumed Unit"),
        ("PricingQuantity", "PricingUnit", "Pricing Unit"),
        ("BillingAccountId", "BillingAccountType", "Billing Account Type"),
        ("SubAccountId", "SubAccountName", "Sub Account Name"),
        ("SubAccountId", "SubAccountType", "Sub Account Type"),
        ("ResourceId", "ResourceType", "Resource Type"),
        ("AllocatedResourceId", "AllocatedResourceName", "Allocated Resource Name"),
        ("RegionId", "RegionName", "Region Name"),
    ]
    for a, b, page in pairs:
        if _null(row, a) != _null(row, b):
            out.append(f"{b} ({page}): null must go with {a} null")
    if _null(row, "SkuId") and not _null(row, "SkuMeter"):
        out.append("SkuMeter (SKU Meter): must be null when SkuId is")
    if _null(row, "SkuPriceId") and not _null(row, "SkuPriceDetails"):
        out.append("SkuPriceDetails (SKU Price Details): must be null when SkuPriceId is")
    usage = row.get("ChargeCategory") in ("Usage", "Purchase") and _null(row, "ChargeClass")
    for name, page in (
        ("SkuId", "SKU ID"),
        ("SkuPriceId", "SKU Price ID"),
        ("ListUnitPrice", "List Unit Price"),
        ("ContractedUnitPrice", "Contracted Unit Price"),
        ("PricingCategory", "Pricing Category"),
        ("PricingQuantity", "Pricing Quantity"),
    ):
        if usage and _null(row, name):
            out.append(f"{name} ({page}): must not be null for a Usage charge")
    for cost, unit, page in (
        ("ListCost", "ListUnitPrice", "List Cost"),
        ("ContractedCost", "ContractedUnitPrice", "Contracted Cost"),
    ):
        p, q, c = (_number(row.get(n, "")) for n in (unit, "PricingQuantity", cost))
        if p is not None and q is not None and c is not None and abs(p * q - c) > Decimal("1e-6"):
            out.append(f"{cost} ({page}): {c} is not {unit} x PricingQuantity = {p * q}")
    for name, page in (
        ("ListUnitPrice", "List Unit Price"),
        ("ContractedUnitPrice", "Contracted Unit Price"),
    ):
        value = _number(row.get(name, "")) if not _null(row, name) else None
        if value is not None and value < 0:
            out.append(f"{name} ({page}): must be non-negative")
    for name in ("BillingCurrency", "PricingCurrency"):
        code = row.get(name, "")
        if code and pycountry.currencies.get(alpha_3=code) is None:
            out.append(f"{name} ({BY_NAME[name].page}): {code!r} is no ISO 4217 code")
    category, sub = row.get("ServiceCategory", ""), row.get("ServiceSubcategory", "")
    if sub and sub not in SUBCATEGORIES.get(category, ()):
        out.append(f"ServiceSubcategory (Service Subcategory): {sub!r} is not under {category!r}")
    out += _allocation(row)
    return out


def _allocation(row: dict[str, str]) -> list[str]:
    """Allocated Method ID, Allocated Resource ID, Allocated Method Details, Allocated Tags."""
    out = []
    split = not _null(row, "AllocatedResourceId")
    if split != (not _null(row, "AllocatedMethodId")):
        out.append("AllocatedMethodId (Allocated Method ID): null exactly when not a split charge")
    if not split:
        for name in ("AllocatedMethodDetails", "AllocatedTags"):
            if not _null(row, name):
                out.append(f"{name} ({BY_NAME[name].page}): must be null outside a split")
        return out
    details = _json_object(row.get("AllocatedMethodDetails", "")) or {}
    elements = details.get("Elements")
    if not isinstance(elements, list) or not elements:
        return [*out, "AllocatedMethodDetails: needs an Elements array (Allocated Method Details)"]
    for element in elements:
        if not isinstance(element, dict) or not isinstance(element.get("AllocatedRatio"), float):
            out.append("AllocatedMethodDetails: each element needs a numeric AllocatedRatio")
            continue
        if "UsageQuantity" in element and "UsageUnit" not in element:
            out.append("AllocatedMethodDetails: UsageQuantity without UsageUnit")
        out += [
            f"AllocatedMethodDetails: key {k!r} is neither FOCUS-defined nor x_"
            for k in element
            if k not in ALLOCATION_KEYS and not k.startswith("x_")
        ]
    tags = _json_object(row.get("Tags", "")) or {}
    allocated_tags = _json_object(row.get("AllocatedTags", "")) or {}
    out += [
        f"AllocatedTags (Allocated Tags): {k!r} is already in Tags"
        for k in allocated_tags
        if k in tags
    ]
    return out


def _ratio_problems(rows: Sequence[dict[str, str]]) -> list[str]:
    """Allocated Method Details: the AllocatedRatio of the allocated charges of one origin
    charge (here: one resource, SKU, charge period and method) add up to 1."""
    sums: dict[tuple[str, ...], float] = defaultdict(float)
    for row in rows:
        if _null(row, "AllocatedResourceId"):
            continue
        details = _json_object(row["AllocatedMethodDetails"]) or {}
        for element in details.get("Elements") or []:  # type: ignore[attr-defined]
            origin = tuple(
                row[n] for n in ("ResourceId", "SkuId", "ChargePeriodStart", "AllocatedMethodId")
            )
            sums[origin] += float(element.get("AllocatedRatio", 0))
    return [
        f"AllocatedRatio of {origin} adds up to {total}, not 1 (Allocated Method Details)"
        for origin, total in sums.items()
        if abs(total - 1) > 1e-9
    ]
