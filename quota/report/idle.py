"""The idle table, pure: allocatable minus allocated physical GPU-seconds per GPU model and node
pool, over the time the store covers, priced at the model's rate in force.

Covered time (docs/report.md) is, per cluster, the part of the period after its data begins,
before it ends and outside every gap of a kind that holds or offers GPUs: capacity outside it is
never idle and never priced, allocations outside it are billed but not set against capacity.
The reads are quota/report/capacity.py and quota/report/allocations.py.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from gpuquota.quota.report.allocations import UsageRow
from gpuquota.quota.report.capacity import CapacityRow
from gpuquota.quota.report.physical import HOUR, physical_per_row
from gpuquota.quota.report.ratecard import RateCard
from gpuquota.quota.report.scope import GapRecord


@dataclass
class IdleRow:
    gpu_model: str | None
    node_pool: str | None
    allocatable_seconds: Fraction = Fraction(0)  # physical
    allocated_seconds: Fraction = Fraction(0)  # physical
    idle_seconds: Fraction = Fraction(0)
    idle_cost: Fraction = Fraction(0)
    # allocatable physical GPU-seconds outside the covered time: neither idle nor priced
    uncovered_seconds: Fraction = Fraction(0)
    # allocated physical GPU-seconds outside it (billed, but not set against capacity):
    # allocated + this = the usage table's GPU-h phys of the model and pool
    uncovered_allocated_seconds: Fraction = Fraction(0)


# gap kinds that say nothing about GPUs held or allocatable: their spans stay covered
GAP_KINDS_COVERED = frozenset({"ResourceQuota", "Namespace"})


def covered_spans(
    clusters: Iterable[str],
    begins: dict[str, int],
    ends: dict[str, int],
    gaps: Iterable[GapRecord],
    lo: int,
    hi: int,
) -> dict[str, list[tuple[int, int]]]:
    """Per cluster, the parts of [lo, hi) the store covers: after its data begins (the first
    time the store knew the cluster, moved to a prune's cut by ``db prune``), before it ends
    (the last heartbeat or replayed event) and outside every recorded gap of a kind that
    holds or offers GPUs (pods, nodes, claims). Unknown time is never priced: the idle view
    counts capacity only here. A cluster without a clusters row (or heartbeat) is taken as
    covered from ``lo`` (up to ``hi``)."""
    out: dict[str, list[tuple[int, int]]] = {}
    holes: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for gap in gaps:
        if gap.kind not in GAP_KINDS_COVERED:
            holes[gap.cluster].append((gap.started_at, gap.ended_at))
    for cluster in clusters:
        a, b = max(lo, begins.get(cluster, lo)), min(hi, ends.get(cluster, hi))
        spans: list[tuple[int, int]] = []
        cursor = a
        for g0, g1 in sorted(holes.get(cluster, [])):
            if g0 > cursor:
                spans.append((cursor, min(g0, b)))
            cursor = max(cursor, g1)
            if cursor >= b:
                break
        if cursor < b:
            spans.append((cursor, b))
        out[cluster] = [(x, y) for x, y in spans if y > x]
    return out


def span_edges(covered: dict[str, list[tuple[int, int]]]) -> list[int]:
    """Every boundary of the covered spans: sub-window cuts, so that each sub-window is wholly
    inside or wholly outside a cluster's covered time."""
    return sorted({t for spans in covered.values() for span in spans for t in span})


def _is_covered(
    covered: dict[str, list[tuple[int, int]]] | None, cluster: str | None, a: int, b: int
) -> bool:
    if covered is None or cluster is None or cluster not in covered:
        return covered is None or cluster is None
    return any(x <= a and b <= y for x, y in covered[cluster])


def idle(
    capacity: Iterable[CapacityRow],
    allocated: Iterable[UsageRow],
    edges: Sequence[int],
    card: RateCard | None,
    covered: dict[str, list[tuple[int, int]]] | None = None,
) -> list[IdleRow]:
    """Idle physical GPU-seconds per (model, pool): allocatable minus allocated, per sub-window
    (never below zero), priced at the model's rate in force.

    Only covered time counts (``covered``: per cluster, :func:`covered_spans`; ``edges`` must
    include their boundaries; the allocated rows then carry the cluster as their third key):
    allocatable seconds outside it are kept apart as ``uncovered_seconds``, never idle, and
    allocated seconds outside it as ``uncovered_allocated_seconds``, so that allocated and
    uncovered allocated add up to the usage table's physical GPU-seconds. Both sides are the
    store's physical GPUs (:func:`physical_per_row`): a rate card's ``mig_fractions`` only
    price, so they never move idle."""
    cap: dict[tuple[str | None, str | None], list[Fraction]] = {}
    uncovered: dict[tuple[str | None, str | None], Fraction] = defaultdict(Fraction)
    uncovered_used: dict[tuple[str | None, str | None], Fraction] = defaultdict(Fraction)
    n = len(edges) - 1
    for c in capacity:
        per = physical_per_row(c)
        key = (c.gpu_model, c.node_pool)
        acc = cap.setdefault(key, [Fraction(0)] * n)
        for i, s in enumerate(c.seconds):
            if _is_covered(covered, c.cluster, edges[i], edges[i + 1]):
                acc[i] += per * s
            else:
                uncovered[key] += per * s
    used: dict[tuple[str | None, str | None], list[Fraction]] = {}
    for u in allocated:
        per = physical_per_row(u) / u.split
        cluster = u.keys[2] if len(u.keys) > 2 else None
        key = (u.keys[0], u.keys[1])
        acc = used.setdefault(key, [Fraction(0)] * n)
        for i, s in enumerate(u.seconds):
            if _is_covered(covered, cluster, edges[i], edges[i + 1]):
                acc[i] += per * s
            else:
                uncovered_used[key] += per * s
    rows = []
    for key in sorted(set(cap) | set(used), key=lambda k: (k[0] or "", k[1] or "")):
        c_s, u_s = cap.get(key, [Fraction(0)] * n), used.get(key, [Fraction(0)] * n)
        row = IdleRow(key[0], key[1], sum(c_s, Fraction(0)), sum(u_s, Fraction(0)))
        row.uncovered_seconds = uncovered.get(key, Fraction(0))
        row.uncovered_allocated_seconds = uncovered_used.get(key, Fraction(0))
        for i in range(n):
            free = max(c_s[i] - u_s[i], Fraction(0))
            row.idle_seconds += free
            if card is not None:
                row.idle_cost += free * card.rate(key[0], edges[i])[0] / HOUR
        rows.append(row)
    return rows
