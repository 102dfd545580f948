"""`--chart`: physical GPU-hours per group over the period as a stacked bar chart (matplotlib,
Agg backend, PNG or SVG by the file's extension)."""

from __future__ import annotations

import importlib.util
import sys
from datetime import datetime
from fractions import Fraction
from pathlib import Path
from types import ModuleType

from quota.report.compute import HOUR, Report
from quota.report.period import Period

MAX_SERIES = 10


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
    if rest:
        other = [sum((g.series[i] for g in rest), Fraction(0)) for i in range(len(edges) - 1)]
        series.append(("(other)", other))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.3 * len(labels) + 3), 4.5))
    try:
        bottom = [0.0] * len(labels)
        for name, values in series:
            hours = [float(v / HOUR) for v in values]
            ax.bar(range(len(labels)), hours, bottom=bottom, label=name)
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
