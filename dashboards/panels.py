"""Building blocks shared by the dashboards: the data source variable, panels, layout.

Every dashboard reads Prometheus through a ``$datasource`` variable (so an imported dashboard
works with whatever the Prometheus data source is called) and lays its panels out with
:class:`Grid`, so a panel's position follows from the order panels are added in.
"""

from __future__ import annotations

from grafanalib.core import (
    GridPos,
    Panel,
    RowPanel,
    Stat,
    Table,
    Target,
    Template,
    TimeSeries,
)

DATASOURCE = "${datasource}"
GRID_WIDTH = 24


def datasource_variable() -> Template:
    return Template(
        name="datasource",
        label="Data source",
        query="prometheus",
        type="datasource",
        includeAll=False,
    )


def query_variable(name: str, label: str, query: str, *, multi: bool = True) -> Template:
    """A variable filled from Prometheus, e.g. ``label_values(gpu_info, instance)``."""
    return Template(
        name=name,
        label=label,
        query=query,
        dataSource=DATASOURCE,
        multi=multi,
        includeAll=multi,
        refresh=2,  # on time range change: nodes and namespaces come and go
    )


def targets(*exprs: tuple[str, str]) -> list[Target]:
    """(expression, legend) pairs as Prometheus targets with refIds A, B, ..."""
    return [
        Target(expr=expr, legendFormat=legend, refId=chr(ord("A") + i), datasource=DATASOURCE)
        for i, (expr, legend) in enumerate(exprs)
    ]


class Grid:
    """Places panels left to right, wrapping at Grafana's 24 columns."""

    def __init__(self) -> None:
        self.panels: list[Panel] = []
        self._x = 0
        self._y = 0
        self._row_height = 0

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append(
            RowPanel(title=title, gridPos=GridPos(h=1, w=GRID_WIDTH, x=0, y=self._y))
        )
        self._y += 1

    def add(self, panel: Panel, w: int = 12, h: int = 8) -> None:
        if self._x + w > GRID_WIDTH:
            self._newline()
        panel.gridPos = GridPos(h=h, w=w, x=self._x, y=self._y)
        self.panels.append(panel)
        self._x += w
        self._row_height = max(self._row_height, h)

    def _newline(self) -> None:
        self._y += self._row_height
        self._x, self._row_height = 0, 0


def timeseries(
    title: str,
    *exprs: tuple[str, str],
    unit: str = "",
    description: str = "",
    minimum: float | None = None,
    maximum: float | None = None,
    stacked: bool = False,
) -> TimeSeries:
    return TimeSeries(
        title=title,
        description=description or None,
        dataSource=DATASOURCE,
        targets=targets(*exprs),
        unit=unit,
        valueMin=minimum,
        valueMax=maximum,
        legendDisplayMode="table",
        legendPlacement="right",
        legendCalcs=["lastNotNull", "max"],
        tooltipMode="multi",
        stacking={"mode": "normal", "group": "A"} if stacked else {"mode": "none"},
        fillOpacity=20 if stacked else 0,
    )


def stat(title: str, expr: str, *, unit: str = "none", description: str = "") -> Stat:
    return Stat(
        title=title,
        description=description or None,
        dataSource=DATASOURCE,
        targets=targets((expr, "")),
        format=unit,
        reduceCalc="lastNotNull",
        graphMode="none",
    )


def table(title: str, *exprs: tuple[str, str], description: str = "") -> Table:
    """An instant-query table: one row per series, its labels as columns."""
    table_targets = targets(*exprs)
    for target in table_targets:
        target.instant = True
        target.format = "table"
    return Table(
        title=title,
        description=description or None,
        dataSource=DATASOURCE,
        targets=table_targets,
        transformations=[
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {"excludeByName": {"Time": True}}},
        ],
        filterable=True,
    )
