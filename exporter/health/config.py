"""Reads the health configuration file (``--health-config FILE``) over the default tables.

The file is YAML; every key is optional and anything not named keeps its default from
exporter/health/rules.py::

    quiet_period_seconds: 120        # edge reasons (XIDs, counter increases) clear after this
    xids:
      13: {state: healthy, action: none}          # override a row
      999: {state: unhealthy, action: reset_gpu, description: "vendor specific"}  # add one
    unknown_xid: {state: unhealthy, action: reset_gpu}   # XIDs not in the table
    conditions:
      nvlink_errors: {state: healthy}             # stop counting NVLink errors against GPUs

Every mistake is reported with the path of the offending key, e.g.
``xids.48.state: unknown health state 'broken' (expected one of: healthy, degraded, unhealthy)``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from exporter.health.rules import (
    DEFAULT_CONDITION_RULES,
    DEFAULT_QUIET_PERIOD_S,
    DEFAULT_UNKNOWN_XID,
    DEFAULT_XID_RULES,
    ConditionRule,
    HealthConfig,
    XidRule,
    parse_action,
    parse_state,
)


class HealthConfigError(ValueError):
    """The configuration file is unusable; the message names the file and the key."""


_ROW_KEYS = {"state", "action", "description", "mnemonic"}
_TOP_KEYS = {"quiet_period_seconds", "xids", "unknown_xid", "conditions"}


def _mapping(value: Any, where: str) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise HealthConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _apply_row(
    rule_state: Any, rule_action: Any, row: Any, where: str
) -> tuple[Any, Any, dict[str, str]]:
    row = _mapping(row, where)
    unknown = set(map(str, row)) - _ROW_KEYS
    if unknown:
        raise HealthConfigError(
            f"{where}: unknown key(s) {sorted(unknown)} (allowed: {sorted(_ROW_KEYS)})"
        )
    state, action = rule_state, rule_action
    try:
        if "state" in row:
            state = parse_state(str(row["state"]))
    except ValueError as exc:
        raise HealthConfigError(f"{where}.state: {exc}") from None
    try:
        if "action" in row:
            action = parse_action(str(row["action"]))
    except ValueError as exc:
        raise HealthConfigError(f"{where}.action: {exc}") from None
    texts = {k: str(row[k]) for k in ("description", "mnemonic") if k in row}
    return state, action, texts


def parse_config(
    data: Any, source: str = "health config", quiet_period_s: float | None = None
) -> HealthConfig:
    """Build a HealthConfig from parsed YAML (None = defaults only)."""
    if data is None:
        data = {}
    data = _mapping(data, source)
    unknown = set(map(str, data)) - _TOP_KEYS
    if unknown:
        raise HealthConfigError(
            f"{source}: unknown key(s) {sorted(unknown)} (allowed: {sorted(_TOP_KEYS)})"
        )

    xids: dict[int, XidRule] = dict(DEFAULT_XID_RULES)
    for key, row in _mapping(data.get("xids") or {}, f"{source}: xids").items():
        where = f"{source}: xids.{key}"
        try:
            xid = int(key)
        except (TypeError, ValueError):
            raise HealthConfigError(f"{where}: an XID must be an integer") from None
        if not 0 < xid < 1 << 32:
            raise HealthConfigError(f"{where}: XID {xid} is out of range")
        base = xids.get(xid)
        if base is None:
            row_map = _mapping(row, where)
            if "state" not in row_map or "action" not in row_map:
                raise HealthConfigError(f"{where}: a new XID needs both state and action")
            base = XidRule(
                xid,
                "CONFIGURED",
                f"XID {xid} (from configuration)",
                DEFAULT_UNKNOWN_XID.state,
                DEFAULT_UNKNOWN_XID.action,
                "",
                "added by configuration",
            )
        state, action, texts = _apply_row(base.state, base.action, row, where)
        xids[xid] = replace(
            base,
            state=state,
            action=action,
            description=texts.get("description", base.description),
            mnemonic=texts.get("mnemonic", base.mnemonic),
        )

    unknown_xid = DEFAULT_UNKNOWN_XID
    if data.get("unknown_xid") is not None:
        where = f"{source}: unknown_xid"
        state, action, _ = _apply_row(
            unknown_xid.state, unknown_xid.action, data["unknown_xid"], where
        )
        unknown_xid = replace(unknown_xid, state=state, action=action)

    conditions: dict[str, ConditionRule] = dict(DEFAULT_CONDITION_RULES)
    for code, row in _mapping(data.get("conditions") or {}, f"{source}: conditions").items():
        where = f"{source}: conditions.{code}"
        if code not in conditions:
            raise HealthConfigError(
                f"{where}: unknown condition (known: {', '.join(sorted(conditions))})"
            )
        base_c = conditions[code]
        state, action, texts = _apply_row(base_c.state, base_c.action, row, where)
        description = texts.get("description", base_c.description)
        conditions[code] = replace(base_c, state=state, action=action, description=description)

    quiet = DEFAULT_QUIET_PERIOD_S
    if data.get("quiet_period_seconds") is not None:
        try:
            quiet = float(data["quiet_period_seconds"])
        except (TypeError, ValueError):
            raise HealthConfigError(f"{source}: quiet_period_seconds: not a number") from None
    if quiet_period_s is not None:  # the command-line flag wins over the file
        quiet = quiet_period_s
    if not quiet > 0:
        raise HealthConfigError(
            f"{source}: quiet period must be > 0 seconds (0 would drop every XID at once), got {quiet}"
        )
    return HealthConfig(
        xid_rules=xids, unknown_xid=unknown_xid, conditions=conditions, quiet_period_s=quiet
    )


def load_config(path: Path | None, quiet_period_s: float | None = None) -> HealthConfig:
    """Read ``path`` (None: defaults) and overlay it on the default tables."""
    if path is None:
        return parse_config(None, quiet_period_s=quiet_period_s)
    try:
        text = path.read_text()
    except OSError as exc:
        raise HealthConfigError(
            f"{path}: cannot read health config: {exc.strerror or exc}"
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise HealthConfigError(f"{path}: not valid YAML: {exc}") from None
    return parse_config(data, source=str(path), quiet_period_s=quiet_period_s)
