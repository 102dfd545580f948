"""Per-namespace GPU quota and chargeback dashboard: ResourceQuota hard limits against GPUs
in use and allocated (raw requests and physical GPUs), and GPU-hours over the time range,
for device-plugin requests (nvidia.com/gpu, MIG resources) and DRA ResourceClaims (per device
class, with ResourceQuota's device-class limits) side by side.

Generated into gpu-quota.json by ``python -m gpuquota.dashboards.generate``; metric names are the
quota controller's (quota/controller/metrics.py; a test checks).
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

NS = 'namespace=~"$namespace"'
RAW = f'gpuquota_namespace_gpus_allocated{{{NS}, kind="raw"}}'
PHYSICAL = f'gpuquota_namespace_gpus_allocated{{{NS}, kind="physical"}}'
DRA_RAW = f'gpuquota_namespace_dra_gpus_allocated{{{NS}, kind="raw"}}'
DRA_PHYSICAL = f'gpuquota_namespace_dra_gpus_allocated{{{NS}, kind="physical"}}'
DEVICE_CLASS = 'resource=~".+[.]deviceclass[.]resource[.]k8s[.]io/devices"'
# The node agents' usage counters (gpu-exporter with --pod-usage, issue 19), pods and DRA
# claims together: their label sets differ (pod / claim), so `or` keeps both, then per namespace.
USED_RATE = (
    f"sum by (namespace) (rate(gpu_pod_used_seconds_total{{{NS}}}[$__rate_interval]) "
    f"or rate(gpu_claim_used_seconds_total{{{NS}}}[$__rate_interval]))"
)
POWER_RATE = (
    f"sum by (namespace) (rate(gpu_pod_energy_joules_total{{{NS}}}[$__rate_interval]) "
    f"or rate(gpu_claim_energy_joules_total{{{NS}}}[$__rate_interval]))"
)
ENERGY_KWH = (
    f"sum by (namespace) (increase(gpu_pod_energy_joules_total{{{NS}}}[$__range]) "
    f"or increase(gpu_claim_energy_joules_total{{{NS}}}[$__range])) / 3.6e6"
)
ALLOCATED_PHYSICAL = f"sum by (namespace) ({PHYSICAL} or {DRA_PHYSICAL})"
# GPU-hours over the dashboard's range from the allocation gauge: mean GPUs x hours.
GPU_HOURS = "sum by (namespace) (avg_over_time({sel}[$__range])) * $__range_s / 3600"

grid = Grid()
grid.row("Cluster")
grid.add(
    stat(
        "GPUs allocated (physical)",
        f"sum({PHYSICAL}) + (sum({DRA_PHYSICAL}) or vector(0))",
        description="Both allocation paths: device-plugin requests and DRA ResourceClaims.",
    ),
    w=6,
    h=4,
)
grid.add(
    stat(
        "GPUs held through DRA claims (physical)",
        f"sum({DRA_PHYSICAL}) or vector(0)",
        description="Devices of GPU drivers (gpu.nvidia.com) that ResourceClaims hold for "
        "running pods; a claim shared by several pods counts once, adminAccess never.",
    ),
    w=6,
    h=4,
)
grid.add(
    stat(
        "GPU-hours in range (physical)",
        f"sum({GPU_HOURS.format(sel=PHYSICAL)}) "
        f"+ (sum({GPU_HOURS.format(sel=DRA_PHYSICAL)}) or vector(0))",
    ),
    w=6,
    h=4,
)
grid.add(
    stat(
        "Namespaces at >= 90% of quota",
        f"count(gpuquota_namespace_gpu_quota_used{{{NS}}} "
        f"/ gpuquota_namespace_gpu_quota_hard{{{NS}}} >= 0.9) or vector(0)",
    ),
    w=6,
    h=4,
)

grid.row("Quota per namespace")
grid.add(
    timeseries(
        "Quota used vs hard",
        (
            f"sum by (namespace, resource) (gpuquota_namespace_gpu_quota_used{{{NS}}})",
            "{{namespace}} {{resource}} used",
        ),
        (
            f"sum by (namespace, resource) (gpuquota_namespace_gpu_quota_hard{{{NS}}})",
            "{{namespace}} {{resource}} hard",
        ),
        description="GPU resources (nvidia.com/gpu, MIG profiles) in the namespaces' "
        "ResourceQuotas: status.used against status.hard.",
    )
)
grid.add(
    timeseries(
        "Quota utilisation",
        (
            f"sum by (namespace, resource) (gpuquota_namespace_gpu_quota_used{{{NS}}}) "
            f"/ sum by (namespace, resource) (gpuquota_namespace_gpu_quota_hard{{{NS}}} > 0)",
            "{{namespace}} {{resource}}",
        ),
        unit="percentunit",
        minimum=0,
    )
)
grid.add(
    timeseries(
        "Device-class quota (DRA)",
        (
            f"sum by (namespace, resource) (gpuquota_namespace_gpu_quota_used{{{NS}, {DEVICE_CLASS}}})",
            "{{namespace}} {{resource}} used",
        ),
        (
            f"sum by (namespace, resource) (gpuquota_namespace_gpu_quota_hard{{{NS}, {DEVICE_CLASS}}})",
            "{{namespace}} {{resource}} hard",
        ),
        description="ResourceQuota <device-class>.deviceclass.resource.k8s.io/devices of the "
        "GPU device classes (gpu.nvidia.com, mig.nvidia.com): devices the namespace's claims "
        "request against the limit.",
    )
)
grid.add(
    timeseries(
        "GPUs allocated (physical)",
        (f"sum by (namespace) ({PHYSICAL})", "{{namespace}} device-plugin"),
        (f"sum by (namespace) ({DRA_PHYSICAL})", "{{namespace}} dra"),
        stacked=True,
        description="Whole physical GPUs, per allocation path: a time-sliced replica or a MIG "
        "device counts as its share.",
    )
)
grid.add(
    timeseries(
        "GPUs allocated (requests)",
        (f"sum by (namespace, resource) ({RAW})", "{{namespace}} {{resource}}"),
        stacked=True,
        description="nvidia.com/gpu and MIG resources as the pods requested them.",
    )
)
grid.add(
    timeseries(
        "DRA devices held (claims)",
        (
            f"sum by (namespace, device_class) ({DRA_RAW})",
            "{{namespace}} {{device_class}}",
        ),
        stacked=True,
        description="GPU and MIG devices the namespaces' ResourceClaims hold for running "
        "pods, per device class, as allocated.",
    )
)

grid.row("Chargeback")
grid.add(
    table(
        "GPU-hours in range",
        (GPU_HOURS.format(sel=PHYSICAL), "physical"),
        (GPU_HOURS.format(sel=RAW), "requests"),
        (GPU_HOURS.format(sel=DRA_PHYSICAL), "DRA physical"),
        (GPU_HOURS.format(sel=DRA_RAW), "DRA devices"),
        description=(
            "Estimated from the allocation gauges, device-plugin and DRA apart. The billable "
            "figures come from `gpuquota report`, which integrates exact pod lifetimes and "
            "charges a shared claim once (`--by namespace,path`)."
        ),
    ),
    w=24,
)
grid.add(
    timeseries(
        "GPUs in use by namespace (measured)",
        (
            f'sum by (namespace) (gpu_pod_sm_utilization_ratio{{{NS}, owner="pod"}})',
            "{{namespace}}",
        ),
        (f"sum by (namespace) ({PHYSICAL})", "{{namespace}} allocated"),
        unit="none",
        minimum=0,
        description="Whole-GPU equivalents of SM time the namespace's processes use now "
        "(gpu-exporter --pod-usage: time-sliced and MPS GPUs split by use), beside what it "
        "holds; `gpuquota report --prometheus` charges by the same series.",
    ),
    w=24,
)

grid.row("Usage and energy (node agents' counters)")
grid.add(
    timeseries(
        "GPUs used by namespace",
        (USED_RATE, "{{namespace}} used"),
        (ALLOCATED_PHYSICAL, "{{namespace}} allocated"),
        unit="none",
        minimum=0,
        description="Physical GPUs of activity: the rate of gpu_pod_used_seconds_total and "
        "gpu_claim_used_seconds_total (GPM SM activity on a whole GPU or MIG instance x N/7, "
        "utilisation without GPM, per-process SM on shared GPUs), beside the physical GPUs "
        "the namespace holds. Needs gpu-exporter --pod-usage.",
    ),
    w=12,
)
grid.add(
    timeseries(
        "Efficiency by namespace (used / allocated)",
        (f"{USED_RATE} / ({ALLOCATED_PHYSICAL} > 0)", "{{namespace}}"),
        unit="percentunit",
        minimum=0,
        description="GPUs used over physical GPUs allocated (device-plugin and DRA): the "
        "share of what the namespace holds that it keeps busy. The billable figures, over "
        "closed windows kept in SQL, come from `gpuquota report`.",
    ),
    w=12,
)
grid.add(
    timeseries(
        "GPU power by namespace",
        (POWER_RATE, "{{namespace}}"),
        unit="watt",
        minimum=0,
        stacked=True,
        description="Each GPU's energy counter apportioned to its holders "
        "(gpu_pod_energy_joules_total, gpu_claim_energy_joules_total): a shared GPU's by "
        "activity shares, a MIG GPU's by its instances' physical shares.",
    ),
    w=12,
)
grid.add(
    table(
        "Energy in range (kWh)",
        (ENERGY_KWH, "kWh"),
        description="Joules apportioned to each namespace's pods and claims over the "
        "dashboard's range, in kWh; energy of GPUs nobody held is "
        "gpu_unallocated_energy_joules_total.",
    ),
    w=12,
)

grid.row("Idle allocations (usage ledger)")
grid.add(
    timeseries(
        "Idle GPUs by namespace",
        (f"sum by (namespace) (gpuquota_idle_allocation_gpus{{{NS}}})", "{{namespace}}"),
        unit="none",
        minimum=0,
        stacked=True,
        description="Physical GPUs of open allocations whose activity stayed under "
        "--idle-threshold (5 %) for at least --idle-for (1 h) of the usage ledger's windows "
        "(gpuquota controller with --ledger-prometheus-url): reclaim candidates, nothing is "
        "evicted. `gpuquota report --idle-allocations` lists them for any past period.",
    ),
    w=12,
)
grid.add(
    table(
        "Idle allocations now",
        (f"sum by (namespace, kind, name) (gpuquota_idle_allocation_gpus{{{NS}}})", "GPUs"),
        (
            f"sum by (namespace, kind, name) (gpuquota_idle_allocation_idle_gpu_seconds{{{NS}}})"
            " / 3600",
            "idle GPU-h",
        ),
        description="Each idle pod or DRA claim, with the GPUs it holds and the GPU-hours it "
        "has held them idle.",
    ),
    w=12,
)
grid.add(
    stat(
        "Usage ledger behind by",
        "time() - max(gpuquota_ledger_ingested_until_timestamp_seconds)",
        unit="s",
        description="How far the ledger's ingested windows trail now: one window plus "
        "--ledger-delay when healthy; alert GPUQuotaLedgerStalled fires when it grows.",
    ),
    w=6,
    h=4,
)

grid.row("Controller")
grid.add(
    stat(
        "Replicas holding the lease",
        "sum(gpuquota_controller_leader)",
        description="Exactly 1 when leader election works; 0 means nobody writes usage.",
    ),
    w=6,
    h=6,
)
grid.add(
    stat(
        "Seconds since the last store write",
        "min(gpuquota_controller_flush_lag_seconds)",
        unit="s",
    ),
    w=6,
    h=6,
)
grid.add(
    timeseries(
        "Watch restarts and relists",
        (
            "sum by (kind, reason) (increase(gpuquota_controller_watch_restarts_total"
            "[$__rate_interval]))",
            "{{kind}} restart ({{reason}})",
        ),
        (
            "sum by (kind) (increase(gpuquota_controller_relists_total[$__rate_interval]))",
            "{{kind}} relist",
        ),
    ),
    w=12,
    h=6,
)

dashboard = Dashboard(
    title="GPU quota and chargeback",
    uid="gpuquota-gpu-quota",
    description="Per-namespace GPU quota, allocation and GPU-hours from the gpuquota controller.",
    tags=["gpuquota", "gpu", "quota"],
    timezone="browser",
    refresh="1m",
    time=Time("now-7d", "now"),
    graphTooltip=1,
    templating=Templating(
        list=[
            datasource_variable(),
            clusters.variable("gpuquota_controller_leader"),
            query_variable(
                "namespace",
                "Namespace",
                'label_values({__name__=~"gpuquota_namespace_gpus_allocated|'
                'gpuquota_namespace_dra_gpus_allocated"}, namespace)',
            ),
        ]
    ),
    panels=grid.panels,
).auto_panel_ids()
