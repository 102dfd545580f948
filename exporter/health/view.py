"""Renders one ``NodeHealth`` as the JSON document of the node's health endpoint.

The metrics and the device plugin stream render the same ``NodeHealth`` object, so the
three channels can never disagree about a device.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gpuquota.exporter.health.verdict import DeviceHealth, NodeHealth, Reason

HEALTH_ROUTES = ("/health", "/api/v1/health")


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def reason_json(reason: Reason) -> dict[str, Any]:
    return {
        "reason": reason.code,
        "state": reason.state.label,
        "action": reason.action.label,
        "message": reason.message,
        "since": _iso(reason.since),
        "last_seen": _iso(reason.last_seen),
        "count": reason.count,
        "inherited_from_parent": reason.inherited,
    }


def device_json(device: DeviceHealth) -> dict[str, Any]:
    out: dict[str, Any] = {
        "uuid": device.uuid,
        "index": device.index,
        "state": device.state.label,
        "action": device.action.label,
        "since": _iso(device.since),
        "reasons": [reason_json(r) for r in device.reasons],
    }
    if device.parent_uuid is not None:
        out["parent_uuid"] = device.parent_uuid
        out["mig_profile"] = device.mig_profile
    return out


def node_json(health: NodeHealth, hostname: str) -> dict[str, Any]:
    counts = {"healthy": 0, "degraded": 0, "unhealthy": 0}
    for device in health.devices:
        counts[device.state.label] += 1
    return {
        "node": hostname,
        "generation": health.generation,
        "updated_at": _iso(health.updated_at) if health.updated_at else None,
        "summary": counts,
        "devices": [device_json(d) for d in health.devices],
    }
