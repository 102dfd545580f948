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

COLUMNS = (
    "serial", "model", "where", "observed_h", "fenced_h", "unknown_h", "fences", "relapses",
    "recoveries", "xids", "memory", "lost", "gaps", "state",
)  # fmt: skip
RATE_COLUMNS = (
    "group", "gpus", "observed_gpu_days", "fenced_gpu_days", "fences",
    "fences_per_1000_gpu_days", "relapses", "xids", "xids_per_1000_gpu_days",
)  # fmt: skip


def iso(t: int | None, period: Period | None = None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, period.tz if period else UTC).isoformat()


def hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f}"


def duration(seconds: int) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:.1f}d"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds // 60}m"


def _xids(s: BoardSummary) -> str:
    return " ".join(f"{code}x{n}" for code, n in s.xids.items())


def _memory(s: BoardSummary) -> str:
    parts = [f"{k}+{v:g}" for k, v in sorted(s.counters.items()) if v]
    parts += [f"{k}={v:g}" for k, v in sorted(s.flags.items()) if v]
    return " ".join(parts)


def _recoveries(s: BoardSummary) -> str:
    out = []
    for r in s.recoveries:
        if r.refenced_at is None:
            out.append(f"holding {duration(r.held_seconds)}")
        else:
            out.append(f"{duration(r.held_seconds)}{' relapse' if r.relapse else ''}")
    return ", ".join(out)


def _row(s: BoardSummary) -> dict[str, Any]:
    return {
        "serial": s.serial,
        "model": s.model or "",
        "where": " -> ".join(s.nodes),
        "observed_h": hours(s.observed_seconds),
        "fenced_h": hours(s.fenced_seconds),
        "unknown_h": hours(s.unknown_seconds),
        "fences": len(s.fences),
        "relapses": s.relapses,
        "recoveries": _recoveries(s),
        "xids": _xids(s),
        "memory": _memory(s),
        "lost": s.lost,
        "gaps": s.gaps,
        "state": s.state or "",
    }


def _rate_row(g: GroupRate) -> dict[str, Any]:
    def rate(x: float | None) -> str:
        return "" if x is None else f"{x:.1f}"

    return {
        "group": g.group,
        "gpus": g.gpus,
        "observed_gpu_days": f"{g.observed_gpu_days:.2f}",
        "fenced_gpu_days": f"{g.fenced_gpu_days:.3f}",
        "fences": g.fences,
        "fences_per_1000_gpu_days": rate(g.fence_rate),
        "relapses": g.relapses,
        "xids": g.xids,
        "xids_per_1000_gpu_days": rate(g.xid_rate),
    }


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
    rows = [_row(s) for s in summaries]
    if fmt == "csv":
        return _csv(rows, COLUMNS)
    return f"GPU health {period.label()}, worst first\n" + _table(rows, COLUMNS)


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


def rates_text(groups: Sequence[GroupRate], key: str, period: Period, fmt: str) -> str:
    rows = [_rate_row(g) for g in groups]
    if fmt == "json":
        doc = {
            "period": {"start": iso(period.start, period), "end": iso(period.end, period)},
            "by": key,
            "groups": [
                {
                    "group": g.group,
                    "gpus": g.gpus,
                    "observed_gpu_days": g.observed_gpu_days,
                    "fenced_gpu_days": g.fenced_gpu_days,
                    "fences": g.fences,
                    "fences_per_1000_gpu_days": g.fence_rate,
                    "relapses": g.relapses,
                    "xids": g.xids,
                    "xids_per_1000_gpu_days": g.xid_rate,
                }
                for g in groups
            ],
        }
        return json.dumps(doc, indent=2) + "\n"
    if fmt == "csv":
        return _csv(rows, RATE_COLUMNS)
    head = f"GPU failure rates by {key} {period.label()}, per 1,000 observed GPU-days\n"
    return head + _table(rows, RATE_COLUMNS)


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
    """A board's identity and whole timeline, for a vendor's RMA case."""
    whole = summarize(board, board.first_seen, board.last_seen + 1, relapse_within)
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
    fenced = [
        {"from": iso(s.start), "until": iso(s.end), "hours": (s.end - s.start) / 3600}
        for s in board.stretches
        if s.state == "unhealthy"
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
        },
        "summary": board_json(whole),
        "placements": placements,
        "fenced": fenced,
        "timeline": [
            {"at": iso(e.at), "seen": iso(e.seen), "kind": e.kind, **e.detail} for e in board.events
        ],
    }


def evidence_text(doc: dict[str, Any]) -> str:
    b, s = doc["board"], doc["summary"]
    lines = [
        f"RMA evidence for GPU serial {b['serial']} (cluster {b['cluster']})",
        f"  model          {b['model']}",
        f"  PCI bus id     {b['pci_bus_id']}",
        f"  driver         {b['driver_version']}",
        f"  VBIOS          {b['vbios_version']}",
        f"  seen           {b['first_seen']} .. {b['last_seen']}",
        f"  observed       {s['observed_hours']:.2f} h, fenced {s['fenced_hours']:.2f} h, "
        f"unknown {s['unknown_hours']:.2f} h",
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
