"""Per-node GPU dashboard: utilisation, memory, power, temperature, clocks, throttling,
errors and health, and which pods hold which GPU (through the pod attribution join metric).

Generated into gpu-node.json by ``python -m gpuquota.dashboards.generate``; metric names come from
exporter/expose/metrics.py only (a test checks).
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

# Every exporter series carries gpu (NVML index) and uuid; the node is the scrape target.
# node: the label the agent puts on every gpu_* series (docs/metrics.md), a scrape relabel
# not needed
SEL = 'node=~"$node", gpu=~"$gpu"'
ON_NODE = '* on (instance) group_left (node) max by (instance, node) (gpu_info{node=~"$node"})'
BY_GPU = "{{node}} GPU {{gpu}}"
BY_POD = "{{namespace}}/{{pod}}"
# a pod the node names by UID alone (it holds no GPU through the kubelet: issue 35) has empty
# namespace and pod labels: its own target and legend, instead of a legend of "/"
NAMED = 'owner="pod", pod!=""'
UID_ONLY = 'owner="pod", pod=""'
BY_UID = "pod uid {{pod_uid}} (name unknown) GPU {{gpu}}"

grid = Grid()
grid.row("Overview")
grid.add(stat("GPUs", f"count(gpu_info{{{SEL}}})"), w=4, h=4)
grid.add(
    stat("Mean utilisation", f"avg(gpu_utilization_ratio{{{SEL}}})", unit="percentunit"),
    w=4,
    h=4,
)
grid.add(stat("Power draw", f"sum(gpu_power_watts{{{SEL}}})", unit="watt"), w=4, h=4)
grid.add(
    stat(
        "Memory used",
        f"sum(gpu_memory_used_bytes{{{SEL}}}) / sum(gpu_memory_total_bytes{{{SEL}}})",
        unit="percentunit",
    ),
    w=4,
    h=4,
)
grid.add(
    stat(
        "Unhealthy devices",
        f'count(gpu_health_state{{{SEL}, state="unhealthy"}} == 1) or vector(0)',
        description="GPUs and MIG instances the health checker withdrew from new pods.",
    ),
    w=4,
    h=4,
)
grid.add(
    stat("XID errors (range)", f"sum(increase(gpu_xid_errors_total{{{SEL}}}[$__range]))"),
    w=4,
    h=4,
)

grid.row("Utilisation and memory")
grid.add(
    timeseries(
        "GPU utilisation",
        (f"gpu_utilization_ratio{{{SEL}}}", BY_GPU),
        unit="percentunit",
        minimum=0,
        maximum=1,
        description="Share of time one or more kernels ran (NVML utilization.gpu).",
    )
)
grid.add(
    timeseries(
        "Memory controller utilisation",
        (f"gpu_memory_utilization_ratio{{{SEL}}}", BY_GPU),
        unit="percentunit",
        minimum=0,
        maximum=1,
    )
)
grid.add(
    timeseries(
        "Framebuffer memory used",
        (f"gpu_memory_used_bytes{{{SEL}}}", BY_GPU),
        (f"gpu_memory_total_bytes{{{SEL}}}", "{{node}} GPU {{gpu}} total"),
        unit="bytes",
        minimum=0,
    ),
    w=24,
)

grid.row("Power, temperature and clocks")
grid.add(
    timeseries(
        "Power draw",
        (f"gpu_power_watts{{{SEL}}}", BY_GPU),
        (f"gpu_power_limit_watts{{{SEL}}}", "{{node}} GPU {{gpu}} limit"),
        unit="watt",
        minimum=0,
    )
)
grid.add(
    timeseries(
        "Temperature",
        (f"gpu_temperature_celsius{{{SEL}}}", BY_GPU),
        (f"gpu_memory_temperature_celsius{{{SEL}}}", "{{node}} GPU {{gpu}} memory"),
        unit="celsius",
    )
)
grid.add(
    timeseries(
        "SM clock",
        (f"gpu_sm_clock_hertz{{{SEL}}}", BY_GPU),
        unit="hertz",
    )
)
grid.add(
    timeseries(
        "Throttle reasons active",
        (f"gpu_clock_event_reason{{{SEL}}} == 1", "{{node}} GPU {{gpu}} {{reason}}"),
        description="Why clocks are held down (NVML clock event reasons); 1 while active.",
    )
)

grid.row("Errors and health")
grid.add(
    timeseries(
        "XID errors",
        (
            f"increase(gpu_xid_errors_total{{{SEL}}}[$__rate_interval])",
            "{{node}} GPU {{gpu}} XID {{xid}}",
        ),
    )
)
grid.add(
    timeseries(
        "Uncorrectable ECC errors",
        (
            f'increase(gpu_ecc_volatile_errors_total{{{SEL}, type="uncorrected"}}[$__rate_interval])',
            BY_GPU,
        ),
    )
)
grid.add(
    timeseries(
        "Health state",
        (f'gpu_health_state{{{SEL}, state="degraded"}} == 1', "{{node}} {{uuid}} degraded"),
        (f'gpu_health_state{{{SEL}, state="unhealthy"}} == 1', "{{node}} {{uuid}} unhealthy"),
        description="Devices that are not healthy (docs/health.md); healthy ones draw nothing.",
    )
)
grid.add(
    timeseries(
        "Device state (NVML)",
        (f'gpu_device_state{{{SEL}, state!="ok"}} == 1', "{{node}} {{uuid}} {{state}}"),
        description="Devices NVML reports lost, needing a reset, or unreadable.",
    )
)
grid.add(
    table(
        "Active health reasons and recommended actions",
        (f"gpu_health_reason{{{SEL}}} == 1", ""),
        description="One row per reason behind a degraded or unhealthy verdict "
        "(xid_79, gpu_lost, row_remap_pending, ...) with NVIDIA's recommended action.",
    ),
    w=24,
)

grid.row("Profiling (GPM: Hopper and later)")
grid.add(
    timeseries(
        "SM activity and occupancy",
        (f"gpu_sm_active_ratio{{{SEL}}}", "{{node}} GPU {{gpu}} {{mig_profile}} SM active"),
        (f"gpu_sm_occupancy_ratio{{{SEL}}}", "{{node}} GPU {{gpu}} {{mig_profile}} occupancy"),
        unit="percentunit",
        minimum=0,
        maximum=1,
        description="SM active: share of SM cycles with a warp resident (what "
        "DCGM_FI_PROF_SM_ACTIVE shows); occupancy: resident warps of the maximum. Unlike GPU "
        "utilisation, a kernel on one SM of 132 shows as 1/132. MIG instances have their own "
        "series. GPUs before Hopper have none.",
    )
)
grid.add(
    timeseries(
        "Tensor and DRAM activity",
        (
            f'gpu_pipe_active_ratio{{{SEL}, pipe="tensor"}}',
            "{{node}} GPU {{gpu}} {{mig_profile}} tensor",
        ),
        (f"gpu_dram_active_ratio{{{SEL}}}", "{{node}} GPU {{gpu}} {{mig_profile}} DRAM"),
        unit="percentunit",
        minimum=0,
        maximum=1,
        description="Tensor: share of cycles any tensor pipe was busy; DRAM: memory bandwidth "
        "used of the peak (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, DCGM_FI_PROF_DRAM_ACTIVE).",
    )
)
grid.add(
    timeseries(
        "Pipes by precision",
        (
            f'gpu_pipe_active_ratio{{{SEL}, pipe!="tensor"}}',
            "{{node}} GPU {{gpu}} {{mig_profile}} {{pipe}}",
        ),
        unit="percentunit",
        minimum=0,
        maximum=1,
        description="FP64, FP32, FP16 and integer pipes, and tensor pipes by precision "
        "(HMMA: FP16/BF16/TF32, IMMA: integer, DFMA/DMMA: FP64).",
    )
)
grid.add(
    timeseries(
        "PCIe and NVLink bandwidth",
        (f"gpu_pcie_tx_bytes_per_second{{{SEL}}}", "{{node}} GPU {{gpu}} PCIe tx"),
        (f"gpu_pcie_rx_bytes_per_second{{{SEL}}}", "{{node}} GPU {{gpu}} PCIe rx"),
        (
            f"gpu_nvlink_bandwidth_bytes_per_second{{{SEL}}}",
            "{{node}} GPU {{gpu}} NVLink {{direction}}",
        ),
        unit="Bps",
        minimum=0,
    )
)

grid.row("Pods on these GPUs")
grid.add(
    timeseries(
        "GPU utilisation by pod",
        (
            f"gpu_pod_info{{{SEL}}} * on(uuid) group_left gpu_utilization_ratio{{{SEL}}}",
            BY_POD,
        ),
        unit="percentunit",
        description=(
            "Utilisation of the GPU each pod holds. Time-sliced GPUs show every pod sharing "
            "them with the whole GPU's utilisation; 'SM use by pod' splits it where the "
            "exporter runs --pod-usage."
        ),
    )
)
grid.add(
    timeseries(
        "SM use by pod",
        (f"gpu_pod_sm_utilization_ratio{{{SEL}, {NAMED}}}", "{{namespace}}/{{pod}} GPU {{gpu}}"),
        (f"gpu_pod_sm_utilization_ratio{{{SEL}, {UID_ONLY}}}", BY_UID),
        (
            f'sum by (node, gpu) (gpu_pod_sm_utilization_ratio{{{SEL}, owner!="pod"}})',
            "{{node}} GPU {{gpu}} host and unknown processes",
        ),
        unit="percentunit",
        minimum=0,
        description="Each pod's own share of its GPU's SM time, from its processes "
        "(nvmlDeviceGetProcessUtilization, mapped through their cgroups): who uses a "
        "time-sliced or MPS GPU. Needs the exporter's --pod-usage (deploy/components/pod-usage).",
    )
)
grid.add(
    timeseries(
        "Framebuffer memory by pod",
        (f"gpu_pod_memory_used_bytes{{{SEL}, {NAMED}}}", "{{namespace}}/{{pod}} GPU {{gpu}}"),
        (f"gpu_pod_memory_used_bytes{{{SEL}, {UID_ONLY}}}", BY_UID),
        (
            f'sum by (node, gpu) (gpu_pod_memory_used_bytes{{{SEL}, owner!="pod"}})',
            "{{node}} GPU {{gpu}} host and unknown processes",
        ),
        unit="bytes",
        minimum=0,
        description="Framebuffer used by each pod's processes (MIG instances too).",
    )
)
grid.add(
    table(
        "GPU use by pod",
        (f"gpu_pod_memory_used_bytes{{{SEL}}}", ""),
        description="Every pod (owner=pod), host process group (owner=host) and process of "
        "a pod this node does not list (owner=unknown) using a GPU now, with its framebuffer.",
    ),
    w=24,
)
grid.add(
    timeseries(
        "Framebuffer memory by pod's GPU",
        (
            f"gpu_pod_info{{{SEL}}} * on(uuid) group_left gpu_memory_used_bytes{{{SEL}}}",
            BY_POD,
        ),
        unit="bytes",
    )
)
grid.add(table("Pod attribution", (f"gpu_pod_info{{{SEL}}}", "")), w=18)
grid.add(
    timeseries(
        "kubelet pod-resources",
        # the agent's own series name no node (a relabel may add one): its node is that of
        # its gpu_info, joined by the scrape target
        (f"gpuquota_exporter_pod_resources_up {ON_NODE}", "{{node}} up"),
        (
            "increase(gpuquota_exporter_pod_resources_errors_total[$__rate_interval]) " + ON_NODE,
            "{{node}} errors",
        ),
        description="Whether the exporter can ask the kubelet which pods hold which GPUs.",
    ),
    w=6,
)

dashboard = Dashboard(
    title="GPU node",
    uid="gpuquota-gpu-node",
    description="GPUs of selected nodes as gpu-exporter sees them, with the pods holding them.",
    tags=["gpuquota", "gpu"],
    timezone="browser",
    refresh="30s",
    time=Time("now-3h", "now"),
    graphTooltip=1,
    templating=Templating(
        list=[
            datasource_variable(),
            clusters.variable("gpu_info"),
            query_variable("node", "Node", "label_values(gpu_info, node)"),
            query_variable("gpu", "GPU", 'label_values(gpu_info{node=~"$node"}, gpu)'),
        ]
    ),
    panels=grid.panels,
).auto_panel_ids()
