"""The health verdict as DeviceTaintRules, pure: which rules this node wants, whose they are.

:func:`wanted_rules` turns the verdict and this node's DRA devices (exporter/enrich/slices.py)
into the rule bodies; :func:`fences_of` reads the fences back out of listed rules. No I/O:
exporter/dra/taints.py applies them through the API on its own thread, as
exporter/nodestatus/status.py and updater.py split the node's condition and taints.
"""

from __future__ import annotations

import hashlib
from typing import Any

from gpuquota.exporter.enrich.slices import DraDevice
from gpuquota.exporter.health.engine import Fence
from gpuquota.exporter.health.verdict import NodeHealth, State, parse_action
from gpuquota.exporter.listener_thread import parse_time
from gpuquota.exporter.nodestatus.status import TAINT_KEY

Obj = dict[str, Any]
GROUP = "resource.k8s.io"
VERSIONS = ("v1", "v1beta2", "v1alpha3")  # newest first
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "gpuquota-exporter"
NODE_LABEL = "gpuquota.io/node"
EFFECTS = ("NoSchedule", "NoExecute")
UUID_ANNOTATION = "gpuquota.io/device-uuid"
REASONS_ANNOTATION = "gpuquota.io/reasons"
ACTION_ANNOTATION = "gpuquota.io/action"


def fences_of(rules: list[Obj]) -> list[Fence]:
    """Pure: the fences our listed rules stand for (a rule without a readable device UUID or
    action is left out: nothing to hold)."""
    fences = []
    for rule in rules:
        meta = rule.get("metadata") or {}
        notes = meta.get("annotations") or {}
        uuid = notes.get(UUID_ANNOTATION)
        try:
            action = parse_action(str(notes.get(ACTION_ANNOTATION, "")))
        except ValueError:
            continue
        if not uuid:
            continue
        taint = (rule.get("spec") or {}).get("taint") or {}
        since = (
            parse_time(taint.get("timeAdded")) or parse_time(meta.get("creationTimestamp")) or 0.0
        )
        fences.append(Fence(str(uuid), action, str(notes.get(REASONS_ANNOTATION, "")), since))
    return fences


RULE_NAME_MAX = 253  # a DNS subdomain
RULE_NAME_KEPT = 200  # a long name keeps at least this much of gpuquota-<node>-<device>


def rule_name(node: str, device: str) -> str:
    """``gpuquota-<node>-<device>``, a DNS subdomain of at most 253 characters. A longer one
    (a node name of over 180 characters) is cut to 242, without the dots and hyphens it then
    ends with (a label ends with a letter or digit), and ends in ``-`` and 10 hex digits of
    its SHA-256, so it stays unique; the admission policy checks its first 200 characters."""
    name = f"gpuquota-{node}-{device}".lower()
    if len(name) <= RULE_NAME_MAX:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{name[:242].rstrip('.-')}-{digest}"


def owner_labels(node: str) -> dict[str, str]:
    return {MANAGED_BY: MANAGER, NODE_LABEL: node}


def wanted_rules(
    health: NodeHealth, devices: list[DraDevice], node: str, effect: str = "NoSchedule"
) -> dict[str, Obj]:
    """Pure: rule name -> rule body (without apiVersion) for every unhealthy DRA device."""
    if effect not in EFFECTS:
        raise ValueError(f"taint effect must be one of {', '.join(EFFECTS)}, not {effect!r}")
    verdicts = health.by_uuid()
    rules: dict[str, Obj] = {}
    for device in devices:
        verdict = verdicts.get(device.uuid)
        if (verdict is None or verdict.state is not State.UNHEALTHY) and device.parent_uuid:
            verdict = verdicts.get(device.parent_uuid)  # the GPU's verdict covers its MIG
        if verdict is None or verdict.state is not State.UNHEALTHY:
            continue
        codes = sorted({r.code for r in verdict.reasons if r.state is State.UNHEALTHY})
        name = rule_name(node, device.name)
        rules[name] = {
            "kind": "DeviceTaintRule",
            "metadata": {
                "name": name,
                "labels": owner_labels(node),
                "annotations": {
                    UUID_ANNOTATION: device.uuid,
                    REASONS_ANNOTATION: ",".join(codes),
                    ACTION_ANNOTATION: verdict.action.label,
                },
            },
            "spec": {
                "deviceSelector": {
                    "driver": device.driver,
                    "pool": device.pool,
                    "device": device.name,
                },
                "taint": {"key": TAINT_KEY, "value": verdict.action.label, "effect": effect},
            },
        }
    return rules


def same_rule(have: Obj, want: Obj) -> bool:
    hm, wm = have.get("metadata") or {}, want["metadata"]
    return bool(
        have.get("spec", {}).get("deviceSelector") == want["spec"]["deviceSelector"]
        and {k: v for k, v in (have.get("spec", {}).get("taint") or {}).items() if k != "timeAdded"}
        == want["spec"]["taint"]
        and (hm.get("annotations") or {}) == wm["annotations"]
        and (hm.get("labels") or {}) == wm["labels"]
    )
