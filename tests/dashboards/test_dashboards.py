"""The dashboards: committed JSON matches its source, and every query is valid PromQL over
metric names that exist."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuquota.dashboards import clusters, generate
from gpuquota.dashboards.known_metrics import known_metric_names
from gpuquota.dashboards.promql import metric_names
from tests.dashboards import grafana_schema

PROMTOOL = shutil.which("promtool")
# Grafana's variables, given values so promtool can parse the expressions.
GRAFANA_VALUES = {
    "$__rate_interval": "1m",
    "$__range_s": "3600",
    "$__range": "1h",
}


def concrete(expr: str) -> str:
    for var, value in GRAFANA_VALUES.items():
        expr = expr.replace(var, value)
    expr = expr.replace("$node", ".*").replace("$gpu", ".*").replace("$namespace", ".*")
    return expr.replace("$cluster", "")


def all_expressions() -> dict[str, list[str]]:
    return {
        path.name: generate.expressions(json.loads(text))
        for path, text in generate.rendered().items()
    }


def test_committed_json_is_what_the_sources_generate() -> None:
    assert generate.sources(), "no dashboards/*.dashboard.py found"
    for path, text in generate.rendered().items():
        assert path.exists(), (
            f"{path.name} is not committed: run python -m gpuquota.dashboards.generate"
        )
        assert path.read_text() == text, (
            f"{path.name} is stale: run python -m gpuquota.dashboards.generate"
        )
    assert generate.main(["--check"]) == 0


def test_check_fails_on_stale_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for src in generate.sources():
        shutil.copy(src, tmp_path / src.name)
    rendered = generate.rendered(tmp_path)
    for path, text in rendered.items():
        path.write_text(text)
    assert generate.stale(tmp_path) == []
    victim = next(iter(rendered))
    victim.write_text(victim.read_text().replace("GPU", "CPU", 1))
    assert generate.stale(tmp_path) == [victim.name]


def cluster_variable(board: dict[str, Any]) -> dict[str, Any]:
    (found,) = [v for v in board["templating"]["list"] if v["name"] == clusters.NAME]
    return found


def test_every_dashboard_picks_one_cluster_hidden_by_default() -> None:
    """The kubernetes-mixin's convention: one cluster at a time (never All, so no panel sums
    across clusters), the variable hidden unless generated for several clusters, and before
    every variable that reads $cluster."""
    for path, text in generate.rendered().items():
        board = json.loads(text)
        variable = cluster_variable(board)
        assert variable["query"].startswith("label_values(") and variable["query"].endswith(
            ", cluster)"
        ), path.name
        assert (variable["multi"], variable["includeAll"], variable["hide"]) == (False, False, 2)
        names = [v["name"] for v in board["templating"]["list"]]
        assert names.index(clusters.NAME) == 1, f"{path.name}: {names}"
        for expr in generate.expressions(board):
            own = variable["query"] == f"label_values({expr}, cluster)"  # the variable's own
            assert 'cluster="$cluster"' in expr or own, (path.name, expr)
        for panel in grafana_schema.panels(board):  # grafanalib's copy of expr is scoped too
            for target in panel.get("targets", []):
                assert target.get("query", target["expr"]) == target["expr"], (path.name, target)


def test_the_generator_takes_the_label_and_shows_the_variable(tmp_path: Path) -> None:
    assert (
        generate.main(["--cluster-label", "k8s_cluster", "--multi-cluster", "--out", str(tmp_path)])
        == 0
    )
    written = sorted(p.name for p in tmp_path.glob("*.json"))
    assert written == sorted(p.name for p in generate.rendered())
    for path in tmp_path.glob("*.json"):
        board = json.loads(path.read_text())
        variable = cluster_variable(board)
        assert variable["query"].endswith(", k8s_cluster)") and variable["hide"] == 0
        for expr in generate.expressions(board):
            assert "cluster=" not in expr.replace("k8s_cluster=", ""), (path.name, expr)
        if path.name == "gpu-quota.json":
            assert any("by (k8s_cluster, namespace)" in e for e in generate.expressions(board))
    assert generate.stale() == [], "--out wrote beside the sources"


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--cluster-label", "k8s-cluster"], "--cluster-label: 'k8s-cluster' is not a label name"),
        (["--check", "--multi-cluster"], "--check compares the committed JSON"),
        (["--multi-cluster"], "--cluster-label and --multi-cluster write with --out DIR"),
        (["--out", "/nonexistent/folder"], "--out: /nonexistent/folder is not a folder"),
    ],
)
def test_the_generator_refuses_bad_settings(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit:
        generate.main(argv)
    assert exit.value.code == 2
    assert needle in capsys.readouterr().err


def test_every_metric_a_dashboard_uses_exists() -> None:
    known = known_metric_names()
    for name, exprs in all_expressions().items():
        assert exprs, f"{name} has no queries"
        used = set().union(*(metric_names(e) for e in exprs))
        assert used, f"{name}: no metric names found in its queries"
        assert used <= known, f"{name} uses unknown metrics {sorted(used - known)}"


def test_node_dashboard_covers_what_operators_look_for() -> None:
    used = set().union(*(metric_names(e) for e in all_expressions()["gpu-node.json"]))
    for fact in ("utilization", "memory", "power", "temperature", "clock", "xid", "ecc", "pod"):
        assert any(fact in name for name in used), f"gpu-node dashboard shows nothing on {fact}"


@pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian package prometheus) not installed")
def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    rules = [
        {"record": f"dashboard:q{i}", "expr": concrete(expr)}
        for i, expr in enumerate(e for exprs in all_expressions().values() for e in exprs)
        if not expr.startswith("label_values(")
    ]
    rule_file = tmp_path / "rules.json"  # JSON is YAML: promtool reads it
    rule_file.write_text(json.dumps({"groups": [{"name": "dashboards", "rules": rules}]}))
    checked = subprocess.run(
        [str(PROMTOOL), "check", "rules", str(rule_file)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('gpu_power_watts{hostname=~"$node"}', {"gpu_power_watts"}),
        (
            'sum by (namespace) (avg_over_time(a_b{kind="raw"}[$__range])) * $__range_s / 3600',
            {"a_b"},
        ),
        ("x * on(uuid) group_left(pod) y == 1 or vector(0)", {"x", "y"}),
        ("increase(c_total[5m] offset 1h) > 1e3 and bool up", {"c_total", "up"}),
        ('label_replace(m, "dst", "$1", "src", "(.*)")', {"m"}),
        ("rate(foo:bar_total[1m])", {"foo:bar_total"}),
    ],
)
def test_metric_names_in_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


# --- Grafana's own schema ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def grafana() -> dict[str, Any]:
    return grafana_schema.load()


def test_every_dashboard_matches_grafanas_published_schema(grafana: dict[str, Any]) -> None:
    boards = {path.name: json.loads(text) for path, text in generate.rendered().items()}
    assert boards
    for name, board in boards.items():
        assert grafana_schema.problems(board, grafana) == [], (
            f"{name} (@grafana/schema {grafana['package']})"
        )
        assert any(True for _ in grafana_schema.panels(board)), f"{name} has no panels"


def _first(board: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(p for p in grafana_schema.panels(board) if p["type"] == kind)


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        (lambda b: b.update(rows=[]), "'rows' was unexpected"),
        (lambda b: b.update(graphTooltip=7), "7 is not one of"),
        (lambda b: _first(b, "stat").update(datasource="${datasource}"), "is not of type 'object'"),
        (lambda b: _first(b, "stat").update(span=6), "'span' was unexpected"),
        (lambda b: _first(b, "timeseries")["gridPos"].update(w="12"), "'12' is not of type 'number'"),
        (lambda b: _first(b, "timeseries").update(type="graph"), "no panel plugin 'graph'"),
        (lambda b: _first(b, "timeseries")["options"]["legend"].pop("showLegend"), "'showLegend' is a required"),
        (lambda b: _first(b, "stat")["options"].update(colorMode="rainbow"), "'rainbow' is not one of"),
        (lambda b: _first(b, "table")["fieldConfig"]["defaults"]["custom"].update(inspect="yes"), "'yes' is not of type 'boolean'"),
        (lambda b: _first(b, "row").update(targets=[]), "'targets' was unexpected"),
        (lambda b: b["templating"]["list"][1].update(useTags=False), "'useTags' was unexpected"),
    ],
)  # fmt: skip
def test_schema_check_finds_what_grafana_rejects(
    grafana: dict[str, Any], damage: Callable[[dict[str, Any]], object], needle: str
) -> None:
    board = json.loads((generate.HERE / "gpu-node.json").read_text())
    assert grafana_schema.problems(board, grafana) == []
    damage(board)
    found = grafana_schema.problems(board, grafana)
    assert any(needle in problem for problem in found), found
