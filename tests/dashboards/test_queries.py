"""Every dashboard query returns data from a real Prometheus scraping our programs.

A real Prometheus scrapes gpu-exporter (on an NVML stand-in node with pods from the kubelet
stand-in, one GPU unhealthy, one degraded, one needing a reset, one throttled) and `gpuquota
controller` (watching the kube-apiserver stand-in, whose watches are cut once and expired once).
Then every template variable's query and every panel target of every generated dashboard runs
against it, with Grafana's variables filled in the way Grafana fills them: the test walks the
dashboards' JSON, so a panel added later is checked without touching this file. A query that
returns nothing here is a panel that would stay empty on a real cluster in the same state.

That Prometheus holds one cluster, its series without a cluster label: the hidden ``cluster``
variable offers nothing, Grafana fills in its "None" value, the empty string, and every panel
must still show data. A second Prometheus scrapes the same programs twice, as clusters ``a``
and ``b`` (a shared Prometheus, or Thanos behind two): there each panel, set to ``a``, shows
only ``a``'s series, keeps the label in what it aggregates, and set to a cluster that has no
series shows nothing: every selector of every query is filtered by the variable.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuquota.dashboards import clusters, generate
from gpuquota.sim import promserver
from gpuquota.sim.apiserver import ApiServer
from gpuquota.sim.harness import free_port, stop_process, wait_for
from gpuquota.sim.kubelet.podresources import Assignment, PodResourcesServer
from gpuquota.sim.nvml.control import SimNode
from tests.accounting import objects
from tests.dashboards.grafana_schema import panels
from tests.prometheus import Prometheus, running

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

BIN = Path(sys.executable).parent
GPU = "nvidia.com/gpu"
# Grafana's built-in variables, as Grafana sets them for a 1-hour view scraped every second.
BUILTINS = {
    "__rate_interval": "15s",
    "__interval": "1s",
    "__range_s": "3600",
    "__range": "1h",
}
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")  # a label a legend shows: {{name}}


@dataclass(frozen=True)
class Query:
    dashboard: str
    panel: str
    ref: str
    expr: str
    legend: str = ""

    def __str__(self) -> str:
        return f"{self.dashboard}: {self.panel} {self.ref}"


def dashboards() -> dict[str, dict[str, Any]]:
    return {path.name: json.loads(text) for path, text in generate.rendered().items()}


def panel_queries() -> list[Query]:
    return [
        Query(
            name,
            panel.get("title", "?"),
            target.get("refId", "?"),
            target["expr"],
            target.get("legendFormat", ""),
        )
        for name, board in dashboards().items()
        for panel in panels(board)
        for target in panel.get("targets", [])
        if target.get("expr") and not target.get("hide")
    ]


def fill(expr: str, values: dict[str, str]) -> str:
    """Grafana's interpolation: $name, ${name} and ${name:format} (regex format for PromQL)."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        assert name in values, f"{expr}: ${name} is neither a dashboard variable nor a built-in"
        return values[name]

    return VARIABLE.sub(one, expr)


def as_regex(options: list[str]) -> str:
    """A multi-value variable set to All (no allValue): Grafana's (a|b|c), regex-escaped."""
    escaped = [re.escape(v).replace("\\", "\\\\") for v in options]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def variable_options(prom: Prometheus, query: str) -> list[str]:
    """What a Prometheus query variable offers: label_values(...) or query_result(...)."""
    call = re.fullmatch(r"\s*label_values\((.*)\)\s*", query, re.S)
    if call:
        selector, _, label = call.group(1).rpartition(",")
        params = {"match[]": selector.strip()} if selector.strip() else {}
        return sorted(prom.api(f"label/{label.strip()}/values", **params))
    result = re.fullmatch(r"\s*query_result\((.*)\)\s*", query, re.S)
    expr = result.group(1) if result else query
    return [json.dumps(series["metric"]) for series in prom.query(expr)]


def resolve_variables(prom: Prometheus, board: dict[str, Any]) -> dict[str, list[str]]:
    """Each variable's options, in dashboard order (a variable may use the ones before it)."""
    resolved: dict[str, list[str]] = {}
    for variable in board.get("templating", {}).get("list", []):
        kind, name = variable.get("type"), variable["name"]
        if kind == "datasource":
            continue
        if kind == "query":
            query = variable["query"]
            query = query["query"] if isinstance(query, dict) else query
            options = variable_options(prom, fill(query, values_of(resolved)))
            single = not variable.get("multi") and not variable.get("includeAll")
            resolved[name] = options[:1] if single else options  # Grafana selects the first
        elif kind in ("custom", "constant", "interval", "textbox"):
            resolved[name] = [v.strip() for v in str(variable.get("query", "")).split(",")]
    return resolved


# Grafana's value for a variable whose query offers nothing (its NONE_VARIABLE_VALUE, shown
# as "None")
NONE = ""


def values_of(resolved: dict[str, list[str]]) -> dict[str, str]:
    return {
        **BUILTINS,
        "datasource": "prometheus",
        **{name: as_regex(options) if options else NONE for name, options in resolved.items()},
    }


# --- the scene: node, cluster, programs, Prometheus ---------------------------------------------


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return str(response.read().decode())
    except OSError:
        return None


@pytest.fixture(scope="module")
def scene(sim_library: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    work = tmp_path_factory.mktemp("scene")
    with ExitStack() as stack:
        node = SimNode.create(work / "node.state", "h100x8")
        stack.callback(node.close)
        for i in range(node.gpu_count):
            node.set(i, gpu_utilization_ratio=0.1 * i, power_watts=120.0 + 40 * i)
        uuids = [node.uuid(i) for i in range(node.gpu_count)]
        pods = [
            Assignment("team-a", "train-0", "main", GPU, tuple(uuids[0:4]), _UIDS[0]),
            Assignment("team-b", "serve-0", "main", GPU, (uuids[4],), _UIDS[1]),
        ]
        checkpoint = work / "kubelet_internal_checkpoint"  # the kubelet's: the pods' UIDs
        kubelet = PodResourcesServer(work / "pod-resources.sock", pods, checkpoint=checkpoint)
        kubelet.start()
        stack.callback(kubelet.stop)
        node.set(4, clock_event_reasons=0x4)  # SW power cap: a throttled GPU
        for i in range(node.gpu_count):  # profiling, as an H100 under a matmul reads
            node.set_gpm(i, sm_activity=0.95, sm_occupancy=0.14, tensor_activity=0.93,
                         hmma_tensor_activity=0.93, dram_activity=0.24, fp32_activity=0.05,
                         pcie_tx_bytes_per_second=6e6, nvlink_tx_bytes_per_second=2e9)  # fmt: skip

        api = ApiServer().start()
        stack.callback(api.stop)
        api.apply("ADDED", objects.node("gpu-1"))
        proc = _pod_processes(node, api, work / "proc")

        exporter_port = free_port()
        exporter = subprocess.Popen(
            [
                str(BIN / "gpu-exporter"),
                f"--listen=127.0.0.1:{exporter_port}",
                "--interval=1s",
                f"--pod-resources-socket={work / 'pod-resources.sock'}",
                "--health-quiet-period=1h",
                "--pod-usage",
                f"--device-checkpoint={checkpoint}",
                "--node-name=gpu-1",
                f"--proc-root={proc}",
                f"--kubeconfig={api.write_kubeconfig(work / 'exporter-kubeconfig')}",
            ],
            env={**_env(), **node.env()},
            stdout=(work / "exporter.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        stack.callback(stop_process, exporter)
        metrics = f"http://127.0.0.1:{exporter_port}/metrics"
        wait_for(lambda: "gpu_pod_info{" in (_get(metrics) or ""), 20, "pod attribution")
        wait_for(lambda: "gpu_sm_active_ratio{" in (_get(metrics) or ""), 20, "GPM pairs")
        node.inject_xid(1, 79)  # fell off the bus: unhealthy
        node.inject_xid(2, 13)  # graphics engine exception: degraded
        node.set_reset_required(3)
        started = int(time.time()) - 60
        for team, gpus, hard in (("team-a", 4, 4), ("team-b", 1, 8)):
            api.apply("ADDED", objects.namespace(team))
            api.apply("ADDED", objects.quota(team, hard=hard, used=gpus))
            pod = objects.pod(f"uid-{team}", "p", team, gpus=gpus, created=started, start=started)
            api.apply("ADDED", pod)
        # a team whose GPUs come through a DRA ResourceClaim, with device-class quota
        api.apply("ADDED", objects.dra_slice("gpu-1", devices=2))
        api.apply("ADDED", objects.namespace("team-dra"))
        device_quota = objects.quota("team-dra", hard=None, used=None)
        key = "gpu.nvidia.com.deviceclass.resource.k8s.io/devices"
        device_quota["spec"]["hard"] = device_quota["status"]["hard"] = {key: "4"}
        device_quota["status"]["used"] = {key: "2"}
        api.apply("ADDED", device_quota)
        api.apply(
            "ADDED",
            objects.dra_claim(
                "gpus", "team-dra", devices=("gpu-0", "gpu-1"), reserved_for=("uid-dra",)
            ),
        )
        api.apply(
            "ADDED",
            objects.dra_pod("uid-dra", "dra-train", "team-dra", created=started, start=started),
        )
        controller_port = free_port()
        # Prometheus first: the controller's usage ledger reads the exporter's counters from it
        prom = stack.enter_context(
            running(work, {"gpu": [exporter_port], "gpuquota": [controller_port]})
        )
        controller = subprocess.Popen(
            [
                str(BIN / "gpuquota"),
                "controller",
                f"--kubeconfig={api.write_kubeconfig(work / 'kubeconfig')}",
                f"--db=sqlite:///{work / 'gpuquota.db'}",
                "--cluster=dashboards",
                "--migrate",
                f"--metrics-port={controller_port}",
                "--metrics-address=127.0.0.1",
                "--flush-interval=500ms",
                f"--ledger-prometheus-url={prom.url}",
                "--ledger-window=5s",
                "--ledger-delay=2s",
                "--ledger-max-gap=2s",
                "--ledger-backfill=1m",
                "--idle-for=5s",
            ],
            env=_env(),
            stdout=(work / "controller.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        stack.callback(stop_process, controller)
        controller_metrics = f"http://127.0.0.1:{controller_port}/metrics"
        wait_for(
            lambda: "gpuquota_controller_synced 1.0" in (_get(controller_metrics) or ""),
            30,
            "the controller to sync",
        )
        api.cut_watches()  # a watch restart
        wait_for(lambda: "gpuquota_controller_synced 1.0" in (_get(controller_metrics) or ""), 30)
        api.force_gone()  # history compacted: a relist
        prom.wait_for("count(up == 1) == 2", bool)
        # serve-0's GPU at 1 % (_pod_processes): the ledger lists it as an idle allocation
        prom.wait_for("gpuquota_idle_allocation_gpus", bool)
        # a few scrapes, so rates and increases have two samples in their window
        prom.wait_for("count_over_time(up[1m]) >= 4", lambda r: len(r) == 2)
        yield prom


def _pod_processes(node: SimNode, api: ApiServer, root: Path) -> Path:
    """GPU processes of the two pods the kubelet stand-in lists (their cgroups in a proc tree
    under ``root``, the pods with their UIDs on the API server) and one host process."""
    for pid, (namespace, pod, uid, gpu, sm) in enumerate(
        [("team-a", "train-0", _UIDS[0], 0, 0.6), ("team-b", "serve-0", _UIDS[1], 4, 0.3)], 101
    ):
        cid = f"{pid:064x}"
        gpus = {"team-a": "4", "team-b": "1"}[namespace]  # as the kubelet stand-in assigns
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 60))
        api.apply("ADDED", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "namespace": namespace, "uid": uid,
                         "creationTimestamp": started},
            "spec": {"nodeName": "gpu-1", "containers": [
                {"name": "main", "image": "x",
                 "resources": {"requests": {GPU: gpus}, "limits": {GPU: gpus}}}]},
            "status": {"phase": "Running", "startTime": started, "containerStatuses": [
                {"name": "main", "containerID": f"containerd://{cid}", "ready": True,
                 "restartCount": 0, "image": "x", "imageID": "x",
                 "state": {"running": {"startedAt": started}}}]},
        })  # fmt: skip
        slice_ = f"kubepods-burstable-pod{uid.replace('-', '_')}.slice"
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cgroup").write_text(
            f"0::/kubepods.slice/kubepods-burstable.slice/{slice_}/cri-containerd-{cid}.scope\n"
        )
        node.add_process(gpu, pid, 12 * 2**30)
        node.set_process_utilization(gpu, pid, sm=sm, memory=0.2)
    node.set_gpm(4, sm_activity=0.01)  # serve-0 holds GPU 4 and barely uses it: idle
    (root / "300").mkdir()
    (root / "300" / "cgroup").write_text("0::/system.slice/benchmark.service\n")
    node.add_process(0, 300, 2**30)
    node.set_process_utilization(0, 300, sm=0.1, memory=0.05)
    # a pod that sees GPU 6 without holding it through the kubelet (NVIDIA_VISIBLE_DEVICES):
    # its cgroup names its UID, and nothing on the node names it (issue 35)
    slice_ = f"kubepods-besteffort-pod{UNNAMED.replace('-', '_')}.slice"
    (root / "400").mkdir()
    (root / "400" / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-besteffort.slice/{slice_}/cri-containerd-{400:064x}.scope\n"
    )
    node.add_process(6, 400, 2**30)
    node.set_process_utilization(6, 400, sm=0.2, memory=0.05)
    return root


_UIDS = ("3f6c9a2e-1b4d-4c8e-9f0a-2b3c4d5e6f70", "8a7b6c5d-4e3f-4a1b-9c8d-7e6f5a4b3c2d")
UNNAMED = "5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a"  # a pod the node knows by UID alone


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}


QUERIES = panel_queries()


def test_every_dashboard_has_queries_to_check() -> None:
    assert {q.dashboard for q in QUERIES} == set(dashboards())


def test_every_template_variable_offers_values(scene: Prometheus) -> None:
    """All but the cluster variable: one cluster's series have no cluster label, so it offers
    nothing and the panels read ``cluster=""`` (test_every_panel_query_returns_data)."""
    for name, board in dashboards().items():
        resolved = resolve_variables(scene, board)
        assert resolved, f"{name} has no query variables"
        assert resolved.pop(clusters.NAME) == [], f"{name}: a cluster label in one cluster"
        empty = [variable for variable, options in resolved.items() if not options]
        assert not empty, f"{name}: variables {empty} offer nothing"


@pytest.mark.parametrize("query", QUERIES, ids=str)
def test_every_panel_query_returns_data(scene: Prometheus, query: Query) -> None:
    values = values_of(resolve_variables(scene, dashboards()[query.dashboard]))
    expr = fill(query.expr, values)
    result = scene.wait_for(expr, bool)  # changes reach Prometheus a scrape later
    assert result, f"{query}: {expr} returned no data"
    # every series' legend names its workload: no namespace or pod the legend shows is empty
    # (a pod the node knows by UID alone would read "/ GPU 6"; an optional label such as
    # mig_profile may be)
    for series in result:
        shown = set(LEGEND_LABEL.findall(query.legend)) & {"namespace", "pod"}
        empty = [k for k in sorted(shown) if not series["metric"].get(k)]
        assert not empty, f"{query}: legend {query.legend!r} of {series['metric']}: {empty} empty"


def test_a_pod_known_by_uid_alone_is_named_by_it(scene: Prometheus) -> None:
    """The scene's UID-only pod is in the node dashboard's per-pod panels, by its UID."""
    shown = [
        q
        for q in QUERIES
        if "pod_uid" in LEGEND_LABEL.findall(q.legend) and "gpu-node" in q.dashboard
    ]
    assert {q.panel for q in shown} == {"SM use by pod", "Framebuffer memory by pod"}
    values = values_of(resolve_variables(scene, dashboards()["gpu-node.json"]))
    for query in shown:
        result = scene.wait_for(fill(query.expr, values), bool)
        assert {s["metric"]["pod_uid"] for s in result} == {UNNAMED}, query


def test_variables_are_filled_the_way_grafana_fills_them() -> None:
    values = values_of({"node": ["10.0.0.1:9400", "10.0.0.2:9400"], "gpu": ["0"]})
    assert fill('x{instance=~"$node", gpu=~"${gpu}"}[$__rate_interval]', values) == (
        'x{instance=~"(10\\\\.0\\\\.0\\\\.1:9400|10\\\\.0\\\\.0\\\\.2:9400)", gpu=~"0"}[15s]'
    )
    assert fill("a[$__range] * $__range_s", values) == "a[1h] * 3600"
    with pytest.raises(AssertionError, match=r"\$nodes is neither"):
        fill("x{instance=~'$nodes'}", values)


# --- several clusters in one Prometheus ---------------------------------------------------------


@pytest.fixture(scope="module")
def two_clusters(
    scene: Prometheus, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Prometheus]:
    """A Prometheus scraping the scene's programs twice, as clusters a and b: the target label
    ``cluster`` on each copy, as a Prometheus scraping several clusters puts it on."""
    work = tmp_path_factory.mktemp("two-clusters")
    jobs: dict[str, set[str]] = {}
    for series in scene.query("up"):
        jobs.setdefault(series["metric"]["job"], set()).add(series["metric"]["instance"])
    lines = ["global:", "  scrape_interval: 1s", "  scrape_timeout: 1s", "scrape_configs:"]
    for job, targets in sorted(jobs.items()):
        lines += [f"  - job_name: {job}", "    static_configs:"]
        for cluster in ("a", "b"):
            listed = ", ".join(f"'{t}'" for t in sorted(targets))
            lines += [f"      - targets: [{listed}]", f"        labels: {{cluster: {cluster}}}"]
    config = work / "prometheus.yml"
    config.write_text("\n".join(lines) + "\n")
    with promserver.serving(config, work / "tsdb") as served:
        prom = Prometheus(served.proc, served.url)
        prom.wait_for("count(up == 1) == 4", bool)
        prom.wait_for("count_over_time(up[1m]) >= 4", lambda r: len(r) == 4)
        yield prom


def test_the_cluster_variable_offers_each_cluster(two_clusters: Prometheus) -> None:
    for name, board in dashboards().items():
        (variable,) = [v for v in board["templating"]["list"] if v["name"] == clusters.NAME]
        assert variable_options(two_clusters, variable["query"]) == ["a", "b"], name
        assert resolve_variables(two_clusters, board)[clusters.NAME] == ["a"], name


@pytest.mark.parametrize("query", QUERIES, ids=str)
def test_a_panel_shows_one_clusters_series(two_clusters: Prometheus, query: Query) -> None:
    """Set to ``a``, a panel shows data and no series of ``b``; what it keeps labels of carries
    the cluster (``by`` lists keep it); set to a cluster with no series, nothing but a
    constant: no selector reads past the variable, so no panel adds two clusters up."""
    values = values_of(resolve_variables(two_clusters, dashboards()[query.dashboard]))
    assert values[clusters.NAME] == "a"
    expr = fill(query.expr, values)
    result = two_clusters.wait_for(expr, bool)
    unlabelled = [s["metric"] for s in result if s["metric"] and "cluster" not in s["metric"]]
    assert not unlabelled, f"{query}: {expr}: series without their cluster: {unlabelled}"
    others = [s["metric"] for s in result if s["metric"].get("cluster", "a") != "a"]
    assert not others, f"{query}: {expr}: another cluster's series {others}"
    nowhere = fill(query.expr, {**values, clusters.NAME: "nowhere"})
    leaked = [s for s in two_clusters.query(nowhere) if s["metric"] or float(s["value"][1])]
    assert not leaked, f"{query}: {nowhere} reads series of no cluster chosen: {leaked}"
