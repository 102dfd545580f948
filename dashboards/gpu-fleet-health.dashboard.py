"""Fleet-health GPU dashboard (issue 29): which GPUs keep failing, by board serial (a GPU moved
to another node keeps its serial, not its UUID), fences over time, and failure rates per
model. For an exact history over any past month (observed time only, RMA evidence), use
`gpuquota gpus` (docs/health.md); this dashboard shows what Prometheus still holds.

A fence is a rising edge of the unhealthy verdict: over a range,
floor((changes + last value) / 2) counts them (a GPU fenced before the range and still fenced
is no fence in it). Joined to the serial by the last gpu_info of each UUID in the range.

Generated into gpu-fleet-health.json by ``python -m gpuquota.dashboards.generate``.
"""

from grafanalib.core import Dashboard, Templating, Time

from gpuquota.dashboards import clusters
from gpuquota.dashboards.panels import (
    Grid,
    datasource_variable,
    query_variable,
    stat,
    table,
    timeseries,
)

UNHEALTHY = 'gpu_health_state{node=~"$node", state="unhealthy"}'
INFO = 'gpu_info{node=~"$node", model=~"$model"}'


def fences(window: str) -> str:
    """Fences per UUID in ``window``, with the GPU's serial and model."""
    return (
        f"floor((changes({UNHEALTHY}[{window}]) + last_over_time({UNHEALTHY}[{window}])) / 2)"
        f" * on (uuid) group_left (serial, model) max by (uuid, serial, model) "
        f"(last_over_time({INFO}[{window}]))"
    )


grid = Grid()
grid.row("Fleet")
grid.add(stat("GPUs", f"count(count by (serial) (last_over_time({INFO}[$__range])))"), w=6, h=4)
grid.add(
    stat(
        "Fenced now",
        f"count(({UNHEALTHY} == 1) * on (uuid) group_left (model) max by (uuid, model) ({INFO}))"
        " or vector(0)",
        description="GPUs the health checker holds unhealthy: withdrawn from new pods.",
    ),
    w=6,
    h=4,
)
grid.add(
    stat(
        "Fences in range",
        f"sum({fences('$__range')}) or vector(0)",
        description="Changes into unhealthy in the time range, all GPUs.",
    ),
    w=6,
    h=4,
)
grid.add(
    stat(
        "GPUs fenced more than once",
        f"count(sum by (serial) ({fences('$__range')}) > 1) or vector(0)",
        description="Fenced again after a release in the range: did the recovery hold? "
        "`gpuquota gpus` says how long each release held.",
    ),
    w=6,
    h=4,
)

grid.row("Worst GPUs")
grid.add(
    table(
        "Worst GPUs: fences in range, by serial",
        (f"topk(20, sum by (serial, model) ({fences('$__range')}))", "fences"),
        (
            "topk(20, sum by (serial, model) (increase(gpu_xid_errors_total"
            '{node=~"$node"}[$__range]) * on (uuid) group_left (serial, model) '
            f"max by (uuid, serial, model) (last_over_time({INFO}[$__range]))))",
            "XIDs",
        ),
        description="The GPUs fenced most often, with their XIDs; a serial fenced again and "
        "again is an RMA case: `gpuquota gpus --serial S --evidence`.",
    ),
    w=24,
    h=8,
)

grid.row("Over time")
grid.add(
    timeseries(
        "Fences by model",
        (f"sum by (model) ({fences('$__rate_interval')})", "{{model}}"),
        description="Fences per model in each interval.",
    )
)
grid.add(
    timeseries(
        "Fenced GPUs by model",
        (
            f"sum by (model) ({UNHEALTHY} * on (uuid) group_left (model) "
            f"max by (uuid, model) ({INFO}))",
            "{{model}}",
        ),
        description="GPUs held unhealthy at each moment.",
    )
)

grid.row("Failure rate")
grid.add(
    table(
        "Fences per 1,000 GPU-days, by model",
        (
            f"sum by (model) ({fences('$__range')}) / (count by (model) "
            f"(last_over_time({INFO}[$__range])) * $__range_s / 86400) * 1000",
            "fences per 1,000 GPU-days",
        ),
        description="Fences in the range per 1,000 GPU-days of the GPUs seen in it (GPUs x "
        "range: time a GPU was not scraped counts too). `gpuquota gpus --by model` divides "
        "by observed time only.",
    ),
    w=24,
    h=6,
)

dashboard = Dashboard(
    title="GPU fleet health",
    uid="gpuquota-gpu-fleet-health",
    description="Which GPUs keep failing, by board serial; fences over time; failure rates.",
    tags=["gpuquota", "gpu", "health"],
    timezone="browser",
    refresh="1m",
    time=Time("now-7d", "now"),
    graphTooltip=1,
    templating=Templating(
        list=[
            datasource_variable(),
            clusters.variable("gpu_info"),
            query_variable("node", "Node", "label_values(gpu_info, node)"),
            query_variable("model", "Model", "label_values(gpu_info, model)"),
        ]
    ),
    panels=grid.panels,
).auto_panel_ids()
