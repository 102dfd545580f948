"""`--chart`: physical GPU-hours per group over the period as a stacked bar chart (matplotlib,
Agg backend, PNG or SVG by the file's extension)."""

from __future__ import annotations

import importlib.util
import sys
from datetime import datetime
from fractions import Fraction
from pathlib import Path
from types import ModuleType

from gpuquota.quota.report.compute import HOUR, OTHER, Report
from gpuquota.quota.report.period import Period

MAX_SERIES = 10  # the colours of matplotlib's default cycle: no two groups share one
OTHER_COLOUR = "#9e9e9e"  # grey: (other) is never mistaken for a group


class ChartUnavailableError(Exception):
    pass


def require() -> ModuleType:
    """This module, once matplotlib is known to be importable."""
    if importlib.util.find_spec("matplotlib") is None:
        raise ChartUnavailableError(
            "--chart needs matplotlib, which is not installed: pip install 'gpuquota[chart]'"
        )
    return sys.modules[__name__]


def draw(report: Report, period: Period, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    edges = report.bucket_edges
    labels = [datetime.fromtimestamp(t, period.tz).strftime("%Y-%m-%d %H:%M") for t in edges[:-1]]
    shown = report.groups[:MAX_SERIES]
    rest = report.groups[MAX_SERIES:]
    series = [(" / ".join(k or "(none)" for k in g.keys), g.series) for g in shown]
    folded = [i for i, g in enumerate(shown) if all(k == OTHER for k in g.keys)]
    other = [sum((g.series[i] for g in rest), Fraction(0)) for i in range(len(edges) - 1)]
    for i in folded:  # --top's (other) row joins the rest, drawn last
        other = [a + b for a, b in zip(other, series[i][1], strict=True)]
    series = [s for i, s in enumerate(series) if i not in folded]
    if rest or folded:
        series.append((OTHER, other))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.3 * len(labels) + 3), 4.5))
    try:
        bottom = [0.0] * len(labels)
        for n, (name, values) in enumerate(series):
            hours = [float(v / HOUR) for v in values]
            colour = colours_for(name, n)
            ax.bar(range(len(labels)), hours, bottom=bottom, label=name, color=colour)
            bottom = [b + h for b, h in zip(bottom, hours, strict=True)]
        ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("physical GPU-hours")
        ax.set_title(f"GPU-hours by {', '.join(report.keys)}, {period.label()}", fontsize=9)
        if series:
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        fig.tight_layout()
        fig.savefig(path, format=path.suffix.lower().lstrip("."))
    finally:
        plt.close(fig)


def colours_for(name: str, index: int) -> str:
    """The n-th group's colour of the default cycle (C0..C9); grey for (other)."""
    return OTHER_COLOUR if name == OTHER else f"C{index % MAX_SERIES}"
