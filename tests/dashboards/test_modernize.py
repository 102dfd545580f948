"""dashboards/modernize.py: grafanalib's legacy JSON -> the current Grafana schema (pure)."""

from __future__ import annotations

from gpuquota.dashboards.modernize import SCHEMA_VERSION, modernize


def legacy_board(*panels: dict) -> dict:
    return {
        "schemaVersion": 12,
        "rows": [],
        "sharedCrosshair": False,
        "gnetId": None,
        "panels": list(panels),
        "templating": {
            "list": [
                {"name": "node", "type": "query", "datasource": "${datasource}", "auto": False,
                 "useTags": False, "current": {"text": None, "value": None, "tags": []}},
                {"name": "step", "type": "interval", "auto": True, "auto_count": 30},
            ]
        },
        "timepicker": {"time_options": ["5m"], "refresh_intervals": ["5s"]},
    }  # fmt: skip


def test_nulls_and_legacy_keys_go_and_the_schema_version_is_current() -> None:
    board = modernize(legacy_board())
    assert board["schemaVersion"] == SCHEMA_VERSION
    assert not {"rows", "sharedCrosshair", "gnetId"} & board.keys()
    assert board["timepicker"] == {"refresh_intervals": ["5s"]}
    node, step = board["templating"]["list"]
    assert node == {"name": "node", "type": "query",
                    "datasource": {"type": "prometheus", "uid": "${datasource}"}}  # fmt: skip
    assert step == {"name": "step", "type": "interval", "auto": True, "auto_count": 30}


def test_panels_get_data_source_references_and_grafanas_defaults() -> None:
    stat = {"type": "stat", "datasource": "${datasource}", "span": 4, "description": None,
            "targets": [{"expr": "up", "refId": "A", "datasource": "${datasource}"}],
            "fieldConfig": {"defaults": {"thresholds": {"mode": "absolute", "steps": ""}}}}  # fmt: skip
    series = {"type": "timeseries", "options": {"legend": {"displayMode": "hidden"}}}
    table = {"type": "table", "columns": [], "fontSize": "100%"}
    row = {"type": "row", "title": "R", "targets": [], "span": None, "id": 1}
    out_stat, out_series, out_table, out_row = modernize(legacy_board(stat, series, table, row))[
        "panels"
    ]
    ref = {"type": "prometheus", "uid": "${datasource}"}
    assert out_stat["datasource"] == ref and out_stat["targets"][0]["datasource"] == ref
    assert "span" not in out_stat and "description" not in out_stat
    steps = out_stat["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps == [{"color": "green", "value": None}]
    assert out_series["options"]["legend"]["showLegend"] is False
    assert out_table == {"type": "table", "targets": [],
                         "fieldConfig": {"defaults": {"custom": {"cellOptions": {"type": "auto"}}}}}  # fmt: skip
    assert out_row == {"type": "row", "title": "R", "id": 1, "collapsed": False, "panels": []}
