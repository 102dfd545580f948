"""Figures per charge period (a calendar day, split where a price changes) that the report's
own tables keep whole for the period: the usage ledger's used GPU-seconds per group, and each
cluster's idle capacity per GPU model and node pool. The FOCUS export (focus.py) writes a row
per charge period of each, so a daily trend shows them as it shows the allocations.

Each day is the report's own rule applied to a shorter window, so the days add up to the
period's figures: the ledger's windows are cut pro rata at every edge (query.ledger), and idle
is allocatable minus allocated per sub-window, the day edges being among the sub-windows.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

from sqlalchemy.engine import Connection

from gpuquota.quota.report import compute, query
from gpuquota.quota.report.allocations import UsageRow
from gpuquota.quota.report.capacity import CapacityRow
from gpuquota.quota.report.idle import idle
from gpuquota.quota.report.ratecard import RateCard
from gpuquota.quota.report.scope import Scope

JOB = "ledger_bucket_"  # the name of bucket b's read among the report's reads


def bucket_jobs(
    keys: Sequence[str], buckets: Sequence[int], now: int, scope: Scope
) -> dict[str, Callable[[Connection], list[query.LedgerRow]]]:
    """One read a bucket [buckets[b], buckets[b + 1]) of the ledger's rows per group, each over
    that bucket's windows only (index ix_usage_windows_start): build.run_reads spreads them
    over its readers."""

    def read(lo: int, hi: int) -> Callable[[Connection], list[query.LedgerRow]]:
        return lambda c: query.ledger(c, keys, [lo, hi], now, scope) if min(hi, now) > lo else []

    return {f"{JOB}{b}": read(lo, hi) for b, (lo, hi) in enumerate(itertools.pairwise(buckets))}


def gather(found: dict[str, Any], n: int) -> list[list[query.LedgerRow]]:
    """The buckets' rows in order, taken out of ``found`` (the reads' results by name)."""
    return [found.pop(f"{JOB}{b}") for b in range(n)]


def used_by_bucket(
    per_bucket: Sequence[Sequence[query.LedgerRow]],
) -> dict[tuple[str | None, ...], list[Fraction]]:
    """Used physical GPU-seconds per group key and bucket."""
    n = len(per_bucket)
    out: dict[tuple[str | None, ...], list[Fraction]] = {}
    for b, rows in enumerate(per_bucket):
        for row in rows:
            out.setdefault(row.keys, [Fraction(0)] * n)[b] += Fraction(row.used_seconds)
    return out


def idle_by_bucket(
    capacity: Sequence[CapacityRow],
    allocated: Sequence[UsageRow],
    edges: Sequence[int],
    buckets: Sequence[int],
    card: RateCard | None,
    covered: dict[str, list[tuple[int, int]]],
) -> dict[str, list[list[compute.IdleRow]]]:
    """Per cluster and bucket, the idle rows per GPU model and node pool (idle.idle over the
    bucket's sub-windows: covered time only). ``edges`` are the idle view's sub-windows, which
    include every bucket edge; ``allocated`` rows are keyed (model, pool, cluster)."""
    clusters = sorted(
        {c.cluster for c in capacity if c.cluster is not None}
        | {u.keys[2] for u in allocated if len(u.keys) > 2 and u.keys[2] is not None}
    )
    out: dict[str, list[list[compute.IdleRow]]] = {}
    for cluster in clusters:
        caps = [c for c in capacity if c.cluster == cluster]
        used = [u for u in allocated if len(u.keys) > 2 and u.keys[2] == cluster]
        days: list[list[compute.IdleRow]] = []
        for lo, hi in itertools.pairwise(buckets):
            first, last = edges.index(lo), edges.index(hi)
            part = slice(first, last)
            days.append(
                idle(
                    [dataclasses.replace(c, seconds=c.seconds[part]) for c in caps],
                    [dataclasses.replace(u, seconds=u.seconds[part]) for u in used],
                    edges[first : last + 1],
                    card,
                    covered,
                )
            )
        out[cluster] = days
    return out
