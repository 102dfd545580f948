"""Pure report arithmetic: grouped SQL rows -> exact per-group figures.

Everything stays exact until display: raw usage in unit-seconds (whole numbers, but for a shared
DRA claim split among its pods: then Fractions), physical usage and money as Fractions. The
renderers round each figure from its own exact value (``round_half_up``), and a total from the
exact sum of its rows. Physical and priced GPU-seconds per row come from physical.py, the idle
table from idle.py.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import FrozenInstanceError, dataclass, field
from fractions import Fraction
from typing import Any, Literal

from gpuquota.quota.ledger import rules
from gpuquota.quota.report.allocations import UsageRow

# re-exported: the renderers take the report's types and units from here
from gpuquota.quota.report.idle import IdleRow as IdleRow
from gpuquota.quota.report.physical import HOUR as HOUR
from gpuquota.quota.report.physical import physical_per_row, priced_per_row
from gpuquota.quota.report.query import HolderWindow, LedgerCut, LedgerRow, QuotaRow
from gpuquota.quota.report.ratecard import RateCard
from gpuquota.quota.report.scope import GapRecord

OTHER = "(other)"


class _Freezable:
    """A dataclass that computing may fill in and then freeze: after ``freeze()`` no attribute
    can be reassigned (the renderers get a finished, immutable report)."""

    _frozen = False

    def __setattr__(self, name: str, value: Any) -> None:
        if self._frozen:
            raise FrozenInstanceError(f"cannot assign to field {name!r}: computed and frozen")
        object.__setattr__(self, name, value)

    def _freeze(self) -> None:
        object.__setattr__(self, "_frozen", True)


@dataclass
class Group(_Freezable):
    keys: tuple[str | None, ...]
    # raw unit-seconds: whole, unless a shared DRA claim's time is split among its pods
    raw_seconds: Fraction = Fraction(0)
    physical_seconds: Fraction = Fraction(0)
    # GPU-seconds as priced: physical, but for MIG profiles the rate card prices at its own
    # fraction (mig_fractions); cost = priced seconds x rate. Equal to physical without a card
    priced_seconds: Fraction = Fraction(0)
    cost: Fraction = Fraction(0)  # in rate-card currency
    estimated_raw_seconds: Fraction = Fraction(0)
    estimated_intervals: int = 0
    series: list[Fraction] = field(default_factory=list)  # physical seconds per chart bucket
    priced_series: list[Fraction] = field(default_factory=list)  # priced seconds per bucket
    bucket_cost: list[Fraction] = field(default_factory=list)  # cost per bucket (rate card)
    # the ledger's joules and their cost per bucket (empty: no ledger rows)
    bucket_energy: list[Fraction] = field(default_factory=list)
    bucket_energy_cost: list[Fraction] = field(default_factory=list)
    idle_seconds: Fraction | None = None  # spread idle physical seconds
    idle_cost: Fraction | None = None
    utilised_seconds: Fraction | None = None  # from Prometheus: physical seconds of busy GPU
    # from Prometheus: physical seconds of the group's allocations that had samples
    measured_seconds: Fraction | None = None
    # from the usage ledger (None: no ledger rows for the group: no usage data, not zero)
    used_seconds: Fraction | None = None  # physical GPU-seconds of activity
    sampled_seconds: Fraction | None = None  # device-seconds with samples (coverage numerator)
    energy_joules: Fraction | None = None
    energy_cost: Fraction | None = None  # None also where the rate card prices no energy
    carbon_grams: Fraction | None = None  # g CO2e; None where the card gives no intensity

    @property
    def coverage(self) -> Fraction | None:
        """The share of the group's allocated device-seconds the ledger had samples for
        (capped at 1); None without ledger rows."""
        if self.sampled_seconds is None:
            return None
        if not self.raw_seconds:
            return Fraction(1) if self.sampled_seconds else Fraction(0)
        return min(self.sampled_seconds / self.raw_seconds, Fraction(1))

    @property
    def measured_allocated_seconds(self) -> Fraction | None:
        """Physical allocated seconds the ledger covers: allocated x coverage."""
        c = self.coverage
        return None if c is None else self.physical_seconds * c

    @property
    def idle_allocated_seconds(self) -> Fraction | None:
        """Allocated but unused physical GPU-seconds, over the covered part only (unmeasured
        time is neither used nor idle); never below zero."""
        m = self.measured_allocated_seconds
        if m is None or self.used_seconds is None:
            return None
        return max(m - self.used_seconds, Fraction(0))


@dataclass
class QuotaFigure:
    """Quota use of one group, quota and resource (raw units of that resource) over the window.

    A group spanning several namespaces (a label, a cluster) adds up its namespaces' quotas:
    the averages are sums of each namespace's average over the time it had samples (never
    diluted by time without any), unused unit-seconds add up, and the coverage is the mean of
    the namespaces' coverages (sampled namespace-seconds over namespaces x the window)."""

    keys: tuple[str | None, ...]
    quota_name: str | None
    resource_name: str
    avg_used: Fraction
    avg_hard: Fraction
    unused_seconds: Fraction
    sampled_seconds: Fraction  # sampled seconds, summed over the group's namespaces
    peak_used: Fraction | None
    peak_hard: Fraction | None
    namespaces: int = 1  # how many namespaces' quotas the figure adds up
    span: int = 0  # seconds of the window the figures are over

    @property
    def coverage(self) -> Fraction:
        """The share of the window (per namespace, averaged) with quota samples: at most 1."""
        whole = self.namespaces * self.span
        return min(self.sampled_seconds / whole, Fraction(1)) if whole else Fraction(0)


@dataclass(frozen=True)
class IdleAllocation:
    """A run of consecutive ledger windows in which one holder's activity stayed under the
    threshold for at least the minimum duration: a reclaim candidate (nothing is evicted)."""

    cluster: str
    namespace: str
    holder_kind: str  # pod | claim
    name: str  # the pod's (claim's) name
    owner: str | None  # Kind/name
    gpus: Fraction  # physical GPUs held
    since: int  # the run's first window start (clipped to the period)
    until: int  # the run's end (clipped to the period)
    still_idle: bool  # the run reaches the last ingested window and the allocation is open
    idle_seconds: Fraction  # physical GPU-seconds allocated but unused over the run
    activity: Fraction  # used / sampled physical over the run


@dataclass
class Report(_Freezable):
    keys: tuple[str, ...]
    groups: list[Group]
    priced: bool
    currency: str | None
    idle: list[IdleRow] | None = None
    unpriced_models: list[str] = field(default_factory=list)
    # models the rate card prices that no usage in the window had (a typo, or a model gone)
    unmatched_card_models: list[str] = field(default_factory=list)
    estimated_intervals: int = 0
    bucket_edges: list[int] = field(default_factory=list)
    # namespace -> BestEffort pods that held GPUs in the window (they escape scoped quotas)
    best_effort_pods: dict[str, int] = field(default_factory=dict)
    # quota figures per group, quota and resource; None: the grouping has no quota view
    quota: list[QuotaFigure] | None = None
    quota_totals: list[QuotaTotal] = field(default_factory=list)  # per resource
    quota_span: int = 0  # seconds of the window the quota averages are over
    # where each cluster's data ends (None: no heartbeat), for the coverage note
    coverage: dict[str, int | None] = field(default_factory=dict)
    window_start: int = 0
    window_end: int = 0  # the window's end as computed (the earlier of its end and now)
    # clusters whose data ends inside the window, well before its end: the report says so
    ends_early: dict[str, int] = field(default_factory=dict)
    # clusters whose data begins after the window's start: when it begins
    begins_late: dict[str, int] = field(default_factory=dict)
    prometheus: str | None = None  # the Prometheus utilisation came from
    # spans the window overlaps in which a kind was not followed (pods created and deleted
    # inside one may be missing): said in every format
    gaps: list[GapRecord] = field(default_factory=list)
    # per cluster, the parts of the window the store covers (idle.covered_spans): idle and its
    # cost count only these; the notes and the JSON name them
    covered: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    # whether the store has a usage ledger for the clusters in scope (the used/energy columns)
    ledger: bool = False
    # per cluster, up to when the ledger is ingested (no entry: no progress row)
    ledger_until: dict[str, int] = field(default_factory=dict)
    # the ledger windows the period's edges cut, counted pro rata to time
    ledger_cut: LedgerCut = field(default_factory=LedgerCut)
    energy_priced: bool = False  # the rate card prices energy
    # per cluster, joules of GPUs nobody held (the nodes' idle GPU energy): no group's
    unallocated_energy: dict[str, Fraction] = field(default_factory=dict)
    carbon_priced: bool = False  # the rate card gives a carbon intensity
    # idle allocations (the ledger's rule), when asked for
    idle_allocations: list[IdleAllocation] | None = None
    idle_threshold: Fraction = Fraction(5, 100)
    idle_min_seconds: int = 3600
    # per charge period (day buckets: the FOCUS export; daily.py): the ledger's used physical
    # GPU-seconds per group key and bucket, and per cluster and bucket the idle rows
    used_by_bucket: dict[tuple[str | None, ...], list[Fraction]] | None = None
    idle_by_bucket: dict[str, list[list[IdleRow]]] | None = None

    def freeze(self) -> Report:
        """Make the finished report (and its groups) immutable; returns it."""
        for g in self.groups:
            g._freeze()
        self._freeze()
        return self

    @property
    def physical_total(self) -> Fraction:
        return sum((g.physical_seconds for g in self.groups), Fraction(0))


def sub_windows(lo: int, hi: int, *cuts: Iterable[int]) -> list[int]:
    """Sorted unique boundaries lo..hi including every cut strictly inside."""
    inner = {t for seq in cuts for t in seq if lo < t < hi}
    return [lo, *sorted(inner), hi]


def aggregate(
    keys: Sequence[str],
    rows: Iterable[UsageRow],
    edges: Sequence[int],
    card: RateCard | None,
    bucket_edges: Sequence[int] | None = None,
) -> Report:
    """Sum usage rows per group; price each sub-window at the rate in force at its start.

    The loop adds integers only: physical seconds are kept as numerators over the physical
    fraction's denominator (and cost numerators per denominator and rate), raw seconds as
    numerators over the row's split (pods sharing a DRA claim's time), and turned into
    Fractions once per group at the end."""
    buckets = list(bucket_edges) if bucket_edges else [edges[0], edges[-1]]
    bucket_of = [bisect.bisect_right(buckets, b) - 1 for b in edges[:-1]]
    n_buckets = len(buckets) - 1
    # per price class: (physical, priced) GPUs of one row unit, over its split
    fractions: dict[tuple[str, int, Fraction, str | None, int], tuple[Fraction, Fraction]] = {}
    rates: dict[tuple[str | None, int], tuple[Fraction, bool]] = {}
    # per group: {split: raw seconds}, {denominator: numerator}, {(denominator, rate):
    # numerator}, {(denominator, bucket): numerator}, {split: estimated raw seconds},
    # estimated intervals, {(priced denominator, bucket): numerator} (with a rate card)
    acc: dict[tuple[str | None, ...], list[Any]] = {}
    unpriced: set[str] = set()
    seen_models: set[str | None] = set()
    for row in rows:
        seen_models.add(row.gpu_model)
        a = acc.get(row.keys)
        if a is None:
            a = acc[row.keys] = [
                defaultdict(int),
                defaultdict(int),
                defaultdict(int),
                defaultdict(int),
                defaultdict(int),
                0,
                defaultdict(int),
            ]
        fkey = (row.resource_name, row.raw_units, row.share, row.mig_profile, row.split)
        per_row = fractions.get(fkey)
        if per_row is None:
            per_row = fractions[fkey] = (
                physical_per_row(row) / row.split,
                priced_per_row(row, card) / row.split,
            )
        p, q = per_row[0].numerator, per_row[0].denominator
        # the card's MIG fraction prices; it never enters the physical sums
        pp, pq = per_row[1].numerator, per_row[1].denominator
        for i, seconds in enumerate(row.seconds):
            if not seconds:
                continue
            a[0][row.split] += row.raw_units * seconds
            a[1][q] += p * seconds
            a[3][(q, bucket_of[i])] += p * seconds
            if card is not None:
                rkey = (row.gpu_model, edges[i])
                found = rates.get(rkey)
                if found is None:
                    found = rates[rkey] = card.rate(row.gpu_model, edges[i])
                a[2][(pq, found[0], bucket_of[i])] += pp * seconds
                a[6][(pq, bucket_of[i])] += pp * seconds
                if found[1]:
                    unpriced.add(row.gpu_model or "(unknown model)")
        a[4][row.split] += row.raw_units * row.estimated_seconds
        a[5] += row.estimated_intervals
    groups = []
    for key, (raw, phys, cost, series, est_s, est_n, priced) in acc.items():
        g = Group(key, series=[Fraction(0)] * n_buckets)
        g.raw_seconds = _over(raw)
        g.physical_seconds = sum((Fraction(n, q) for q, n in phys.items()), Fraction(0))
        g.bucket_cost = [Fraction(0)] * n_buckets
        for (q, r, b), n in cost.items():
            g.bucket_cost[b] += Fraction(n, q) * r / HOUR
        g.cost = sum(g.bucket_cost, Fraction(0))
        for (q, b), n in series.items():
            g.series[b] += Fraction(n, q)
        if card is None:
            g.priced_series = list(g.series)
        else:
            g.priced_series = [Fraction(0)] * n_buckets
            for (q, b), n in priced.items():
                g.priced_series[b] += Fraction(n, q)
        g.priced_seconds = sum(g.priced_series, Fraction(0))
        g.estimated_raw_seconds, g.estimated_intervals = _over(est_s), est_n
        groups.append(g)
    groups.sort(key=lambda g: (-g.physical_seconds, _sort_key(g.keys)))
    return Report(
        tuple(keys),
        groups,
        card is not None,
        card.currency if card else None,
        unpriced_models=sorted(unpriced),
        unmatched_card_models=sorted(set(card.models) - seen_models) if card else [],
        estimated_intervals=sum(g.estimated_intervals for g in groups),
        bucket_edges=buckets,
    )


def _over(numerators: dict[int, int]) -> Fraction:
    """The sum of numerator / denominator over ``{denominator: numerator}``."""
    if len(numerators) == 1:  # nearly always: one denominator (1: nothing split)
        ((q, n),) = numerators.items()
        return Fraction(n, q)
    return sum((Fraction(n, q) for q, n in numerators.items()), Fraction(0))


def _sort_key(keys: tuple[str | None, ...]) -> tuple[str, ...]:
    return tuple("" if k is None else k for k in keys)


@dataclass(frozen=True)
class QuotaTotal:
    """One resource's quota figures over the whole report: each namespace's quota counted
    once (however many label groups it passed through), its averages over its sampled time."""

    resource_name: str
    avg_used: Fraction
    avg_hard: Fraction
    unused_seconds: Fraction


def quota_figures(
    quotas: Iterable[QuotaRow],
    window_seconds: int,
    query_keys: Sequence[str] = ("namespace",),
    namespace_added: bool = False,
) -> tuple[list[QuotaFigure], list[QuotaTotal]]:
    """Time-weighted quota figures, one per group, quota and resource, sorted by group, and
    the totals per resource.

    Each row's averages are over the time it had samples (unknown time is not zero). The rows
    are per namespace (``query_keys`` name their keys); where the report's groups have no
    namespace key (``namespace_added``: it is the first), the namespaces of one group are
    added up (QuotaFigure)."""
    found: dict[tuple[Any, ...], QuotaFigure] = {}
    # per (namespace and its other plain keys, quota, resource): used, hard, unused, sampled
    own: dict[tuple[Any, ...], list[Fraction]] = {}
    plain_at = [i for i, k in enumerate(query_keys) if not k.startswith("label:")]
    for q in quotas:
        sampled = Fraction(q.sampled_seconds)
        avg_used = Fraction(q.used_seconds) / sampled if sampled else Fraction(0)
        avg_hard = Fraction(q.hard_seconds) / sampled if sampled else Fraction(0)
        whose = (tuple(q.keys[i] for i in plain_at), q.quota_name, q.resource_name)
        acc = own.setdefault(whose, [Fraction(0)] * 4)
        for j, v in enumerate((q.used_seconds, q.hard_seconds, q.unused_seconds)):
            acc[j] += Fraction(v)
        acc[3] += sampled
        keys, name = q.keys, q.quota_name
        if namespace_added:
            keys, name = keys[1:], None
        f = found.get((keys, name, q.resource_name))
        if f is None:
            found[(keys, name, q.resource_name)] = QuotaFigure(
                keys,
                name,
                q.resource_name,
                avg_used,
                avg_hard,
                Fraction(q.unused_seconds),
                sampled,
                None if q.peak_used is None or namespace_added else Fraction(q.peak_used),
                None if q.peak_hard is None or namespace_added else Fraction(q.peak_hard),
                1,
                window_seconds,
            )
            continue
        f.avg_used += avg_used
        f.avg_hard += avg_hard
        f.unused_seconds += Fraction(q.unused_seconds)
        f.sampled_seconds += sampled
        f.namespaces += 1
    figures = list(found.values())
    figures.sort(key=lambda f: (_sort_key(f.keys), f.quota_name or "", f.resource_name))
    sums: dict[str, list[Fraction]] = {}
    for (_keys, _name, resource), (used, hard, unused, sampled) in own.items():
        t = sums.setdefault(resource, [Fraction(0)] * 3)
        if sampled:
            t[0] += used / sampled
            t[1] += hard / sampled
        t[2] += unused
    totals = [QuotaTotal(r, *sums[r]) for r in sorted(sums)]
    return figures, totals


def spread_idle(report: Report, how: Literal["proportional", "even"]) -> None:
    """Share the fleet's idle GPU-hours and cost among the groups: by physical use or evenly."""
    assert report.idle is not None
    seconds = sum((r.idle_seconds for r in report.idle), Fraction(0))
    cost = sum((r.idle_cost for r in report.idle), Fraction(0))
    total = report.physical_total
    groups = report.groups
    for g in groups:
        if how == "proportional" and total:
            share = g.physical_seconds / total
        else:
            share = Fraction(1, len(groups))
        g.idle_seconds = seconds * share
        g.idle_cost = cost * share


def fold_top(report: Report, top: int) -> None:
    """Keep the ``top`` largest groups and fold the rest into one (other) row."""
    if len(report.groups) <= top:
        return
    kept, rest = report.groups[:top], report.groups[top:]
    other = Group(
        tuple([OTHER] * len(report.keys)),
        series=[Fraction(0)] * len(rest[0].series),
        priced_series=[Fraction(0)] * len(rest[0].priced_series),
    )
    for g in rest:
        other.raw_seconds += g.raw_seconds
        other.physical_seconds += g.physical_seconds
        other.priced_seconds += g.priced_seconds
        other.cost += g.cost
        other.estimated_raw_seconds += g.estimated_raw_seconds
        other.estimated_intervals += g.estimated_intervals
        other.series = [a + b for a, b in zip(other.series, g.series, strict=True)]
        other.priced_series = [
            a + b for a, b in zip(other.priced_series, g.priced_series, strict=True)
        ]
        for name in (
            "idle_seconds",
            "idle_cost",
            "utilised_seconds",
            "measured_seconds",
            "used_seconds",
            "sampled_seconds",
            "energy_joules",
            "energy_cost",
            "carbon_grams",
        ):
            value = getattr(g, name)
            if value is not None:
                setattr(other, name, (getattr(other, name) or 0) + value)
    report.groups = [*kept, other]


KWH = 3_600_000  # joules


def attach_ledger(
    report: Report, rows: Iterable[LedgerRow], edges: Sequence[int], card: RateCard | None
) -> None:
    """Add the ledger's used GPU-seconds, sampled seconds, energy, energy cost and carbon to
    the groups (a group the ledger has no rows for keeps None: no usage data). A holder the
    ledger knows but no allocation of the period does (the controller missed it) becomes a
    group of its own with no allocated time. Energy is priced per sub-window at the price
    (and carbon intensity) in force at its start."""
    by_keys = {g.keys: g for g in report.groups}
    buckets = report.bucket_edges or [edges[0], edges[-1]]
    bucket_of = [bisect.bisect_right(buckets, b) - 1 for b in edges[:-1]]
    n_buckets = len(buckets) - 1
    report.energy_priced = card is not None and bool(card.energy_prices)
    report.carbon_priced = card is not None and bool(card.carbon_intensity)
    for row in rows:
        g = by_keys.get(row.keys)
        if g is None:
            g = by_keys[row.keys] = Group(
                row.keys,
                series=[Fraction(0)] * n_buckets,
                priced_series=[Fraction(0)] * n_buckets,
                bucket_cost=[Fraction(0)] * n_buckets,
            )
            report.groups.append(g)
        if not g.bucket_energy:
            g.bucket_energy = [Fraction(0)] * n_buckets
            g.bucket_energy_cost = [Fraction(0)] * n_buckets
        for i, e in enumerate(row.energy):
            g.bucket_energy[bucket_of[i]] += Fraction(e)
            if card is not None:
                price = card.energy_price(edges[i]) or 0
                g.bucket_energy_cost[bucket_of[i]] += Fraction(e) * price / KWH
        g.used_seconds = (g.used_seconds or Fraction(0)) + Fraction(row.used_seconds)
        g.sampled_seconds = (g.sampled_seconds or Fraction(0)) + Fraction(row.sampled_seconds)
        joules = sum((Fraction(e) for e in row.energy), Fraction(0))
        g.energy_joules = (g.energy_joules or Fraction(0)) + joules
        if report.energy_priced:
            g.energy_cost = sum(g.bucket_energy_cost, Fraction(0))
        if card is not None and report.carbon_priced:
            grams = sum(
                (
                    Fraction(e) * (card.carbon(edges[i]) or 0) / KWH
                    for i, e in enumerate(row.energy)
                ),
                Fraction(0),
            )
            g.carbon_grams = (g.carbon_grams or Fraction(0)) + grams
    report.groups.sort(key=lambda g: (-g.physical_seconds, _sort_key(g.keys)))


def idle_runs(
    windows: Iterable[HolderWindow],
    threshold: Fraction,
    min_seconds: int,
    lo: int,
    hi: int,
    ingested: dict[str, int] | None = None,
) -> list[IdleAllocation]:
    """The contract's idle rule over each holder's ledger windows (sorted by holder, then
    time): maximal runs of consecutive windows (each starting where the last ended) whose
    activity (quota/ledger/rules.py ``activity``: used / (sampled x physical GPUs held), the
    controller's rule) stayed under ``threshold``,
    lasting at least ``min_seconds`` inside [lo, hi). A window without samples ends a run:
    unknown is not idle. A run is still idle only where the period reaches as far as the
    ledger is ingested (``ingested``, per cluster); else it closes at the period's end."""
    out: list[IdleAllocation] = []
    run: list[HolderWindow] = []

    def close(still: bool) -> None:
        if not run:
            return
        since, until = max(run[0].start, lo), min(run[-1].end, hi)
        # a run reaching past the period closes at its end: still idle only where the period
        # reaches the newest ledger window
        reach = (ingested or {}).get(run[0].cluster)
        still = still and run[-1].end <= hi and (reach is None or hi >= reach)
        if until - since >= min_seconds:
            first = run[0]
            used = sum((Fraction(w.used) for w in run), Fraction(0))
            sampled = sum((Fraction(w.sampled_physical) for w in run), Fraction(0))
            part = [Fraction(min(w.end, hi) - max(w.start, lo), w.end - w.start) for w in run]
            idle_s = sum(
                (
                    max(Fraction(w.sampled_physical) - Fraction(w.used), Fraction(0)) * p
                    for w, p in zip(run, part, strict=True)
                ),
                Fraction(0),
            )
            out.append(
                IdleAllocation(
                    first.cluster,
                    first.namespace,
                    first.holder_kind,
                    first.name,
                    first.owner,
                    first.gpus,
                    since,
                    until,
                    still and first.open,
                    idle_s,
                    used / sampled if sampled else Fraction(0),
                )
            )
        run.clear()

    previous: HolderWindow | None = None
    for w in windows:
        same = previous is not None and previous.holder == w.holder
        if not same:
            close(previous is not None and previous.last_ingested)
        elif previous is not None and w.start != previous.end:
            close(False)
        found = rules.activity(w.used, w.sampled, float(w.gpus))
        quiet = found is not None and found < threshold
        if quiet:
            run.append(w)
        else:
            close(False)
        previous = w
    close(previous is not None and previous.last_ingested)
    out.sort(key=lambda r: (-r.idle_seconds, r.cluster, r.namespace, r.name, r.since))
    return out


def round_half_up(x: Fraction) -> int:
    """The integer nearest ``x``, halves away from zero: the report's one rounding rule
    (render.py), applied to each figure's own exact value."""
    n = int((abs(x) + Fraction(1, 2)).__floor__())
    return -n if x < 0 else n
