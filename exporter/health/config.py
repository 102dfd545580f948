"""Reads the health tables: the defaults (exporter/health/defaults.yaml) and the overrides
of ``--health-config FILE`` on top of them, with the same parsing and the same messages.

The override file is YAML; every key is optional and anything not named keeps its default::

    quiet_period_seconds: 120        # edge reasons (XIDs, counter increases) clear after this
    xids:
      13: {state: healthy, action: none}          # override a row
      999: {state: unhealthy, action: reset_gpu, description: "vendor specific"}  # add one
    unknown_xid: {state: unhealthy, action: reset_gpu}   # XIDs not in the table
    conditions:
      nvlink_errors: {state: healthy}             # stop counting NVLink errors against GPUs

Every mistake is reported with the path of the offending key, e.g.
``xids.48.state: unknown health state 'broken' (expected one of: healthy, degraded, unhealthy)``.
The defaults file is held to the same rules plus its own: each XID row names its NVIDIA
catalog bucket, and names a state and action only where they differ from the bucket's.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

from gpuquota.exporter.health.table import ConditionRule, RulesConfig, XidRule
from gpuquota.exporter.health.verdict import Action, State, parse_action, parse_state

DEFAULTS_FILE = "defaults.yaml"  # next to this module


class RulesConfigError(ValueError):
    """The configuration file is unusable; the message names the file and the key."""


_ROW_KEYS = {"state", "action", "description", "mnemonic"}
_TOP_KEYS = {"quiet_period_seconds", "xids", "unknown_xid", "conditions"}
# The defaults file: the override keys plus what only the shipped table may say.
_DEFAULT_TOP_KEYS = _TOP_KEYS | {"catalog_actions"}
_DEFAULT_XID_KEYS = {"mnemonic", "description", "catalog", "note", "state", "action"}
_DEFAULT_CONDITION_KEYS = {"description", "state", "action", "kind"}
_KINDS = {"level": False, "event": True}  # kind -> ConditionRule.edge

Verdict = tuple[State | None, Action | None]


def _mapping(value: Any, where: str) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise RulesConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _keys(row: dict[Any, Any], allowed: set[str], where: str) -> None:
    unknown = set(map(str, row)) - allowed
    if unknown:
        raise RulesConfigError(
            f"{where}: unknown key(s) {sorted(unknown)} (allowed: {sorted(allowed)})"
        )


def _verdict(row: dict[Any, Any], where: str) -> Verdict:
    """The state and action a row names (None where it names none)."""
    state = action = None
    try:
        if "state" in row:
            state = parse_state(str(row["state"]))
    except ValueError as exc:
        raise RulesConfigError(f"{where}.state: {exc}") from None
    try:
        if "action" in row:
            action = parse_action(str(row["action"]))
    except ValueError as exc:
        raise RulesConfigError(f"{where}.action: {exc}") from None
    return state, action


def _resolve(named: Verdict, base: tuple[State, Action]) -> tuple[State, Action]:
    """What a row names, the base where it names nothing (HEALTHY and NONE are 0: no `or`)."""
    return (
        base[0] if named[0] is None else named[0],
        base[1] if named[1] is None else named[1],
    )


def _full_verdict(row: Any, where: str) -> tuple[State, Action]:
    state, action = _verdict(_mapping(row, where), where)
    if state is None or action is None:
        raise RulesConfigError(f"{where}: needs both state and action")
    return state, action


def _text(row: dict[Any, Any], key: str, where: str) -> str:
    if key not in row or not str(row[key]).strip():
        raise RulesConfigError(f"{where}: {key} is missing")
    return str(row[key])


def _xid(key: Any, where: str) -> int:
    try:
        xid = int(key)
    except (TypeError, ValueError):
        raise RulesConfigError(f"{where}: an XID must be an integer") from None
    if not 0 < xid < 1 << 32:
        raise RulesConfigError(f"{where}: XID {xid} is out of range")
    return xid


def _quiet_period(data: dict[Any, Any], source: str, default: float) -> float:
    if data.get("quiet_period_seconds") is None:
        return default
    try:
        return float(data["quiet_period_seconds"])
    except (TypeError, ValueError):
        raise RulesConfigError(f"{source}: quiet_period_seconds: not a number") from None


def _check_quiet_period(quiet: float, source: str) -> None:
    if not quiet > 0:
        raise RulesConfigError(
            f"{source}: quiet period must be > 0 seconds (0 would drop every XID at once), got {quiet}"
        )


def _catalog_actions(data: dict[Any, Any], source: str) -> dict[str, tuple[State, Action]]:
    where = f"{source}: catalog_actions"
    return {
        str(name): _full_verdict(row, f"{where}.{name}")
        for name, row in _mapping(data.get("catalog_actions"), where).items()
    }


def parse_defaults(data: Any, source: str = DEFAULTS_FILE) -> RulesConfig:
    """Build the default tables from the parsed defaults file (see defaults.yaml)."""
    data = _mapping(data, source)
    _keys(data, _DEFAULT_TOP_KEYS, source)
    buckets = _catalog_actions(data, source)
    state, action = _full_verdict(data.get("unknown_xid"), f"{source}: unknown_xid")
    unknown_xid = XidRule(0, "UNKNOWN", "XID not in the table", state, action, "", "")

    xids: dict[int, XidRule] = {}
    for key, row in _mapping(data.get("xids"), f"{source}: xids").items():
        where = f"{source}: xids.{key}"
        xid = _xid(key, where)
        row = _mapping(row, where)
        _keys(row, _DEFAULT_XID_KEYS, where)
        catalog = _text(row, "catalog", where)
        bucket = buckets.get(catalog)
        named = _verdict(row, where)
        if bucket is None and None in named:
            raise RulesConfigError(
                f"{where}: catalog bucket {catalog} has no verdict in catalog_actions: "
                "name both state and action"
            )
        if bucket is not None and named != (None, None) and _resolve(named, bucket) == bucket:
            raise RulesConfigError(
                f"{where}: state/action repeat what catalog_actions gives {catalog}: leave them out"
            )
        state, action = _resolve(named, bucket or (State.HEALTHY, Action.NONE))
        mnemonic, description = _text(row, "mnemonic", where), _text(row, "description", where)
        note = str(row.get("note") or "")
        xids[xid] = XidRule(xid, mnemonic, description, state, action, catalog, note)

    conditions: dict[str, ConditionRule] = {}
    for code, row in _mapping(data.get("conditions"), f"{source}: conditions").items():
        where = f"{source}: conditions.{code}"
        row = _mapping(row, where)
        _keys(row, _DEFAULT_CONDITION_KEYS, where)
        state, action = _full_verdict(row, where)
        kind = _text(row, "kind", where)
        if kind not in _KINDS:
            raise RulesConfigError(f"{where}.kind: {kind!r} is not one of {sorted(_KINDS)}")
        description = _text(row, "description", where)
        conditions[str(code)] = ConditionRule(str(code), description, state, action, _KINDS[kind])

    if "quiet_period_seconds" not in data:
        raise RulesConfigError(f"{source}: quiet_period_seconds is missing")
    quiet = _quiet_period(data, source, 0.0)
    _check_quiet_period(quiet, source)
    return RulesConfig(
        xid_rules=xids, unknown_xid=unknown_xid, conditions=conditions, quiet_period_s=quiet
    )


@functools.cache
def _defaults_data() -> Any:
    text = resources.files(__package__).joinpath(DEFAULTS_FILE).read_text()
    return _parse_yaml(text, DEFAULTS_FILE)


@functools.cache
def defaults() -> RulesConfig:
    """The shipped tables (read once)."""
    return parse_defaults(_defaults_data(), DEFAULTS_FILE)


def default_catalog_actions() -> dict[str, tuple[State, Action]]:
    """NVIDIA catalog bucket -> the verdict its rows take unless they name their own."""
    return _catalog_actions(_mapping(_defaults_data(), DEFAULTS_FILE), DEFAULTS_FILE)


def _override(base_state: State, base_action: Action, row: Any, where: str) -> tuple[State, Action, dict[str, str]]:  # fmt: skip
    row = _mapping(row, where)
    _keys(row, _ROW_KEYS, where)
    texts = {k: str(row[k]) for k in ("description", "mnemonic") if k in row}
    state, action = _resolve(_verdict(row, where), (base_state, base_action))
    return state, action, texts


def parse_config(
    data: Any, source: str = "health config", quiet_period_s: float | None = None
) -> RulesConfig:
    """The default tables with parsed override YAML on top (None = defaults only)."""
    base = defaults()
    if data is None:
        data = {}
    data = _mapping(data, source)
    _keys(data, _TOP_KEYS, source)

    xids: dict[int, XidRule] = dict(base.xid_rules)
    for key, row in _mapping(data.get("xids") or {}, f"{source}: xids").items():
        where = f"{source}: xids.{key}"
        xid = _xid(key, where)
        rule = xids.get(xid)
        if rule is None:
            row_map = _mapping(row, where)
            if "state" not in row_map or "action" not in row_map:
                raise RulesConfigError(f"{where}: a new XID needs both state and action")
            rule = XidRule(
                xid,
                "CONFIGURED",
                f"XID {xid} (from configuration)",
                base.unknown_xid.state,
                base.unknown_xid.action,
                "",
                "added by configuration",
            )
        state, action, texts = _override(rule.state, rule.action, row, where)
        xids[xid] = replace(
            rule,
            state=state,
            action=action,
            description=texts.get("description", rule.description),
            mnemonic=texts.get("mnemonic", rule.mnemonic),
        )

    unknown_xid = base.unknown_xid
    if data.get("unknown_xid") is not None:
        where = f"{source}: unknown_xid"
        state, action, _ = _override(unknown_xid.state, unknown_xid.action, data["unknown_xid"], where)  # fmt: skip
        unknown_xid = replace(unknown_xid, state=state, action=action)

    conditions: dict[str, ConditionRule] = dict(base.conditions)
    for code, row in _mapping(data.get("conditions") or {}, f"{source}: conditions").items():
        where = f"{source}: conditions.{code}"
        if code not in conditions:
            raise RulesConfigError(
                f"{where}: unknown condition (known: {', '.join(sorted(conditions))})"
            )
        condition = conditions[code]
        state, action, texts = _override(condition.state, condition.action, row, where)
        description = texts.get("description", condition.description)
        conditions[code] = replace(condition, state=state, action=action, description=description)

    quiet = _quiet_period(data, source, base.quiet_period_s)
    if quiet_period_s is not None:  # the command-line flag wins over the file
        quiet = quiet_period_s
    _check_quiet_period(quiet, source)
    return RulesConfig(
        xid_rules=xids, unknown_xid=unknown_xid, conditions=conditions, quiet_period_s=quiet
    )


def _parse_yaml(text: str, source: str) -> Any:
    import yaml  # only for a config file; the defaults are built in

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        from gpuquota.cli_common.yamltext import yaml_problem

        raise RulesConfigError(f"{source}: not valid YAML: {yaml_problem(exc)}") from None


def load_config(path: Path | None, quiet_period_s: float | None = None) -> RulesConfig:
    """Read ``path`` (None: defaults) and overlay it on the default tables."""
    if path is None:
        return parse_config(None, quiet_period_s=quiet_period_s)
    try:
        text = path.read_text()
    except OSError as exc:
        raise RulesConfigError(
            f"{path}: cannot read health config: {exc.strerror or exc}"
        ) from None
    return parse_config(
        _parse_yaml(text, str(path)), source=str(path), quiet_period_s=quiet_period_s
    )
