"""Several clusters in one Prometheus: each dashboard's ``cluster`` variable, and its matcher in
every query.

Thanos, Mimir, VictoriaMetrics or a Prometheus shared by several clusters tell the clusters'
series apart by a label (by convention ``cluster``). The dashboards follow the
kubernetes-mixin's convention (its ``clusterLabel`` and ``showMultiCluster``): a single-valued
``cluster`` variable offers that label's values on a series every cluster has, hidden unless
the dashboards are generated for several clusters; every selector of every panel and variable
query then reads ``<label>="$cluster"``, and every ``by``/``on`` list keeps the label, so no
panel adds up or joins two clusters' series.

In a Prometheus that holds one cluster, the series have no such label: the variable offers
nothing, Grafana gives it its "None" value, the empty string, and ``<label>=""`` matches every
series without the label: the dashboards read as before.

The sources say which series the variable reads (:func:`variable`); the generator applies the
label's name and the variable's visibility to the JSON (:func:`apply`), so the label is one
setting (``python -m gpuquota.dashboards.generate --cluster-label NAME --multi-cluster
--out DIR``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grafanalib.core import Template

from gpuquota.dashboards.panels import DATASOURCE
from gpuquota.quota.promscope import LABEL_NAME, Scope, keeping, scoped

NAME = "cluster"  # the variable's name: queries read $cluster
DEFAULT_LABEL = "cluster"
HIDDEN, SHOWN = 2, 0  # Grafana's `hide`: 2 hides the variable, 0 shows label and value


@dataclass(frozen=True)
class Clusters:
    """How the generated dashboards tell clusters apart."""

    label: str = DEFAULT_LABEL
    #: show the variable (several clusters in the Prometheus); hidden, it still filters
    show: bool = False

    def __post_init__(self) -> None:
        if not LABEL_NAME.fullmatch(self.label):
            raise ValueError(f"{self.label!r} is not a label name (letters, digits and _)")


def variable(series: str) -> Template:
    """The ``cluster`` variable: the cluster label's values on ``series`` (one that every
    cluster with these dashboards' programs has). :func:`apply` sets its label and visibility."""
    return Template(
        name=NAME,
        label="Cluster",
        query=f"label_values({series}, {DEFAULT_LABEL})",
        dataSource=DATASOURCE,
        multi=False,  # one cluster at a time: no panel ever sums across clusters
        includeAll=False,
        refresh=2,  # on time range change: clusters come and go
        sort=1,
        hide=HIDDEN,
    )


def apply(board: dict[str, Any], clusters: Clusters) -> dict[str, Any]:
    """``board`` (a dashboard's JSON) with ``clusters``' label in its cluster variable and the
    variable's matcher in every other query. ValueError if the board has no cluster variable
    or a query cannot be read."""
    variables = board.get("templating", {}).get("list", [])
    if not any(v.get("name") == NAME and v.get("type") == "query" for v in variables):
        raise ValueError(
            f"dashboard {board.get('title')!r} has no query variable named {NAME!r} "
            "(dashboards/clusters.py: variable)"
        )
    scope = Scope(clusters.label, f"${NAME}")

    def query(promql: str) -> str:
        return keeping(scoped(promql, scope), clusters.label)

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            out = {k: walk(v) for k, v in value.items()}
            if isinstance(out.get("expr"), str):
                if out.get("query") == out["expr"]:  # grafanalib's copy of it, for other sources
                    out["query"] = query(out["expr"])
                out["expr"] = query(out["expr"])
            return out
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    result = {k: walk(v) for k, v in board.items() if k != "templating"}
    result["templating"] = {
        **board["templating"],
        "list": [_variable(v, clusters, query) for v in variables],
    }
    return result


def _variable(
    var: dict[str, Any], clusters: Clusters, query: Callable[[str], str]
) -> dict[str, Any]:
    if var.get("type") != "query" or not isinstance(var.get("query"), str):
        return var
    text = var["query"].strip()
    if text.startswith("label_values(") and text.endswith(")"):
        selector, _, label = text[len("label_values(") : -1].rpartition(",")
        if var["name"] == NAME:
            return {
                **var,
                "query": f"label_values({selector.strip()}, {clusters.label})",
                "hide": SHOWN if clusters.show else HIDDEN,
            }
        return {**var, "query": f"label_values({query(selector.strip())}, {label.strip()})"}
    if text.startswith("query_result(") and text.endswith(")"):
        return {**var, "query": f"query_result({query(text[len('query_result(') : -1])})"}
    return {**var, "query": query(text)}
