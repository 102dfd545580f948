"""Grafana's own dashboard schema, as JSON Schema, and a validator for dashboard JSON.

The schema comes from npm's @grafana/schema (pinned in dashboards/schema/package-lock.json):
Grafana generates its TypeScript types from the CUE kinds its server and front end use, and
dashboards/schema/build-schema.js turns them into JSON Schema (ts-json-schema-generator) with
unknown keys forbidden. Installed and built on first use into build/grafana-schema/, kept there
until the lock file changes."""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "dashboards" / "schema"
WORK = ROOT / "build" / "grafana-schema"
SCHEMA = WORK / "grafana.schema.json"


def _stale() -> bool:
    inputs = [SOURCE / "package-lock.json", SOURCE / "build-schema.js"]
    return not SCHEMA.is_file() or max(p.stat().st_mtime for p in inputs) > SCHEMA.stat().st_mtime


def load() -> dict[str, Any]:
    """The built schema: {"package": version, "dashboard": ..., "panels": {type: ...}}."""
    WORK.mkdir(parents=True, exist_ok=True)
    with (WORK.parent / "grafana-schema.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test runs may build at once
        if _stale():
            npm = shutil.which("npm")
            node = shutil.which("node")
            assert npm and node, "node and npm are needed: apt-get install -y nodejs npm"
            for name in ("package.json", "package-lock.json"):
                shutil.copy(SOURCE / name, WORK / name)
            run = [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"]
            subprocess.run(run, cwd=WORK, check=True, timeout=300)
            build = [node, str(SOURCE / "build-schema.js"), str(WORK / "node_modules"), str(SCHEMA)]
            subprocess.run(build, check=True, timeout=300)
    loaded: dict[str, Any] = json.loads(SCHEMA.read_text())
    return loaded


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those folded inside collapsed rows included."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def _errors(schema: dict[str, Any], value: Any, where: str) -> list[str]:
    validator = jsonschema.Draft7Validator(schema)
    found = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    return [f"{where}/{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in found]


def _definition(schema: dict[str, Any], name: str) -> dict[str, Any]:
    """One of the dashboard schema's definitions, with the rest it may refer to."""
    return {"$ref": f"#/definitions/{name}", "definitions": schema["definitions"]}


def problems(dashboard: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """What Grafana's schema says is wrong with a dashboard: [] when nothing."""
    board = schema["dashboard"]
    # each panel is checked alone against Panel or RowPanel: a message naming the panel and
    # the key beats "not valid under any of the given schemas" for the whole list
    found = _errors(board, {k: v for k, v in dashboard.items() if k != "panels"}, "dashboard")
    for panel in panels(dashboard):
        kind = panel.get("type")
        where = f"panel {panel.get('title')!r} ({kind})"
        nested = {k: v for k, v in panel.items() if k != "panels"}
        found += _errors(
            _definition(board, "RowPanel" if kind == "row" else "Panel"), nested, where
        )
        if kind == "row":
            continue
        plugin = schema["panels"].get(kind)
        if plugin is None:
            found.append(f"{where}: no panel plugin {kind!r} in @grafana/schema")
            continue
        if "error" in plugin:
            found.append(f"{where}: its schema could not be read: {plugin['error']}")
            continue
        if "options" in plugin:
            found += _errors(plugin["options"], panel.get("options", {}), f"{where} options")
        custom = panel.get("fieldConfig", {}).get("defaults", {}).get("custom")
        if custom is not None and "fieldConfig" in plugin:
            found += _errors(plugin["fieldConfig"], custom, f"{where} fieldConfig.defaults.custom")
    return found
