"""What the central remediation did to the pods of one board's fences, for `gpuquota gpus
--serial S` (rows quota/remediation/record.py reads; shown after the board's own table)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from gpuquota.quota.fleet.render import iso
from gpuquota.quota.remediation.record import StoredAct
from gpuquota.quota.report.period import Period

HEADER = "pods acted on for its fences (gpuquota remediate):"


def act_json(act: StoredAct, period: Period | None) -> dict[str, Any]:
    return {
        "at": iso(act.at, period),
        "action": act.action,
        "result": act.result,
        "node": act.node,
        "namespace": act.namespace,
        "pod": act.pod,
        "pod_uid": act.pod_uid,
        "devices": list(act.devices),
        "message": act.message,
    }


def acts_text(acts: Sequence[StoredAct], period: Period | None) -> str:
    if not acts:
        return f"\n{HEADER} none\n"
    lines = [f"\n{HEADER}"]
    for a in acts:
        lines.append(
            f"  {iso(a.at, period)}  {a.action:<9} {a.result:<14} {a.namespace}/{a.pod} "
            f"(uid {a.pod_uid}) on {a.node}: {', '.join(a.devices)}"
        )
    return "\n".join(lines) + "\n"


def with_acts_json(text: str, acts: dict[str, list[StoredAct]], period: Period | None) -> str:
    """The boards' JSON with each board's ``pod_actions`` (serial -> acts) added."""
    doc = json.loads(text)
    for board in doc.get("gpus") or []:
        board["pod_actions"] = [act_json(a, period) for a in acts.get(board.get("serial"), [])]
    return json.dumps(doc, indent=2) + "\n"
