"""`gpuquota report --format focus`: the rows of a FinOps FOCUS cost and usage export.

One row per cluster, namespace (with its tag labels), owner, node pool, SKU and charge period
(a calendar day in the report's zone, split where the rate card's price changes), so that every
row has one real unit price and one meaning:

- allocation: allocated physical GPU-hours (unit ``GPU-Hours``) per GPU model and resource (a
  MIG profile's resource is its own SKU), priced at the model's rate in force: the bill;
- energy: the ledger's GPU energy (``kWh``), where the rate card prices energy, clipped to
  the covered time as the used rows are;
- used: the ledger's used physical GPU-hours of those allocations (``Used GPU-Hours``), priced
  at 0: the allocation is what is billed, this row says how much of it did work;
- idle, with ``--spread-idle``: each namespace's share of its cluster's idle capacity per GPU
  model and node pool (``Idle GPU-Hours``), priced at the idle cost the report computes.

Each unit has one meaning, so ``SUM(ConsumedQuantity) GROUP BY ConsumedUnit`` never adds
allocated, used and idle hours together. Used and idle rows are per charge period too, clipped
to the time the store covers. Pure: from a computed report (focus_csv.py writes the CSV).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Literal

from gpuquota.quota.report.compute import HOUR, KWH, Group, IdleRow, Report
from gpuquota.quota.report.ratecard import RateCard

# the report's grouping behind the rows; the rate card's (or flag's) tag labels follow
BASE_KEYS = ("cluster", "namespace", "owner", "pool", "model", "resource")
GPU_UNIT = "GPU-Hours"  # allocated: what is billed
USED_UNIT = "Used GPU-Hours"
IDLE_UNIT = "Idle GPU-Hours"
ENERGY_UNIT = "kWh"
NONE = "(none)"
# FOCUS 1.3 AllocatedMethodId values: each names a rule docs/report.md documents
METHOD_GPU_TIME = "gpuquota-gpu-time"
METHOD_IDLE = {"proportional": "gpuquota-idle-proportional", "even": "gpuquota-idle-even"}

Kind = Literal["allocation", "energy", "used", "idle"]


def keys(tags: Sequence[str]) -> tuple[str, ...]:
    """The report keys an export with these tag labels is grouped by."""
    return (*BASE_KEYS, *(f"label:{t}" for t in tags))


@dataclass(frozen=True)
class Charge:
    """One FOCUS row before formatting."""

    kind: Kind
    cluster: str
    namespace: str
    owner: str | None
    pool: str
    labels: tuple[tuple[str, str | None], ...]  # the tag labels' values (None: unlabelled)
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
    details: dict[str, str] = field(default_factory=dict)
    model: str | None = None
    resource: str | None = None
    # a split cost allocation (FOCUS 1.3): the row's share of its origin charge, the method,
    # and the usage the share was computed from (unit, quantity)
    ratio: Fraction | None = None
    method: str | None = None
    basis: tuple[str, Fraction] | None = None
    # PricingQuantity where it differs from the consumed quantity: the GPU-hours a rate card
    # prices a MIG profile as (mig_fractions) against the physical ones consumed
    pricing_quantity: Fraction | None = None


@dataclass(frozen=True)
class _Who:
    cluster: str
    namespace: str
    owner: str | None
    pool: str
    labels: tuple[tuple[str, str | None], ...]


def _who(report: Report, g: Group) -> tuple[_Who, str, str]:
    """The group's owner, pool and labels, and its GPU model and resource."""
    k = dict(zip(report.keys, g.keys, strict=True))
    labels = tuple(
        (key[len("label:") :], k[key]) for key in report.keys if key.startswith("label:")
    )
    who = _Who(k["cluster"] or NONE, k["namespace"] or NONE, k["owner"], k["pool"] or NONE, labels)
    return who, k["model"] or NONE, k["resource"] or NONE


def charges(
    report: Report,
    card: RateCard,
    spread_idle: Literal["proportional", "even"] | None = None,
) -> list[Charge]:
    """The export's rows. The report must be priced, grouped by ``keys(...)`` and computed
    with day buckets (cli.py sees to it)."""
    if report.keys[: len(BASE_KEYS)] != BASE_KEYS or report.currency is None:
        raise ValueError(f"a FOCUS export needs a priced report grouped by {', '.join(BASE_KEYS)}")
    edges = report.bucket_edges
    end = report.window_end or edges[-1]
    groups = sorted(report.groups, key=lambda g: tuple(k or "" for k in g.keys))
    whos = {g.keys: _who(report, g) for g in groups}
    out: list[Charge] = []
    # the allocated GPU-hours of each SKU in each cluster's node pool and charge period: the
    # origin charge that allocation rows split (their AllocatedRatio)
    origin: dict[tuple[str, str, str, str, int], Fraction] = defaultdict(Fraction)
    for g in groups:
        who, model, resource = whos[g.keys]
        for b, seconds in enumerate(g.series):
            origin[(who.cluster, who.pool, model, resource, b)] += seconds / HOUR
    for b in range(len(edges) - 1):
        lo, hi = edges[b], min(edges[b + 1], end)
        if hi <= lo:
            continue
        energy: dict[_Who, list[Fraction]] = defaultdict(lambda: [Fraction(0), Fraction(0)])
        for g in groups:
            who, model, resource = whos[g.keys]
            hours = g.series[b] / HOUR if g.series else Fraction(0)
            if hours:
                rate = card.rate(model if model != NONE else None, lo)[0]
                cost = g.bucket_cost[b] if g.bucket_cost else Fraction(0)
                priced = g.priced_series[b] / HOUR if g.priced_series else hours
                # buckets are split where a price changes: the bucket's cost is rate x the
                # GPU-hours priced (physical, but for a MIG profile the card prices apart)
                assert cost == rate * priced, (g.keys, lo, cost, rate, priced)
                total = origin[(who.cluster, who.pool, model, resource, b)]
                charge = _gpu(who, model, resource, hours, rate, cost, lo, hi, hours / total)
                out.append(charge if priced == hours else replace(charge, pricing_quantity=priced))
            if report.energy_priced and g.bucket_energy and g.bucket_energy[b]:
                energy[who][0] += g.bucket_energy[b] / KWH
                energy[who][1] += g.bucket_energy_cost[b]
        for who, (kwh, cost) in sorted(energy.items(), key=lambda e: _order(e[0])):
            price = card.energy_price(lo) or Fraction(0)
            # measured by the ledger, as used GPU-hours are: inside the covered time
            start, stop = covered_part(report, who.cluster, lo, hi)
            out.append(_energy(who, kwh, price, cost, start, stop))
        out += _used(report, groups, whos, b, lo, hi)
    if spread_idle is not None and report.idle_by_bucket is not None:
        out += _idle(report, groups, spread_idle, end)
    return out


def _order(who: _Who) -> tuple[str, ...]:
    return (
        who.cluster,
        who.namespace,
        who.owner or "",
        who.pool,
        *(v or "" for _, v in who.labels),
    )


def _gpu(
    who: _Who,
    model: str,
    resource: str,
    hours: Fraction,
    rate: Fraction,
    cost: Fraction,
    lo: int,
    hi: int,
    ratio: Fraction,
) -> Charge:
    return Charge(
        "allocation",
        who.cluster,
        who.namespace,
        who.owner,
        who.pool,
        who.labels,
        f"gpu/{model}/{resource}",
        "GPU allocation",
        GPU_UNIT,
        hours,
        rate,
        cost,
        lo,
        hi,
        f"Allocated physical GPU-hours of {model} ({resource}) in node pool {who.pool} of "
        f"cluster {who.cluster}, namespace {who.namespace}",
        "GPU compute",
        {"x_GpuModel": model, "x_Resource": resource},
        model,
        resource,
        ratio,
        METHOD_GPU_TIME,
        (GPU_UNIT, hours),
    )


def _energy(who: _Who, kwh: Fraction, price: Fraction, cost: Fraction, lo: int, hi: int) -> Charge:
    return Charge(
        "energy",
        who.cluster,
        who.namespace,
        who.owner,
        who.pool,
        who.labels,
        "gpu-energy",
        "GPU energy",
        ENERGY_UNIT,
        kwh,
        price,
        cost,
        lo,
        hi,
        f"GPU energy (usage ledger) in cluster {who.cluster}, namespace {who.namespace}",
        "GPU energy",
    )


def covered_part(report: Report, cluster: str, lo: int, hi: int) -> tuple[int, int]:
    """[lo, hi) clipped to the cluster's covered time: from the first covered second in it to
    the last (unchanged where the store says nothing of the cluster's coverage, or none of
    [lo, hi) is covered)."""
    spans = report.covered.get(cluster)
    if spans is None:
        return lo, hi
    inside = [(max(lo, a), min(hi, b)) for a, b in spans if min(hi, b) > max(lo, a)]
    if not inside:
        return lo, hi
    return min(a for a, _ in inside), max(b for _, b in inside)


def _used(
    report: Report,
    groups: Sequence[Group],
    whos: dict[tuple[str | None, ...], tuple[_Who, str, str]],
    b: int,
    lo: int,
    hi: int,
) -> list[Charge]:
    """The ledger's used GPU-hours of each group in bucket ``b``, clipped to covered time."""
    out = []
    per_bucket = report.used_by_bucket or {}
    for g in groups:
        used = per_bucket.get(g.keys)
        if not used or not used[b]:
            continue
        who, model, resource = whos[g.keys]
        start, stop = covered_part(report, who.cluster, lo, hi)
        out.append(
            Charge(
                "used",
                who.cluster,
                who.namespace,
                who.owner,
                who.pool,
                who.labels,
                f"gpu-used/{model}/{resource}",
                "GPU activity",
                USED_UNIT,
                used[b] / HOUR,
                Fraction(0),
                Fraction(0),
                start,
                stop,
                f"Used GPU-hours (usage ledger) of the {model} {resource} allocations in "
                f"cluster {who.cluster}, namespace {who.namespace}: not charged again, the "
                "allocation is",
                "GPU compute",
                {"x_GpuModel": model, "x_Resource": resource},
                model,
                resource,
            )
        )
    return out


def shares(
    report: Report, groups: Sequence[Group], how: Literal["proportional", "even"]
) -> dict[str, dict[_Who, Fraction]]:
    """Per cluster, each namespace's (and tag labels') share of the cluster's idle capacity:
    the report's spread rule (compute.spread_idle) over the cluster's namespaces: by physical
    GPU-hours of the period, or one equal share per namespace (a namespace whose labels
    changed shares its part among its label values by their GPU-hours)."""
    seconds: dict[str, dict[_Who, Fraction]] = defaultdict(lambda: defaultdict(Fraction))
    for g in groups:
        who, _, _ = _who(report, g)
        who = replace(who, owner=None, pool=NONE)
        seconds[who.cluster][who] += g.physical_seconds
    out: dict[str, dict[_Who, Fraction]] = {}
    for cluster, per in seconds.items():
        total = sum(per.values(), Fraction(0))
        if how == "proportional" and total:
            out[cluster] = {w: s / total for w, s in per.items()}
            continue
        # even (or proportional with no GPU-hours at all: compute.spread_idle's fallback)
        namespaces: dict[str, list[_Who]] = defaultdict(list)
        for w in per:
            namespaces[w.namespace].append(w)
        out[cluster] = {}
        for members in namespaces.values():
            own = sum((per[w] for w in members), Fraction(0))
            for w in members:
                part = per[w] / own if own else Fraction(1, len(members))
                out[cluster][w] = part / len(namespaces)
    return out


def _idle(
    report: Report,
    groups: Sequence[Group],
    how: Literal["proportional", "even"],
    end: int,
) -> list[Charge]:
    """Each namespace's share of its cluster's idle GPU-hours and cost per GPU model, node pool
    and charge period: the period's shares (``shares``) applied to each day's idle, so the days
    add up to the report's spread idle of that cluster (`--cluster C --spread-idle`)."""
    assert report.idle_by_bucket is not None
    split = shares(report, groups, how)
    physical: dict[_Who, Fraction] = defaultdict(Fraction)
    for g in groups:
        who, _, _ = _who(report, g)
        physical[replace(who, owner=None, pool=NONE)] += g.physical_seconds
    edges = report.bucket_edges
    out = []
    for cluster, days in sorted(report.idle_by_bucket.items()):
        for b, rows in enumerate(days):
            lo, hi = edges[b], min(edges[b + 1], end)
            if hi <= lo:
                continue
            start, stop = covered_part(report, cluster, lo, hi)
            for row in sorted(rows, key=lambda r: (r.gpu_model or "", r.node_pool or "")):
                out += _idle_rows(cluster, row, split.get(cluster, {}), physical, how, start, stop)
    return out


def _idle_rows(
    cluster: str,
    row: IdleRow,
    split: dict[_Who, Fraction],
    physical: dict[_Who, Fraction],
    how: Literal["proportional", "even"],
    start: int,
    stop: int,
) -> list[Charge]:
    model, pool = row.gpu_model or NONE, row.node_pool or NONE
    out = []
    for who, share in sorted(split.items(), key=lambda e: _order(e[0])):
        hours = row.idle_seconds * share / HOUR
        if not hours:
            continue
        cost = row.idle_cost * share
        basis = (GPU_UNIT, physical[who] / HOUR) if how == "proportional" else None
        out.append(
            Charge(
                "idle",
                cluster,
                who.namespace,
                None,
                pool,
                who.labels,
                f"gpu-idle/{model}",
                "Idle GPU capacity",
                IDLE_UNIT,
                hours,
                cost / hours,
                cost,
                start,
                stop,
                f"Idle {model} GPU-hours of node pool {pool} of cluster {cluster} spread to "
                f"namespace {who.namespace} ({how})",
                "GPU compute",
                {"x_GpuModel": model},
                model,
                None,
                share,
                METHOD_IDLE[how],
                basis,
            )
        )
    return out
