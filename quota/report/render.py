"""Formatting of a computed report: terminal table, CSV and JSON.

One rounding rule, the same in every view (docs/report.md, "Rounding"): each figure the table
prints is rounded half up from its own exact value (so the same seconds print the same figure
in every row and every view, whatever the neighbours or --top), and a total is rounded from
the exact sum of its rows, so it is within the rounding of the printed rows (at most half a
unit of the last place per row away from their sum). CSV and JSON carry the exact values,
unrounded (as the nearest binary double).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

from gpuquota.quota.report.compute import (
    HOUR,
    KWH,
    Group,
    IdleAllocation,
    QuotaFigure,
    Report,
    round_half_up,
)
from gpuquota.quota.report.idle import IdleRow
from gpuquota.quota.report.period import Period

Total = Literal["sum", "none", "ratio"]


@dataclass(frozen=True)
class Column:
    name: str  # CSV / JSON field
    header: str  # table heading
    decimals: int
    value: Callable[[Group], Fraction | None]
    total: Total = "sum"
    # for "ratio" totals: numerator and denominator getters, result shown as a percentage
    ratio: tuple[Callable[[Group], Fraction | None], Callable[[Group], Fraction | None]] | None = (
        None
    )


def _hours(get: Callable[[Group], Fraction | int | None]) -> Callable[[Group], Fraction | None]:
    def value(g: Group) -> Fraction | None:
        v = get(g)
        return None if v is None else Fraction(v) / HOUR

    return value


def columns(report: Report) -> list[Column]:
    total = report.physical_total
    cols = [
        Column("gpu_hours_raw", "GPU-h raw", 2, _hours(lambda g: g.raw_seconds)),
        Column("gpu_hours_physical", "GPU-h phys", 2, _hours(lambda g: g.physical_seconds)),
    ]
    if report.priced and any(g.priced_seconds != g.physical_seconds for g in report.groups):
        # the rate card prices some MIG profile at its own fraction: the GPU-hours the cost is
        # of, apart from the physical ones (which it never changes)
        cols.append(
            Column("gpu_hours_priced", "GPU-h priced", 2, _hours(lambda g: g.priced_seconds))
        )
    if report.priced:
        cols.append(
            Column(f"cost_{report.currency}", f"cost {report.currency}", 2, lambda g: g.cost)
        )
    cols.append(
        Column(
            "share_pct",
            "share %",
            2,
            lambda g: g.physical_seconds * 100 / total if total else Fraction(0),
        )
    )
    cols.append(
        Column(
            "estimated_gpu_hours_raw", "est. GPU-h", 2, _hours(lambda g: g.estimated_raw_seconds)
        )
    )
    if any(g.idle_seconds is not None for g in report.groups):
        # the group's share of the idle table's total: its own name, not the table's
        cols.append(
            Column(
                "spread_idle_gpu_hours", "spread idle GPU-h", 2, _hours(lambda g: g.idle_seconds)
            )
        )
        if report.priced:
            cols.append(
                Column(
                    f"spread_idle_cost_{report.currency}",
                    f"spread idle {report.currency}",
                    2,
                    lambda g: g.idle_cost,
                )
            )
    if report.ledger:
        cols += ledger_columns(report)
    if report.prometheus is not None:
        used = _hours(lambda g: g.utilised_seconds)
        sampled = _hours(lambda g: g.measured_seconds)
        phys = _hours(lambda g: g.physical_seconds)
        cols += [
            _percent("measured_pct", "prom measured %", sampled, phys),
            _percent("utilisation_pct", "prom util %", used, sampled),
            Column("used_gpu_hours", "prom busy GPU-h", 2, used),
            Column(
                "idle_while_allocated_gpu_hours",
                "prom not-busy GPU-h",
                2,
                _hours(
                    lambda g: (
                        None
                        if g.utilised_seconds is None or g.measured_seconds is None
                        else max(g.measured_seconds - g.utilised_seconds, Fraction(0))
                    )
                ),
            ),
        ]
    return cols


def ledger_columns(report: Report) -> list[Column]:
    """The usage ledger's columns: used, efficiency, idle-allocated, energy, its cost and
    carbon, coverage. Blank (null) for a group the ledger has no rows for: no data, not 0."""
    cols = [
        Column("gpu_hours_used", "used GPU-h", 2, _hours(lambda g: g.used_seconds)),
        _percent(
            "efficiency_pct",
            "eff. %",
            lambda g: g.used_seconds,
            lambda g: g.measured_allocated_seconds,
        ),
        Column(
            "gpu_hours_idle_allocated",
            "idle alloc GPU-h",
            2,
            _hours(lambda g: g.idle_allocated_seconds),
        ),
        Column(
            "energy_kwh",
            "energy kWh",
            2,
            lambda g: None if g.energy_joules is None else g.energy_joules / KWH,
        ),
    ]
    if report.energy_priced:
        cols.append(
            Column(
                f"energy_cost_{report.currency}",
                f"energy {report.currency}",
                2,
                lambda g: g.energy_cost,
            )
        )
    if report.carbon_priced:
        cols.append(
            Column(
                "carbon_kg_co2e",
                "kg CO2e",
                2,
                lambda g: None if g.carbon_grams is None else g.carbon_grams / 1000,
            )
        )
    cols.append(
        Column(
            "usage_coverage_pct",
            "coverage %",
            1,
            lambda g: None if g.coverage is None else g.coverage * 100,
            "ratio",
            # the total is over every group's allocated time: one without usage data counts
            # as not covered
            (lambda g: g.sampled_seconds or Fraction(0), lambda g: Fraction(g.raw_seconds)),
        )
    )
    return cols


def _percent(
    name: str,
    header: str,
    part: Callable[[Group], Fraction | None],
    whole: Callable[[Group], Fraction | None],
) -> Column:
    """part / whole as a percentage, blank where either is missing or the whole is zero; its
    total is the ratio of the sums over the groups that have both."""

    def value(g: Group) -> Fraction | None:
        a, b = part(g), whole(g)
        return None if a is None or not b else a * 100 / b

    return Column(name, header, 1, value, "ratio", (part, whole))


@dataclass(frozen=True)
class Cell:
    scaled: int | None  # value in units of 10**-decimals; None: blank
    decimals: int
    exact: Fraction | None = None  # the unrounded value (CSV and JSON carry it)

    def text(self) -> str:
        """The table's figure: rounded half up to ``decimals`` places."""
        return "" if self.scaled is None else format_scaled(self.scaled, self.decimals)

    def number(self) -> float | None:
        """The exact value as the nearest double (JSON)."""
        if self.scaled is None:
            return None
        return float(self.exact) if self.exact is not None else self.scaled / 10**self.decimals

    def machine(self) -> str:
        """The exact value as text (CSV): the shortest repr of the nearest double."""
        value = self.number()
        return "" if value is None else exact_text(value)


def exact_text(value: float) -> str:
    """A machine format's number: whole numbers without a fraction, else Python's shortest
    round-tripping repr (never an exponent for the sizes a bill has)."""
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value)}.0"
    text = repr(value)
    return text if "e" not in text else f"{value:.17f}".rstrip("0")


def cell(value: Fraction | None, decimals: int) -> Cell:
    """One figure under the rounding rule: rounded half up from its own exact value."""
    if value is None:
        return Cell(None, decimals)
    exact = Fraction(value)
    return Cell(round_half_up(exact * 10**decimals), decimals, exact)


def format_scaled(n: int, decimals: int) -> str:
    sign = "-" if n < 0 else ""
    whole, frac = divmod(abs(n), 10**decimals)
    return f"{sign}{whole}.{frac:0{decimals}d}" if decimals else f"{sign}{whole}"


def table_cells(
    groups: Sequence[Group], cols: Sequence[Column]
) -> tuple[list[list[Cell]], list[Cell]]:
    """Cells per row and the totals row: each rounded from its own exact value (a total from
    the exact sum of its rows)."""
    rows: list[list[Cell]] = [[] for _ in groups]
    totals: list[Cell] = []
    for col in cols:
        raw = [col.value(g) for g in groups]
        for r, v in zip(rows, raw, strict=True):
            r.append(cell(v, col.decimals))
        if col.total == "sum":
            present = [v for v in raw if v is not None]
            totals.append(cell(sum(present, Fraction(0)) if present else None, col.decimals))
        else:
            total_cell = Cell(None, col.decimals)
            if col.total == "ratio" and col.ratio is not None:
                num = [col.ratio[0](g) for g in groups]
                den = [col.ratio[1](g) for g in groups]
                n = sum(
                    (a for a, b in zip(num, den, strict=True) if a is not None and b), Fraction(0)
                )
                d = sum(
                    (b for a, b in zip(num, den, strict=True) if a is not None and b), Fraction(0)
                )
                if d:
                    total_cell = cell(n * 100 / d, col.decimals)
            totals.append(total_cell)
    return rows, totals


# decimals of gpu_seconds_raw where a shared DRA claim's time is split among its pods
RAW_SECONDS_SPLIT_DECIMALS = 3


def raw_seconds_cells(groups: Sequence[Group]) -> tuple[list[Cell], Cell]:
    """``gpu_seconds_raw`` per row and its total: whole unit-seconds, exact, unless a shared DRA
    claim's time is split among its pods (a pod-level key); then the exact value."""
    values = [Fraction(g.raw_seconds) for g in groups]
    whole = all(v.denominator == 1 for v in values)
    decimals = 0 if whole else RAW_SECONDS_SPLIT_DECIMALS
    return [cell(v, decimals) for v in values], cell(sum(values, Fraction(0)), decimals)


def _raw_number(c: Cell) -> int | float | None:
    """A JSON number: an integer where the value is whole seconds."""
    return c.scaled if c.decimals == 0 else c.number()


def _key_text(value: str | None) -> str:
    return "(none)" if value is None else value


def idle_columns(
    priced: bool, currency: str | None
) -> list[tuple[str, str, int, Callable[[IdleRow], Fraction]]]:
    cols: list[tuple[str, str, int, Callable[[IdleRow], Fraction]]] = [
        ("allocatable_gpu_hours", "allocatable GPU-h", 2, lambda r: r.allocatable_seconds / HOUR),
        ("allocated_gpu_hours", "allocated GPU-h", 2, lambda r: r.allocated_seconds / HOUR),
        ("idle_gpu_hours", "idle GPU-h", 2, lambda r: r.idle_seconds / HOUR),
    ]
    if priced:
        cols.append((f"idle_cost_{currency}", f"idle cost {currency}", 2, lambda r: r.idle_cost))
    cols.append(
        (
            "uncovered_allocatable_gpu_hours",
            "uncovered GPU-h",
            2,
            lambda r: r.uncovered_seconds / HOUR,
        )
    )
    cols.append(
        (
            "uncovered_allocated_gpu_hours",
            "uncovered alloc GPU-h",
            2,
            lambda r: r.uncovered_allocated_seconds / HOUR,
        )
    )
    return cols


def idle_cells(report: Report) -> tuple[list[str], list[list[Cell]], list[Cell]]:
    """Field names, one row of cells per model and pool (after the two key cells), and the
    totals: each cell rounded from its own exact value."""
    assert report.idle is not None
    cols = idle_columns(report.priced, report.currency)
    rows: list[list[Cell]] = [[] for _ in report.idle]
    totals: list[Cell] = []
    for _name, _header, decimals, get in cols:
        values = [get(r) for r in report.idle]
        for row, v in zip(rows, values, strict=True):
            row.append(cell(v, decimals))
        totals.append(cell(sum(values, Fraction(0)), decimals))
    # idle share of allocatable, a ratio: not summed
    for row, r in zip(rows, report.idle, strict=True):
        row.append(_pct_cell(r.idle_seconds, r.allocatable_seconds))
    totals.append(
        _pct_cell(
            sum((r.idle_seconds for r in report.idle), Fraction(0)),
            sum((r.allocatable_seconds for r in report.idle), Fraction(0)),
        )
    )
    names = ["model", "node_pool", *[c[0] for c in cols], "idle_pct"]
    return names, rows, totals


def _pct_cell(a: Fraction, b: Fraction) -> Cell:
    return cell(a * 100 / b if b else None, 1)


QuotaGetter = Callable[[QuotaFigure], Fraction | None]
# (field, heading, getter, summed in the per-resource totals)
QUOTA_COLUMNS: list[tuple[str, str, QuotaGetter, bool]] = [
    ("quota_avg_used", "avg used", lambda f: f.avg_used, True),
    ("quota_peak_used", "peak used", lambda f: f.peak_used, False),
    ("quota_avg_hard", "avg hard", lambda f: f.avg_hard, True),
    ("quota_peak_hard", "peak hard", lambda f: f.peak_hard, False),
    ("quota_unused_gpu_hours", "unused units-h", lambda f: f.unused_seconds / HOUR, True),
]


def quota_cells(report: Report) -> tuple[list[str], list[list[Cell]], list[list[Cell]]]:
    """Field names (after the keys, quota and resource), one row of cells per
    group/quota/resource, and one total row per resource (figures of different resources are
    different units: they are never added up). A total counts each namespace's quota once
    (compute.QuotaTotal), so it need not be the sum of label groups a namespace moved
    between; peaks and the sampled share have none."""
    assert report.quota is not None
    figures = report.quota
    names = [*[c[0] for c in QUOTA_COLUMNS], "sampled_pct"]
    rows: list[list[Cell]] = [[] for _ in figures]
    resources = sorted({f.resource_name for f in figures})
    totals: list[list[Cell]] = [[] for _ in resources]
    whole = {t.resource_name: t for t in report.quota_totals}
    for name, _header, get, summed in QUOTA_COLUMNS:
        for t, resource in zip(totals, resources, strict=True):
            members = [i for i, f in enumerate(figures) if f.resource_name == resource]
            for i in members:
                rows[i].append(cell(get(figures[i]), 2))
            total = whole.get(resource)
            value = None
            if summed and total is not None:
                value = {
                    "quota_avg_used": total.avg_used,
                    "quota_avg_hard": total.avg_hard,
                    "quota_unused_gpu_hours": total.unused_seconds / HOUR,
                }[name]
            t.append(cell(value, 2))
    for row, f in zip(rows, figures, strict=True):
        row.append(cell(f.coverage * 100, 1))
    for t in totals:
        t.append(Cell(None, 1))
    return names, rows, totals


def quota_keys(report: Report, f: QuotaFigure) -> list[str]:
    """The key cells of a quota row: the group's keys, the quota's name and the resource."""
    return [*map(_key_text, f.keys), f.quota_name or "", f.resource_name]


def notes(report: Report) -> list[str]:
    out = coverage_notes(report) + gap_notes(report)
    if report.estimated_intervals:
        est = sum(g.estimated_raw_seconds for g in report.groups)
        out.append(
            f"{report.estimated_intervals} interval(s) ({format_scaled(round(Fraction(est * 100, HOUR)), 2)} "
            "raw GPU-h) were closed by estimate: the pods vanished while the controller was down "
            "(column est. GPU-h)"
        )
    if report.unpriced_models:
        out.append(
            "priced at the default rate (not in the rate card): "
            + ", ".join(report.unpriced_models)
        )
    if report.unmatched_card_models:
        out.append(
            "rate card models that match no GPU used in this period (a misspelt model name "
            "prices nothing): " + ", ".join(report.unmatched_card_models)
        )
    if report.best_effort_pods:
        pods = sum(report.best_effort_pods.values())
        where = ", ".join(f"{ns} ({n})" for ns, n in sorted(report.best_effort_pods.items()))
        out.append(
            f"{pods} pod(s) held GPUs while BestEffort, so NotBestEffort-scoped quotas did "
            f"not count them (give them cpu/memory requests): {where}"
        )
    return (
        out
        + ledger_notes(report)
        + quota_notes(report)
        + prometheus_notes(report)
        + pool_notes(report)
        + label_notes(report)
    )


def label_notes(report: Report) -> list[str]:
    """A label key no namespace carried in the period: every row reads (none), which would
    otherwise look like a real answer (a misspelt key, a label added after the period)."""
    out = []
    for at, key in enumerate(report.keys):
        used = [g for g in report.groups if g.raw_seconds]
        if key.startswith("label:") and used and all(g.keys[at] is None for g in used):
            out.append(
                f"--by {key}: no namespace carried the label {key[len('label:') :]!r} in this "
                "period, so every row is (none): check the key's spelling"
            )
    return out


def ledger_notes(report: Report) -> list[str]:
    """Where the usage ledger has no data, or covers only part of the allocated time."""
    if not report.ledger:
        return []
    out = []
    missing = [g for g in report.groups if g.used_seconds is None and g.raw_seconds]
    if missing:
        names = ", ".join(" / ".join(map(_key_text, g.keys)) for g in missing)
        out.append(
            f"no usage data (the usage ledger has no rows; used, energy and coverage blank, "
            f"not zero) for: {names}"
        )
    sampled = sum((g.sampled_seconds or Fraction(0) for g in report.groups), Fraction(0))
    raw = sum((Fraction(g.raw_seconds) for g in report.groups), Fraction(0))
    if raw and sampled < raw:
        out.append(
            f"the usage ledger covers {format_scaled(round(min(sampled / raw, Fraction(1)) * 1000), 1)}% "
            "of the allocated GPU-seconds (column coverage %): efficiency and idle-allocated "
            "GPU-h are over the covered part only"
        )
    for cluster, joules in sorted(report.unallocated_energy.items()):
        out.append(
            f"GPUs nobody held in cluster {cluster!r} used {format_scaled(round(joules * 100 / KWH), 2)} "
            "kWh (the nodes' idle GPU energy, charged to no group)"
        )
    cut = report.ledger_cut
    if cut.windows:
        longest = cut.longest_seconds
        span = f"{longest // HOUR} h" if longest % HOUR == 0 else f"{longest // 60} min"
        out.append(
            f"the period's start or end cuts {cut.windows} usage-ledger window(s), up to {span} "
            f"long: {format_scaled(round(Fraction(cut.used_seconds) * 100 / HOUR), 2)} used "
            "GPU-h come from them pro rata to time, not as measured inside the period (days "
            "rolled up in another time zone than --tz, or edges inside a window); report in the "
            "zone the controller rolls days up in (--ledger-rollup-tz), on whole windows, for "
            "exact figures"
        )
    for cluster, until in sorted(report.ledger_until.items()):
        if until < report.window_end:
            out.append(
                f"the usage ledger of cluster {cluster!r} is ingested up to {_utc(until)}: "
                "usage after it is not in the used and energy columns yet"
            )
    return out


def pool_notes(report: Report) -> list[str]:
    """A pool shown as (none) is a node without any of the labels the controller reads."""
    unnamed = (
        "pool" in report.keys
        and any(g.keys[report.keys.index("pool")] is None and g.raw_seconds for g in report.groups)
    ) or any(r.node_pool is None for r in report.idle or [])
    if not unnamed:
        return []
    return [
        "node pool (none): those nodes carried none of the node pool labels the controller "
        "(or replay) was told to read; name yours with --node-pool-label or "
        "GPUQUOTA_NODE_POOL_LABELS there (new intervals record it)"
    ]


def coverage_notes(report: Report) -> list[str]:
    """Where the period reaches past the data a cluster's store holds."""
    if not report.coverage:
        return [
            "the store holds no cluster's data yet (run `gpuquota controller` or "
            "`gpuquota replay`): nothing to report"
        ]
    out = []
    whole = [(report.window_start, report.window_end)]
    # a live controller's heartbeat trails now by a flush or so: that is no end worth a note
    live = {
        c
        for c, spans in report.covered.items()
        if len(spans) == 1 and spans[0][0] == report.window_start and c not in report.ends_early
    }
    partial = {c: spans for c, spans in report.covered.items() if spans != whole and c not in live}
    if partial:
        where = "; ".join(
            f"cluster {c!r} " + (", ".join(f"{_utc(a)} .. {_utc(b)}" for a, b in spans) or "none")
            for c, spans in sorted(report.covered.items())
        )
        out.append(
            f"covered time: {where} (where the data begins and ends, less recorded gaps; "
            "allocatable capacity and idle count only this time)"
        )
    uncovered = sum((r.uncovered_seconds for r in report.idle or []), Fraction(0))
    if uncovered:
        out.append(
            f"{cell(uncovered / HOUR, 2).text()} allocatable GPU-h fall outside the covered "
            "time (column uncovered GPU-h): not priced, not idle"
        )
    uncovered_used = sum((r.uncovered_allocated_seconds for r in report.idle or []), Fraction(0))
    if uncovered_used:
        out.append(
            f"{cell(uncovered_used / HOUR, 2).text()} allocated GPU-h fall outside the covered "
            "time (column uncovered alloc GPU-h): billed in the usage table, not set against "
            "capacity"
        )
    for cluster, until in sorted(report.ends_early.items()):
        if until < report.window_end:
            out.append(
                f"the data of cluster {cluster!r} ends at {_utc(until)} (its last heartbeat or "
                "replayed event): the period reaches past it, and allocations still open then "
                "are counted up to that time only"
            )
    for cluster, since in sorted(report.begins_late.items()):
        out.append(
            f"the data of cluster {cluster!r} begins at {_utc(since)} (the first time the store "
            "knew it): before it the period is not covered; only allocations still running then "
            "are counted, from their start"
        )
    return out


def gap_notes(report: Report) -> list[str]:
    """One note per stored gap span the period overlaps: the figures are lower bounds there.
    The kinds of one span (a restart's downtime leaves one gap per watched kind) share a note,
    pods named last."""
    spans: dict[tuple[str, int, int, str], list[str]] = {}
    for gap in report.gaps:
        spans.setdefault((gap.cluster, gap.started_at, gap.ended_at, gap.reason), []).append(
            gap.kind
        )
    out = []
    for (cluster, started_at, ended_at, reason), kinds in spans.items():
        why = (
            "the controller was down and its resumed watch could not replay the events"
            if reason == "restart"
            else "its watch expired (410 Gone) and it relisted"
        )
        named = ", ".join(sorted(set(kinds), key=lambda kind: (kind == "Pod", kind)))
        what = f"{named} objects" if len(set(kinds)) == 1 else "objects of these kinds"
        out.append(
            f"gap in the record of cluster {cluster!r}: {named} not followed from "
            f"{_utc(started_at)} to {_utc(ended_at)} ({_duration(ended_at - started_at)}; "
            f"{why}): {what} created and deleted inside it may be missing, so figures "
            "over it are lower bounds"
        )
    return out


def _duration(seconds: int) -> str:
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def quota_notes(report: Report) -> list[str]:
    if report.quota is None:
        return []
    if not report.quota:
        return ["no quota samples in this period: no ResourceQuota on GPU resources was recorded"]
    with_quota = {f.keys for f in report.quota}
    missing = [g.keys for g in report.groups if g.keys not in with_quota]
    if not missing:
        return []
    names = ", ".join(" / ".join(map(_key_text, k)) for k in missing)
    return [f"no quota samples (no quota figures, not zero) for: {names}"]


def prometheus_notes(report: Report) -> list[str]:
    if report.prometheus is None:
        return []
    out = []
    if report.ledger:
        out.append(
            f"two activity sources on this page: the prom columns are Prometheus' answers at "
            f"{report.prometheus} (the exporter's utilisation: time the GPU was busy), the "
            "used GPU-h, eff. % and idle alloc GPU-h columns the usage ledger (per-process "
            "samples the controller ingested); they measure differently and need not agree"
        )
    missing = [g for g in report.groups if g.measured_seconds is None and g.physical_seconds]
    if missing:
        names = ", ".join(" / ".join(map(_key_text, g.keys)) for g in missing)
        out.append(
            f"Prometheus at {report.prometheus} has no utilisation samples for: {names} "
            "(util % blank: no data, not idle)"
        )
    measured = sum((g.measured_seconds or Fraction(0) for g in report.groups), Fraction(0))
    held = report.physical_total
    if held and measured < held:
        out.append(
            f"Prometheus covers {format_scaled(round(measured * 1000 / held), 1)}% of the "
            "allocated GPU-hours (column measured %): util % is over the measured part only"
        )
    return out


def _utc(t: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def _fit(cells: Sequence[Sequence[str]], numeric_from: int) -> list[str]:
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    lines = []
    for r in cells:
        parts = [
            c.rjust(w) if i >= numeric_from else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append("  ".join(parts).rstrip())
    return lines


def render_table(report: Report, period: Period) -> str:
    cols = columns(report)
    rows, totals = table_cells(report.groups, cols)
    nkeys = len(report.keys)
    head = [*report.keys, *[c.header for c in cols]]
    body = [
        [*map(_key_text, g.keys), *[c.text() for c in r]]
        for g, r in zip(report.groups, rows, strict=True)
    ]
    tot = ["TOTAL", *[""] * (nkeys - 1), *[c.text() for c in totals]]
    lines = _fit([head, *body, tot], nkeys)
    rule = "-" * max(len(line) for line in lines)
    out = [
        f"GPU usage by {', '.join(report.keys)}  {period.label()}",
        "",
        lines[0],
        rule,
        *lines[1:-1],
        rule,
        lines[-1],
    ]
    if not report.groups:
        out.insert(2, "(no GPU usage in this period)")
    if report.idle is not None:
        _names, icells, itot = idle_cells(report)
        headers = [
            "model",
            "node pool",
            *[c[1] for c in idle_columns(report.priced, report.currency)],
            "idle %",
        ]
        irows = [
            [_key_text(r.gpu_model), _key_text(r.node_pool), *(c.text() for c in line)]
            for r, line in zip(report.idle, icells, strict=True)
        ]
        itext = ["TOTAL", "", *(c.text() for c in itot)]
        ilines = _fit([headers, *irows, itext], 2)
        irule = "-" * max(len(line) for line in ilines)
        out += [
            "",
            "Idle GPU-hours (physical) by model and node pool",
            "",
            ilines[0],
            irule,
            *ilines[1:-1],
            irule,
            ilines[-1],
        ]
    if report.quota:
        _qnames, qcells, qtotals = quota_cells(report)
        qrows = [
            [*quota_keys(report, f), *(c.text() for c in line)]
            for f, line in zip(report.quota, qcells, strict=True)
        ]
        qtot = [
            ["TOTAL", *[""] * len(report.keys), resource, *(c.text() for c in line)]
            for resource, line in zip(_quota_resources(report), qtotals, strict=True)
        ]
        headers = [
            *report.keys,
            "quota",
            "resource",
            *[c[1] for c in QUOTA_COLUMNS],
            "sampled %",
        ]
        nkeys = len(report.keys) + 2
        qlines = _fit([headers, *qrows, *qtot], nkeys)
        qrule = "-" * max(len(line) for line in qlines)
        out += [
            "",
            "Quota use (time-weighted, in each resource's own units) by "
            f"{', '.join(report.keys)}, quota and resource",
            "",
            qlines[0],
            qrule,
            *qlines[1 : 1 + len(qrows)],
            qrule,
            *qlines[1 + len(qrows) :],
        ]
    if report.idle_allocations is not None:
        out += ["", *idle_allocations_table(report)]
    for note in notes(report):
        out.append(f"note: {note}")
    return "\n".join(out) + "\n"


def idle_allocations_table(report: Report) -> list[str]:
    assert report.idle_allocations is not None
    title = (
        f"Idle allocations (activity under {format_scaled(round(report.idle_threshold * 1000), 1)}% "
        f"for at least {_duration(report.idle_min_seconds)} of consecutive ledger windows)"
    )
    if not report.idle_allocations:
        return [title, "", "(none)"]
    head = [
        "cluster",
        "namespace",
        "kind",
        "name",
        "owner",
        "GPUs",
        "idle since",
        "idle until",
        "open",
        "idle alloc GPU-h",
        "activity %",
    ]
    body = [_idle_allocation_values(r) for r in report.idle_allocations]
    lines = _fit([head, *body], 5)
    rule = "-" * max(len(line) for line in lines)
    return [title, "", lines[0], rule, *lines[1:]]


def render_csv(report: Report) -> str:
    """One CSV table; the ``row`` column says what each line is: group, total, idle or
    idle_total (idle rows fill the model/node_pool/idle columns)."""
    cols = columns(report)
    rows, totals = table_cells(report.groups, cols)
    idle_names: list[str] = []
    idle_rows: list[list[str]] = []
    idle_total: list[str] = []
    if report.idle is not None:
        idle_names, icells, itot = idle_cells(report)
        idle_rows = [
            [_key_text(r.gpu_model), _key_text(r.node_pool), *(c.machine() for c in line)]
            for r, line in zip(report.idle, icells, strict=True)
        ]
        idle_total = ["TOTAL", "", *(c.machine() for c in itot)]
    quota_names: list[str] = []
    quota_lines: list[tuple[str, list[str]]] = []
    if report.quota:
        names, qcells, qtotals = quota_cells(report)
        quota_names = [*report.keys, "quota", "resource", *names]
        quota_lines = [
            ("quota", [*quota_keys(report, f), *(c.machine() for c in line)])
            for f, line in zip(report.quota, qcells, strict=True)
        ] + [
            ("quota_total", [*[""] * (len(report.keys) + 1), r, *(c.machine() for c in line)])
            for r, line in zip(_quota_resources(report), qtotals, strict=True)
        ]
    key_names = list(report.keys)
    fields = ["row", *key_names, *[c.name for c in cols], "gpu_seconds_raw"]
    fields += [n for n in idle_names if n not in fields]
    fields += [n for n in quota_names if n not in fields]
    if report.gaps:  # a gap line each: the figures above are lower bounds over it
        fields += list(GAP_FIELDS)
    if report.idle_allocations is not None:
        fields += [f"idle_{n}" if n in fields else n for n in IDLE_ALLOCATION_FIELDS]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    raw_cells, raw_total = raw_seconds_cells(report.groups)
    for g, r, raw in zip(report.groups, rows, raw_cells, strict=True):
        record: dict[str, Any] = {"row": "group"}
        record.update({k: _key_text(v) for k, v in zip(key_names, g.keys, strict=True)})
        record.update({c.name: x.machine() for c, x in zip(cols, r, strict=True)})
        record["gpu_seconds_raw"] = raw.text() if raw.decimals == 0 else raw.machine()
        writer.writerow(record)
    total_record: dict[str, Any] = {"row": "total"}
    total_record.update({c.name: x.machine() for c, x in zip(cols, totals, strict=True)})
    total_record["gpu_seconds_raw"] = (
        raw_total.text() if raw_total.decimals == 0 else raw_total.machine()
    )
    writer.writerow(total_record)
    for line in idle_rows:
        writer.writerow({"row": "idle", **dict(zip(idle_names, line, strict=True))})
    if idle_total:
        writer.writerow({"row": "idle_total", **dict(zip(idle_names, idle_total, strict=True))})
    for kind, line in quota_lines:
        writer.writerow({"row": kind, **dict(zip(quota_names, line, strict=True))})
    for gap in report.gaps:
        cells = (gap.cluster, gap.kind, _utc(gap.started_at), _utc(gap.ended_at), gap.seconds)
        writer.writerow({"row": "gap", **dict(zip(GAP_FIELDS, cells, strict=True))})
    if report.idle_allocations is not None:
        idle_fields = fields[len(fields) - len(IDLE_ALLOCATION_FIELDS) :]
        for idle in report.idle_allocations:
            values = _idle_allocation_values(idle, machine=True)
            values[7] = "" if idle.still_idle else values[7]
            writer.writerow(
                {"row": "idle_allocation", **dict(zip(idle_fields, values, strict=True))}
            )
    return buf.getvalue()


# the columns of a CSV "gap" line
GAP_FIELDS = ("gap_cluster", "gap_kind", "gap_start", "gap_end", "gap_seconds")


def render_json(report: Report, period: Period) -> str:
    cols = columns(report)
    rows, totals = table_cells(report.groups, cols)
    doc: dict[str, Any] = {
        "period": {
            "start": _iso(period.start, period),
            "end": _iso(period.end, period),
            "start_unix": period.start,
            "end_unix": period.end,
            "timezone": str(period.tz),
        },
        "group_by": list(report.keys),
        "currency": report.currency,
        "rows": [],
        "total": {c.name: x.number() for c, x in zip(cols, totals, strict=True)},
        "notes": {
            "estimated_intervals": report.estimated_intervals,
            "unpriced_models": report.unpriced_models,
            "unmatched_rate_card_models": report.unmatched_card_models,
            "best_effort_gpu_pods": report.best_effort_pods,
            "unallocated_energy_joules": {
                c: float(j) for c, j in sorted(report.unallocated_energy.items())
            },
            "ledger_prorated": {
                "windows": report.ledger_cut.windows,
                "longest_window_seconds": report.ledger_cut.longest_seconds,
                "used_gpu_hours": report.ledger_cut.used_seconds / HOUR,
            },
            "messages": notes(report),
        },
    }
    raw_cells, raw_total = raw_seconds_cells(report.groups)
    doc["total"]["gpu_seconds_raw"] = _raw_number(raw_total)
    for g, r, raw in zip(report.groups, rows, raw_cells, strict=True):
        entry: dict[str, Any] = {"group": dict(zip(report.keys, g.keys, strict=True))}
        entry.update({c.name: x.number() for c, x in zip(cols, r, strict=True)})
        entry["gpu_seconds_raw"] = _raw_number(raw)
        entry.update(_ledger_exact(g))
        doc["rows"].append(entry)
    doc["total"].update(_ledger_total(report))
    if report.idle_allocations is not None:
        doc["idle_allocations"] = {
            "threshold_ratio": float(report.idle_threshold),
            "min_seconds": report.idle_min_seconds,
            "rows": [
                dict(
                    zip(IDLE_ALLOCATION_FIELDS, _idle_allocation_values(r, json=True), strict=True)
                )
                for r in report.idle_allocations
            ],
        }
    if report.idle is not None:
        names, icells, itot = idle_cells(report)
        doc["idle"] = {
            "rows": [
                {
                    "model": r.gpu_model,
                    "node_pool": r.node_pool,
                    **{n: c.number() for n, c in zip(names[2:], line, strict=True)},
                }
                for line, r in zip(icells, report.idle, strict=True)
            ],
            "total": {n: c.number() for n, c in zip(names[2:], itot, strict=True)},
        }
    doc["coverage"] = {
        c: None if until is None else {"data_ends": _utc(until), "data_ends_unix": until}
        for c, until in sorted(report.coverage.items())
    }
    doc["covered"] = {
        c: [{"start": _utc(a), "end": _utc(b), "start_unix": a, "end_unix": b} for a, b in spans]
        for c, spans in sorted(report.covered.items())
    }
    doc["gaps"] = [
        {
            "cluster": gap.cluster,
            "kind": gap.kind,
            "start": _utc(gap.started_at),
            "end": _utc(gap.ended_at),
            "start_unix": gap.started_at,
            "end_unix": gap.ended_at,
            "seconds": gap.seconds,
            "reason": gap.reason,
            "may_miss": f"{gap.kind} objects created and deleted inside the gap",
        }
        for gap in report.gaps
    ]
    if report.quota is not None:
        doc["quota"] = quota_json(report)
    return json.dumps(doc, indent=2) + "\n"


def _ledger_exact(g: Group) -> dict[str, Any]:
    """The ledger's figures of one group in base units (null: no usage data, not zero)."""
    return {
        "gpu_seconds_used": _exact(g.used_seconds),
        "energy_joules": _exact(g.energy_joules),
        "usage_coverage_ratio": _exact(g.coverage),
        "carbon_grams_co2e": _exact(g.carbon_grams),
    }


def _ledger_total(report: Report) -> dict[str, Any]:
    groups = report.groups
    with_data = [g for g in groups if g.used_seconds is not None]
    if not with_data:
        return {
            "gpu_seconds_used": None,
            "energy_joules": None,
            "usage_coverage_ratio": None,
            "carbon_grams_co2e": None,
        }
    raw = sum((Fraction(g.raw_seconds) for g in groups), Fraction(0))
    sampled = sum((g.sampled_seconds or Fraction(0) for g in groups), Fraction(0))
    carbon = [g.carbon_grams for g in with_data if g.carbon_grams is not None]
    return {
        "gpu_seconds_used": _exact(
            sum((g.used_seconds or Fraction(0) for g in groups), Fraction(0))
        ),
        "energy_joules": _exact(sum((g.energy_joules or Fraction(0) for g in groups), Fraction(0))),
        "usage_coverage_ratio": _exact(min(sampled / raw, Fraction(1)) if raw else None),
        "carbon_grams_co2e": _exact(sum(carbon, Fraction(0)) if carbon else None),
    }


def _exact(value: Fraction | None) -> float | None:
    """A JSON figure in base units: exact, as the nearest double (the rounding rule: JSON and
    CSV carry unrounded values)."""
    return None if value is None else float(value)


IDLE_ALLOCATION_FIELDS = (
    "cluster",
    "namespace",
    "holder_kind",
    "name",
    "owner",
    "gpus",
    "idle_since",
    "idle_until",
    "still_idle",
    "idle_allocated_gpu_hours",
    "activity_pct",
)


def _idle_allocation_values(
    r: IdleAllocation, *, json: bool = False, machine: bool = False
) -> list[Any]:
    """One idle run's cells: the table's rounded under the rounding rule; exact numbers for
    JSON (``json``) and CSV (``machine``)."""
    hours, activity, gpus = r.idle_seconds / HOUR, r.activity * 100, r.gpus
    if json:
        hours, activity, gpus = float(hours), float(activity), float(gpus)  # type: ignore[assignment]
        return [
            r.cluster,
            r.namespace,
            r.holder_kind,
            r.name,
            r.owner,
            gpus,
            _utc(r.since),
            None if r.still_idle else _utc(r.until),
            r.still_idle,
            hours,
            activity,
        ]
    return [
        r.cluster,
        r.namespace,
        r.holder_kind,
        r.name,
        r.owner or "",
        f"{float(gpus):g}",
        _utc(r.since),
        "(still idle)" if r.still_idle else _utc(r.until),
        "yes" if r.still_idle else "no",
        cell(hours, 2).machine() if machine else cell(hours, 2).text(),
        cell(activity, 1).machine() if machine else cell(activity, 1).text(),
    ]


def quota_json(report: Report) -> dict[str, Any]:
    """Quota figures per group, quota and resource; totals per resource (null: no data)."""
    names, rows, totals = quota_cells(report)
    return {
        "window_seconds": report.quota_span,
        "rows": [
            {
                "group": dict(zip(report.keys, f.keys, strict=True)),
                "quota": f.quota_name,
                "resource": f.resource_name,
                "namespaces": f.namespaces,
                **{k: c.number() for k, c in zip(names, line, strict=True)},
            }
            for f, line in zip(report.quota or [], rows, strict=True)
        ],
        "totals": {
            r: {k: c.number() for k, c in zip(names, line, strict=True)}
            for r, line in zip(_quota_resources(report), totals, strict=True)
        },
    }


def _quota_resources(report: Report) -> list[str]:
    return sorted({f.resource_name for f in report.quota or []})


def _iso(t: int, period: Period) -> str:
    from datetime import datetime

    return datetime.fromtimestamp(t, period.tz).isoformat()
