"""Bring grafanalib's JSON up to the dashboard schema Grafana publishes (npm @grafana/schema).

grafanalib writes a dashboard the way Grafana 5 to 8 stored it: ``null`` for every unset
field, data sources as bare names, legacy keys (``rows``, ``span``, ``sharedCrosshair``...),
thresholds with no steps and schemaVersion 12, which Grafana then migrates on load. Grafana's
current schema forbids all of that, so the generator passes every dashboard through
:func:`modernize` and the tests validate the result against that schema. One pure function,
applied to every dashboard, so new panels are covered without per-panel care.
"""

from __future__ import annotations

from typing import Any

# The form Grafana 11.0 onwards stores; the schema check holds the JSON to it, and newer
# Grafana versions migrate it forward on load.
SCHEMA_VERSION = 39
DATASOURCE_TYPE = "prometheus"

LEGACY_DASHBOARD_KEYS = {"__inputs", "hideControls", "rows", "sharedCrosshair", "style"}
LEGACY_PANEL_KEYS = {"editable", "error", "height", "minSpan", "span"}
LEGACY_TABLE_KEYS = {"color", "columns", "fontSize", "mappings", "styles"}
ROW_KEYS = {"collapsed", "datasource", "gridPos", "id", "panels", "repeat", "title", "type"}
LEGACY_VARIABLE_KEYS = {"tagValuesQuery", "tagsQuery", "useTags", "tags"}
INTERVAL_ONLY_KEYS = {"auto", "auto_count", "auto_min"}
BASE_THRESHOLD = {"color": "green", "value": None}


def without_nulls(value: Any) -> Any:
    """Drop every ``None`` member: an absent optional field is what the schema allows."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


def datasource_ref(value: Any) -> Any:
    """A bare data source name or ``${variable}`` becomes the reference object Grafana wants."""
    if isinstance(value, str):
        return {"type": DATASOURCE_TYPE, "uid": value}
    return value


def _panel(panel: dict[str, Any]) -> dict[str, Any]:
    if panel.get("type") == "row":
        row = {k: v for k, v in panel.items() if k in ROW_KEYS}
        row.setdefault("collapsed", False)
        row["panels"] = [_panel(p) for p in row.get("panels", [])]
        return row
    dropped = LEGACY_PANEL_KEYS | (LEGACY_TABLE_KEYS if panel.get("type") == "table" else set())
    out = {k: v for k, v in panel.items() if k not in dropped}
    if "datasource" in out:
        out["datasource"] = datasource_ref(out["datasource"])
    out["targets"] = [
        {**t, "datasource": datasource_ref(t["datasource"])} if "datasource" in t else t
        for t in out.get("targets", [])
    ]
    defaults = out.get("fieldConfig", {}).get("defaults", {})
    thresholds = defaults.get("thresholds")
    if isinstance(thresholds, dict) and not thresholds.get("steps"):
        thresholds["steps"] = [dict(BASE_THRESHOLD)]  # "" or []: Grafana's own base step
    legend = out.get("options", {}).get("legend")
    if isinstance(legend, dict):
        legend.setdefault("showLegend", legend.get("displayMode") != "hidden")
    if out.get("type") == "table":
        field_config = out.setdefault("fieldConfig", {})
        custom = field_config.setdefault("defaults", {}).setdefault("custom", {})
        custom.setdefault("cellOptions", {"type": "auto"})
    return out


def _variable(variable: dict[str, Any]) -> dict[str, Any]:
    dropped = LEGACY_VARIABLE_KEYS
    if variable.get("type") != "interval":
        dropped = dropped | INTERVAL_ONLY_KEYS
    out = {k: v for k, v in variable.items() if k not in dropped}
    if "datasource" in out:
        out["datasource"] = datasource_ref(out["datasource"])
    current = {k: v for k, v in out.get("current", {}).items() if k not in LEGACY_VARIABLE_KEYS}
    if "text" in current and "value" in current:
        out["current"] = current
    else:
        out.pop("current", None)  # nothing selected yet: Grafana picks on load
    return out


def modernize(dashboard: dict[str, Any]) -> dict[str, Any]:
    """grafanalib's ``to_json_data()`` (already JSON-encoded) -> current-schema dashboard JSON."""
    board = without_nulls(dashboard)
    out = {k: v for k, v in board.items() if k not in LEGACY_DASHBOARD_KEYS}
    out["schemaVersion"] = SCHEMA_VERSION
    out["panels"] = [_panel(p) for p in out.get("panels", [])]
    templating = out.get("templating", {})
    templating["list"] = [_variable(v) for v in templating.get("list", [])]
    timepicker = out.get("timepicker", {})
    timepicker.pop("time_options", None)  # gone from Grafana: the picker's list is fixed
    return out
