"""``gpuquota gpus`` as a table, CSV or JSON (per board, or failure rates per group), and the
RMA evidence file of one board (JSON and readable text)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from gpuquota.quota.fleet.cost import NamespaceCost
from gpuquota.quota.fleet.summary import BoardHistory, BoardSummary, GroupRate, summarize
from gpuquota.quota.report.period import Period
from gpuquota.quota.store.vocabulary import FENCED

# CSV and JSON carry exact figures (hours and GPU-days as the floats they are, seconds as
# seconds); the table rounds them to what a reader can use (durations: "45s", "12m", "1.8h")
COLUMNS = (
    "serial", "model", "where", "observed_h", "fenced_h", "unknown_h", "fences", "relapses",
    "recoveries", "xids", "memory", "lost", "gaps", "state",
)  # fmt: skip
TABLE_COLUMNS = tuple(c.removesuffix("_h") for c in COLUMNS)
RATE_COLUMNS = (
    "group", "gpus", "observed_gpu_days", "fenced_gpu_days", "fences",
    "fences_per_1000_gpu_days", "relapses", "xids", "xids_per_1000_gpu_days", "note",
)  # fmt: skip
RATE_TABLE_COLUMNS = (
    "group", "gpus", "observed", "fenced", "fences", "fences_per_1000_gpu_days", "relapses",
    "xids", "xids_per_1000_gpu_days",
)  # fmt: skip


def iso(t: int | None, period: Period | None = None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, period.tz if period else UTC).isoformat()


def duration(seconds: float) -> str:
    """A duration as a reader uses it: seconds under a minute, minutes (with their seconds
    under ten minutes) under an hour, else hours or days to a tenth."""
    if seconds >= 86400:
        return f"{seconds / 86400:.1f}d"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f}h"
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    minutes, rest = divmod(whole, 60)
    return f"{minutes}m{rest:02d}s" if rest and minutes < 10 else f"{minutes}m"


def _xids(s: BoardSummary) -> str:
    return " ".join(f"{code}x{n}" for code, n in s.xids.items())


def _memory(s: BoardSummary) -> str:
    parts = [f"{k}+{v:g}" for k, v in sorted(s.counters.items()) if v]
    parts += [f"{k}={v:g}" for k, v in sorted(s.flags.items()) if v]
    return " ".join(parts)


def _recoveries(s: BoardSummary, exact: bool) -> str:
    out = []
    for r in s.recoveries:
        held = f"{r.held_seconds}s" if exact else duration(r.held_seconds)
        if r.refenced_at is None:
            out.append(f"holding {held}")
        else:
            out.append(f"{held}{' relapse' if r.relapse else ''}")
    return ", ".join(out)


def _row(s: BoardSummary, exact: bool) -> dict[str, Any]:
    """A board's row: exact (CSV: hours as floats, seconds) or for the table."""

    def span(seconds: int) -> Any:
        return seconds / 3600 if exact else duration(seconds)

    return {
        "serial": s.serial,
        "model": s.model or "",
        "where": " -> ".join(s.nodes),
        "observed": span(s.observed_seconds),
        "fenced": span(s.fenced_seconds),
        "unknown": span(s.unknown_seconds),
        "fences": len(s.fences),
        "relapses": s.relapses,
        "recoveries": _recoveries(s, exact),
        "xids": _xids(s),
        "memory": _memory(s),
        "lost": s.lost,
        "gaps": s.gaps,
        "state": s.state or "",
    }


def _rate_row(g: GroupRate, floor: float, exact: bool) -> dict[str, Any]:
    """A group's row: exact (CSV) or for the table; no rate under ``floor`` GPU-days."""
    shown = g.observed_gpu_days >= floor

    def rate(x: float | None) -> Any:
        if x is None or not shown:
            return "" if exact else "-"
        return x if exact else f"{x:.1f}"

    def days(x: float) -> Any:
        return x if exact else duration(x * 86400)

    return {
        "group": g.group,
        "gpus": g.gpus,
        "observed_gpu_days": days(g.observed_gpu_days),
        "observed": days(g.observed_gpu_days),
        "fenced_gpu_days": days(g.fenced_gpu_days),
        "fenced": days(g.fenced_gpu_days),
        "fences": g.fences,
        "fences_per_1000_gpu_days": rate(g.fence_rate),
        "relapses": g.relapses,
        "xids": g.xids,
        "xids_per_1000_gpu_days": rate(g.xid_rate),
        "note": "" if shown else under_floor(floor),
    }


def under_floor(floor: float) -> str:
    return f"under {floor:g} observed GPU-days: too few for a rate"


def _table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    cells = [[str(r[c]) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines) + "\n"


def _csv(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def boards_text(summaries: Sequence[BoardSummary], period: Period, fmt: str) -> str:
    if fmt == "json":
        return (
            json.dumps(
                {
                    "period": {"start": iso(period.start, period), "end": iso(period.end, period)},
                    "gpus": [board_json(s, period) for s in summaries],
                },
                indent=2,
            )
            + "\n"
        )
    if fmt == "csv":
        rows = [_row(s, exact=True) for s in summaries]
        return _csv([{c: r[c.removesuffix("_h")] for c in COLUMNS} for r in rows], COLUMNS)
    rows = [_row(s, exact=False) for s in summaries]
    return f"GPU health {period.label()}, worst first\n" + _table(rows, TABLE_COLUMNS)


def board_json(s: BoardSummary, period: Period | None = None) -> dict[str, Any]:
    return {
        "cluster": s.cluster,
        "serial": s.serial,
        "model": s.model,
        "nodes": s.nodes,
        "uuids": s.uuids,
        "observed_hours": s.observed_seconds / 3600,
        "fenced_hours": s.fenced_seconds / 3600,
        "unknown_hours": s.unknown_seconds / 3600,
        "fences": [iso(t, period) for t in s.fences],
        "relapses": s.relapses,
        "recoveries": [
            {
                "released": iso(r.released_at, period),
                "fenced_again": iso(r.refenced_at, period),
                "held_hours": r.held_seconds / 3600,
                "holding": r.refenced_at is None,
                "relapse": r.relapse,
            }
            for r in s.recoveries
        ],
        "xids": s.xids,
        "memory_increase": s.counters,
        "memory_flags": s.flags,
        "lost": s.lost,
        "gaps": s.gaps,
        "state": s.state,
    }


def rates_text(
    groups: Sequence[GroupRate], key: str, period: Period, fmt: str, floor: float
) -> str:
    """Rates per group; a group with less than ``floor`` observed GPU-days has none (null,
    empty, "-") and says why: a fence over a few GPU-hours is no rate."""
    groups = sorted(groups, key=lambda g: g.observed_gpu_days < floor)  # rates first
    if fmt == "json":
        doc = {
            "period": {"start": iso(period.start, period), "end": iso(period.end, period)},
            "by": key,
            "rate_floor_gpu_days": floor,
            "groups": [
                {
                    "group": g.group,
                    "gpus": g.gpus,
                    "observed_gpu_days": g.observed_gpu_days,
                    "fenced_gpu_days": g.fenced_gpu_days,
                    "fences": g.fences,
                    "fences_per_1000_gpu_days": g.fence_rate
                    if g.observed_gpu_days >= floor
                    else None,
                    "relapses": g.relapses,
                    "xids": g.xids,
                    "xids_per_1000_gpu_days": g.xid_rate if g.observed_gpu_days >= floor else None,
                    "note": None if g.observed_gpu_days >= floor else under_floor(floor),
                }
                for g in groups
            ],
        }
        return json.dumps(doc, indent=2) + "\n"
    if fmt == "csv":
        rows = [_rate_row(g, floor, exact=True) for g in groups]
        return _csv([{c: r[c] for c in RATE_COLUMNS} for r in rows], RATE_COLUMNS)
    rows = [_rate_row(g, floor, exact=False) for g in groups]
    head = f"GPU failure rates by {key} {period.label()}, per 1,000 observed GPU-days\n"
    lines = head + _table(rows, RATE_TABLE_COLUMNS)
    if any(g.observed_gpu_days < floor for g in groups):
        lines += f"-: {under_floor(floor)} (--min-gpu-days)\n"
    return lines


COST_COLUMNS = ("namespace", "fences", "gpu_hours_lost", "pods", "gpus")


def cost_text(rows: Sequence[NamespaceCost], period: Period, fmt: str) -> str:
    if fmt == "json":
        doc = {
            "period": {"start": iso(period.start, period), "end": iso(period.end, period)},
            "namespaces": [
                {
                    "namespace": c.namespace,
                    "fences": c.fences,
                    "gpu_hours_lost": c.gpu_hours,
                    "pods": sorted(c.pods),
                    "gpus": sorted(c.serials),
                }
                for c in rows
            ],
        }
        return json.dumps(doc, indent=2) + "\n"
    table = [
        {
            "namespace": c.namespace,
            "fences": c.fences,
            "gpu_hours_lost": f"{c.gpu_hours:.2f}",
            "pods": " ".join(sorted(c.pods)),
            "gpus": " ".join(sorted(c.serials)),
        }
        for c in rows
    ]
    if fmt == "csv":
        return _csv(table, COST_COLUMNS)
    head = f"GPU-hours fences took from running pods {period.label()}\n"
    if not rows:
        return head + "no fence hit a running pod\n"
    return head + _table(table, COST_COLUMNS)


# -- RMA evidence ------------------------------------------------------------------------------


def evidence(board: BoardHistory, relapse_within: int) -> dict[str, Any]:
    """A board's identity and whole timeline, for a vendor's RMA case: its summary, fenced
    stretches and placements from the same stretches and events as ``gpuquota gpus``' table,
    over its whole life, from the first fact about it (a verdict is dated by the agent's own
    second, which can come before the first reading that showed it) to the last."""
    lo, hi = life(board)
    whole = summarize(board, lo, hi, relapse_within)
    placements: list[dict[str, Any]] = []
    for s in board.stretches:
        ident = {
            "uuid": s.uuid,
            "node": s.node,
            "pci_bus_id": s.pci_bus_id,
            "model": s.model,
            "driver_version": s.driver_version,
            "vbios_version": s.vbios_version,
        }
        if (
            placements
            and placements[-1]["identity"] == ident
            and placements[-1]["until"] == iso(s.start)
        ):
            placements[-1]["until"] = iso(s.end)
        else:
            placements.append({"identity": ident, "from": iso(s.start), "until": iso(s.end)})
    # observed unhealthy time, its stretches joined where one window's ends as the next
    # window's begins: they add up to the summary's fenced hours
    spans: list[list[int]] = []
    for s in board.stretches:
        if s.state != FENCED:
            continue
        if spans and spans[-1][1] == s.start:
            spans[-1][1] = s.end
        else:
            spans.append([s.start, s.end])
    fenced = [
        {"from": iso(a), "until": iso(b), "hours": (b - a) / 3600, "seconds": b - a}
        for a, b in spans
    ]
    latest = board.stretches[-1] if board.stretches else None
    return {
        "kind": "gpuquota RMA evidence",
        "generated_at": iso(int(datetime.now(UTC).timestamp())),
        "board": {
            "serial": board.serial,
            "cluster": board.cluster,
            "model": latest.model if latest else None,
            "pci_bus_id": latest.pci_bus_id if latest else None,
            "driver_version": latest.driver_version if latest else None,
            "vbios_version": latest.vbios_version if latest else None,
            "first_seen": iso(board.first_seen),
            "last_seen": iso(board.last_seen),
            "first_fact": iso(lo),
        },
        "summary": board_json(whole),
        "placements": placements,
        "fenced": fenced,
        "timeline": [
            {"at": iso(e.at), "seen": iso(e.seen), "kind": e.kind, **e.detail} for e in board.events
        ],
    }


def life(board: BoardHistory) -> tuple[int, int]:
    """[the first fact about the board, one second past the last]."""
    times = [board.first_seen, board.last_seen]
    times += [e.at for e in board.events] + [e.seen for e in board.events]
    times += [t for s in board.stretches for t in (s.start, s.end)]
    return min(times), max(times) + 1


def evidence_text(doc: dict[str, Any]) -> str:
    b, s = doc["board"], doc["summary"]
    lines = [
        f"RMA evidence for GPU serial {b['serial']} (cluster {b['cluster']})",
        f"  model          {b['model']}",
        f"  PCI bus id     {b['pci_bus_id']}",
        f"  driver         {b['driver_version']}",
        f"  VBIOS          {b['vbios_version']}",
        f"  seen           {b['first_seen']} .. {b['last_seen']}"
        + (f" (first fact {b['first_fact']})" if b["first_fact"] != b["first_seen"] else ""),
        f"  observed       {duration(s['observed_hours'] * 3600)}, "
        f"fenced {duration(s['fenced_hours'] * 3600)}, "
        f"unknown {duration(s['unknown_hours'] * 3600)}",
        f"  fences         {len(s['fences'])} (relapses {s['relapses']})",
        "  XIDs           " + (", ".join(f"{k} x{v}" for k, v in s["xids"].items()) or "none"),
        "  memory         "
        + (", ".join(f"{k} +{v:g}" for k, v in s["memory_increase"].items()) or "no increase"),
        "",
        "Placements:",
    ]
    for p in doc["placements"]:
        i = p["identity"]
        lines.append(
            f"  {p['from']} .. {p['until']}  {i['node']} {i['pci_bus_id']} {i['uuid']} "
            f"driver {i['driver_version']} VBIOS {i['vbios_version']}"
        )
    lines += ["", "Fenced (observed unhealthy):"]
    lines += [f"  {f['from']} .. {f['until']}  {duration(f['seconds'])}" for f in doc["fenced"]]
    if not doc["fenced"]:
        lines.append("  never")
    lines += ["", "Timeline:"]
    for e in doc["timeline"]:
        detail = {k: v for k, v in e.items() if k not in ("at", "seen", "kind")}
        lines.append(f"  {e['at']}  {e['kind']:<8} {_describe(e['kind'], detail)}")
    return "\n".join(lines) + "\n"


def _describe(kind: str, d: dict[str, Any]) -> str:
    if kind == "verdict":
        reasons = ",".join(d.get("reasons") or []) or "-"
        return (
            f"{d.get('previous')} -> {d.get('state')} (reasons {reasons}; action {d.get('action')})"
        )
    if kind == "xid":
        return f"XID {d['code']} x{d['count']}"
    if kind == "counter":
        return f"{d['counter']}: {d.get('from')} -> {d.get('to')}"
    if kind == "lost":
        return "fell off the bus" if d.get("lost") else "back on the bus"
    if kind == "gap":
        return f"not seen for {duration(int(d['seconds']))}"
    if kind == "identity":
        new, old = d.get("identity") or {}, d.get("previous") or {}
        changed = [f"{k} {old.get(k)} -> {v}" for k, v in new.items() if old.get(k) != v]
        return (
            "; ".join(changed) if old else f"first seen on {new.get('node')} as {new.get('uuid')}"
        )
    return json.dumps(d, sort_keys=True)
