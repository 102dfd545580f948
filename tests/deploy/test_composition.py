"""deploy/examples/production run as one system (issue 28): built with kubectl kustomize, then
run on this machine as the build describes it, with real parts:

- gpu-exporter with the DaemonSet's arguments and environment over the NVML stand-in, the
  kubelet's pod-resources stand-in and the API server stand-in, with the web config and
  certificate files mounted where the build mounts them, from the Secrets' keys the operator
  creates (made here by components/tls-auth/generate.py, as the docs say);
- a real Prometheus whose scrape configuration is the one the Prometheus Operator renders for
  the built ServiceMonitors (sim/promoperator.py, checked against the Operator's golden files
  in test_operator_config.py): its relabelings and target labels (namespace, service, pod,
  container, endpoint, job), honor_labels, scheme, tls_config (the CA from the referenced
  Secret, serverName) and basic_auth (from the referenced Secret), each target a static one
  carrying the labels Kubernetes discovery gives the Service's endpoint on the agent's pod;
- the controller with the Deployment's command, arguments and environment (the ConfigMap, the
  gpuquota-db Secret pointing at a real PostgreSQL), after its init container's `db upgrade`,
  its usage ledger reading that Prometheus;
- the CronJob's exact command line, with the rate card mounted from the ConfigMap the operator
  creates, run at the time the CronJob runs (the 1st of the next month, 06:00 UTC).

It passes when every target is up, the workload's GPU series name the workload's namespace and
pod (not gpuquota's, not renamed exported_*) and the agent's node, the ledger ingests windows
and the monthly CSV has costs.
What the test changes, and only because a machine is not a cluster: addresses and ports
(127.0.0.1, free ports), the kubeconfig (the stand-in's, instead of the mounted token), the
paths of host folders and mounts (under tmp), the Prometheus URL the ledger reads (the one
started here), and time: scrapes every second instead of the ServiceMonitor's interval and
ledger windows of 5 s instead of an hour (and a backfill of a minute: the default 7 days
would be 120,960 such windows), so it runs in seconds.
"""

from __future__ import annotations

import calendar
import csv
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuquota.sim import promoperator
from gpuquota.sim.apiserver import ApiServer
from gpuquota.sim.harness import free_port, stop_process, wait_for
from gpuquota.sim.kubelet.checkpoint import CHECKPOINT_FILE, PodDeviceEntry
from gpuquota.sim.kubelet.checkpoint import write as write_checkpoint
from gpuquota.sim.kubelet.podresources import Assignment, PodResourcesServer
from gpuquota.sim.ledgerdemo import DemoPod, node_object, pod_object
from gpuquota.sim.nvml.control import SimNode
from gpuquota.sim.promserver import serving
from tests.conftest import PgSchemas
from tests.deploy.manifests import (
    DEPLOY,
    OPTIONAL_MONITORS,
    ROOT,
    built,
    expanded,
    find,
    needs_kubectl,
)

BIN = Path(sys.executable).parent
NODE = "gpu-node-1"
NAMESPACE = "gpuquota"
H100 = "NVIDIA-H100-80GB-HBM3"
TEAM = "team-a"
UID = "7e57c0de-0000-4000-8000-000000000001"
CONTAINER_ID = "c0ffee".ljust(64, "1")
PID = 4242


def env_of(
    container: dict[str, Any], docs: list[dict[str, Any]], values: dict[str, str]
) -> dict[str, str]:
    """The container's environment as the kubelet sets it: envFrom ConfigMaps, then env
    (plain values; fieldRefs and secretKeyRefs from ``values``, keyed by the variable)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(find(docs, "ConfigMap", source["configMapRef"]["name"])["data"])
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            assert var["name"] in values, f"the test has no value for {var}"
            env[var["name"]] = values[var["name"]]
    return env


def mapped(args: list[str], mounts: dict[str, Path]) -> list[str]:
    """``args`` with every container path under a mount replaced by the host folder."""
    out = []
    for arg in args:
        for inside, outside in sorted(mounts.items(), key=lambda m: -len(m[0])):
            if f"={inside}/" in arg or arg.endswith(f"={inside}"):
                arg = arg.replace(f"={inside}", f"={outside}", 1)
                break
        out.append(arg)
    return out


def replaced(args: list[str], **flags: str) -> list[str]:
    """``args`` with the ``--flag=`` values given (each must be there)."""
    out = list(args)
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        (at,) = [i for i, a in enumerate(out) if a.split("=", 1)[0] == flag]
        out[at] = f"{flag}={value}"
    return out


def targets_of(
    docs: list[dict[str, Any]], ports: dict[str, int], pods: dict[str, str]
) -> dict[str, list[promoperator.Target]]:
    """Each ServiceMonitor job's targets as Kubernetes discovery gives them: the Service it
    selects, the Service port the endpoint names (reaching a port of the workload's pod), the
    pod and the container behind it. ``ports``: the workload's name -> where it listens here
    (its pod IP:port in a cluster); ``pods``: the workload's name -> its pod's name."""
    targets: dict[str, list[promoperator.Target]] = {}
    for monitor in (d for d in docs if d["kind"] == "ServiceMonitor"):
        spec = monitor["spec"]
        services = [
            d for d in docs
            if d["kind"] == "Service"
            and spec["selector"]["matchLabels"].items() <= d["metadata"].get("labels", {}).items()
        ]  # fmt: skip
        if not services and monitor["metadata"]["name"] in OPTIONAL_MONITORS:
            # its component is not in this build: the monitor selects nothing
            for i in range(len(spec["endpoints"])):
                meta = monitor["metadata"]
                targets[f"serviceMonitor/{meta['namespace']}/{meta['name']}/{i}"] = []
            continue
        assert len(services) == 1, monitor["metadata"]["name"]
        (service,) = services
        service = {**service, "metadata": {"namespace": NAMESPACE, **service["metadata"]}}
        workload = next(
            d for d in docs
            if d["kind"] in ("DaemonSet", "Deployment")
            and service["spec"]["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
        )  # fmt: skip
        name = workload["metadata"]["name"]
        for i, endpoint in enumerate(spec["endpoints"]):
            port = next(p for p in service["spec"]["ports"] if p["name"] == endpoint["port"])
            # the container whose port the Service reaches
            (container,) = [
                c["name"]
                for c in workload["spec"]["template"]["spec"]["containers"]
                if port["targetPort"] in {p["name"] for p in c.get("ports", [])}
            ]
            job = f"serviceMonitor/{monitor['metadata']['namespace']}/{monitor['metadata']['name']}/{i}"
            targets[job] = [promoperator.Target(
                address=f"127.0.0.1:{ports[name]}", service=service, port_name=port["name"],
                pod=pods[name], container=container, node=NODE,
            )]  # fmt: skip
    return targets


def next_run(now: float) -> float:
    """When the CronJob (``0 6 1 * *``, Etc/UTC) runs next: 06:00 UTC on the next 1st."""
    t = time.gmtime(now)
    year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
    return float(calendar.timegm((year, month, 1, 6, 0, 0)))


@pytest.fixture
def work() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gqc-", dir="/tmp"))  # short: unix socket paths
    yield path
    shutil.rmtree(path, ignore_errors=True)


@needs_kubectl
@pytest.mark.prometheus
@pytest.mark.timeout(120)
def test_the_production_build_runs_as_one_system(
    work: Path, sim_library: Path, pg_schemas: PgSchemas
) -> None:
    started = time.monotonic()
    docs = built("examples/production")
    # --- what the operator creates before applying (deploy/README.md) ---------------------
    made = subprocess.run(
        [sys.executable, str(DEPLOY / "components/tls-auth/generate.py"), "--out",
         str(work / "secrets")], capture_output=True, text=True,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    files = {p.name: p.read_bytes() for p in (work / "secrets").iterdir()}
    secrets = {
        "gpu-exporter-tls": {k: files[k] for k in ("tls.crt", "tls.key", "ca.crt")},
        "gpu-exporter-basic-auth": {k: files[k] for k in ("username", "password", "web-config.yml")},
        "gpuquota-db": {"url": pg_schemas.new("compose").encode()},
    }  # fmt: skip
    rate_card = {"ratecard.yaml": (ROOT / "docs/examples/ratecard.yaml").read_bytes()}

    # --- gpu-exporter as the DaemonSet runs it ----------------------------------------------
    daemonset = find(docs, "DaemonSet", "gpu-exporter")["spec"]["template"]["spec"]
    (exporter,) = daemonset["containers"]
    host = work / "host"
    mounts: dict[str, Path] = {}
    for mount in exporter["volumeMounts"]:
        volume = next(v for v in daemonset["volumes"] if v["name"] == mount["name"])
        folder = host / mount["name"]
        folder.mkdir(parents=True)
        for source in volume.get("projected", {}).get("sources", []):
            for item in source["secret"]["items"]:
                (folder / item["path"]).write_bytes(secrets[source["secret"]["name"]][item["key"]])
        mounts[mount["mountPath"]] = folder
    assert "/etc/gpu-exporter" in mounts and (mounts["/etc/gpu-exporter"] / "tls.key").exists()
    assert daemonset["hostPID"]  # so the exporter sees the node's /proc: here, a tree in tmp
    proc_root = host / "proc"
    (proc_root / str(PID)).mkdir(parents=True)
    (proc_root / str(PID) / "cgroup").write_text(f"0::/kubepods/pod{UID}/{CONTAINER_ID}\n")
    exporter_port = free_port()
    controller_port = free_port()

    with ExitStack() as stack:
        api = stack.enter_context(ApiServer(bookmark_interval=0.2))
        kubeconfig = api.write_kubeconfig(work / "kubeconfig")
        node = stack.enter_context(
            SimNode.create(work / "nvml.state", {"gpus": [{"model": "H100-SXM5-80GB", "count": 2}]})
        )
        node.set(0, power_watts=500.0)
        node.set(1, power_watts=80.0)
        node.set_gpm(0, sm_activity=0.8)
        node.add_process(0, PID, 8 * 2**30)
        api.apply("ADDED", node_object(NODE, {"nvidia.com/gpu.product": H100,
                                              "nvidia.com/gpu.count": "2"},
                                       {"nvidia.com/gpu": "2"}))  # fmt: skip
        api.apply("ADDED", {"apiVersion": "v1", "kind": "Namespace",
                            "metadata": {"name": TEAM, "uid": UID.replace("1", "2")}})  # fmt: skip
        pod = DemoPod(TEAM, "trainer", UID, NODE, "nvidia.com/gpu", (node.uuid(0),), CONTAINER_ID)
        api.apply("ADDED", pod_object(pod, time.time() - 60))
        socket = mapped(["--pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock"],
                        mounts)[0].split("=", 1)[1]  # fmt: skip
        kubelet = stack.enter_context(PodResourcesServer(Path(socket)))
        kubelet.set_assignments(
            [Assignment(TEAM, "trainer", "main", "nvidia.com/gpu", (node.uuid(0),))]
        )
        # the kubelet's device checkpoint in the host folder pod-usage mounts: the pod's UID
        write_checkpoint(
            mounts["/var/lib/gpuquota/device-plugins"] / CHECKPOINT_FILE,
            [PodDeviceEntry(UID, "main", "nvidia.com/gpu", (node.uuid(0),), b"")],
            {"nvidia.com/gpu": [node.uuid(0), node.uuid(1)]},
        )
        argv = [
            *exporter["command"],
            *replaced(mapped(exporter["args"], mounts), listen=f"127.0.0.1:{exporter_port}"),
            f"--kubeconfig={kubeconfig}",  # instead of the mounted service-account token
            f"--proc-root={proc_root}",
            # the flag's default is the folder the build mounts from the host
            f"--device-plugin-dir={mounts['/var/lib/kubelet/device-plugins']}",
        ]
        env = env_of(exporter, docs, {"NODE_NAME": NODE})
        log = (work / "gpu-exporter.log").open("wb")
        agent = subprocess.Popen(
            [str(BIN / argv[0]), *argv[1:]],
            env={**os.environ, **env, **node.env()}, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        stack.callback(stop_process, agent)

        # --- Prometheus as the Operator configures it from the ServiceMonitors --------------
        rendered = promoperator.render(docs, secrets)
        targets = targets_of(
            docs, {"gpu-exporter": exporter_port, "gpuquota-controller": controller_port},
            {"gpu-exporter": "gpu-exporter-x7k2p", "gpuquota-controller": "gpuquota-controller-0"},
        )  # fmt: skip
        assert {job for job, found in targets.items() if found} == {
            "serviceMonitor/gpuquota/gpu-exporter/0", "serviceMonitor/gpuquota/gpuquota-controller/0"}  # fmt: skip
        jobs = promoperator.on_this_machine(rendered, targets, work / "certs", scrape_interval="1s")
        config = work / "prometheus.yml"
        config.write_text(yaml.safe_dump({"global": {"scrape_interval": "1s"},
                                          "scrape_configs": jobs}))  # fmt: skip
        prometheus = stack.enter_context(serving(config, work / "tsdb"))

        # --- the controller: its init container, then itself --------------------------------
        deployment = find(docs, "Deployment", "gpuquota-controller")["spec"]["template"]["spec"]
        values = {"POD_NAME": "gpuquota-controller-0", "POD_NAMESPACE": NAMESPACE,
                  "GPUQUOTA_DB": secrets["gpuquota-db"]["url"].decode()}  # fmt: skip
        (init,) = deployment["initContainers"]
        upgraded = subprocess.run(
            [str(BIN / init["command"][0]), *init["command"][1:], *init.get("args", [])],
            env={**os.environ, **env_of(init, docs, values)}, capture_output=True, text=True,
        )  # fmt: skip
        assert upgraded.returncode == 0, upgraded.stderr
        (controller,) = deployment["containers"]
        controller_env = env_of(controller, docs, values)
        assert controller_env["GPUQUOTA_DB"].startswith("postgresql")  # the Secret, not SQLite
        assert controller_env["GPUQUOTA_LEDGER_PROMETHEUS_URL"]  # set by the build...
        controller_env["GPUQUOTA_LEDGER_PROMETHEUS_URL"] = prometheus.url  # ...to this one here
        argv = [
            *controller["command"], *replaced(controller["args"], metrics_port=str(controller_port)),
            "--metrics-address=127.0.0.1", f"--kubeconfig={kubeconfig}",
            "--flush-interval=500ms", "--ledger-window=5s", "--ledger-delay=2s",
            "--ledger-lookback=5s", "--ledger-max-gap=2s", "--ledger-backfill=1m",
        ]  # fmt: skip
        controller_log = (work / "controller.log").open("wb")
        quota = subprocess.Popen(
            [str(BIN / argv[0]), *argv[1:]], env={**os.environ, **controller_env},
            stdout=controller_log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        stack.callback(stop_process, quota)

        def query(promql: str) -> list[dict[str, Any]]:
            url = f"{prometheus.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
            with urllib.request.urlopen(url, timeout=5) as answer:
                return list(yaml.safe_load(answer)["data"]["result"])

        def alive() -> None:
            for name, proc, path in (("gpu-exporter", agent, work / "gpu-exporter.log"),
                                     ("controller", quota, work / "controller.log")):  # fmt: skip
                assert proc.poll() is None, f"{name} exited: {path.read_text()[-3000:]}"

        def every_target_up() -> bool:
            alive()
            up = {s["metric"]["job"]: s["value"][1] for s in query("up")}
            return up == {"gpu-exporter": "1", "gpuquota-controller": "1"}

        wait_for(every_target_up, timeout=40, what="every target up")
        print(f"every target up after {time.monotonic() - started:.1f} s")
        # the workload's labels kept through the Operator's target labels, and the node named
        used = query("gpu_pod_used_seconds_total")
        assert used, "no gpu_pod_used_seconds_total"
        for series in used:
            labels = series["metric"]
            assert (labels.get("namespace"), labels.get("pod"), labels.get("node")) == (
                TEAM, "trainer", NODE), labels  # fmt: skip
            assert not [k for k in labels if k.startswith("exported_")], labels
        # no series of ours says the agent's or the controller's own namespace or pod
        assert query(f'{{namespace="{NAMESPACE}"}}') == []
        assert query(f'{{__name__=~"gpu_.+", node!="{NODE}"}}') == []
        assert query('{__name__=~".+", exported_namespace!=""}') == []
        # a Prometheus whose spec says overrideHonorLabels (honor_labels false for every
        # monitor) stores the same series: the target's own namespace/pod/container are
        # dropped before they could clash, and the agent's node label clashes with the
        # target's node (the same node) only to be dropped as exported_node
        forced = promoperator.render(docs, secrets, override_honor_labels=True)
        assert not any(job["honor_labels"] for job in forced.scrape_configs)
        forced_config = work / "prometheus-override.yml"
        forced_config.write_text(yaml.safe_dump({"global": {"scrape_interval": "1s"},
            "scrape_configs": promoperator.on_this_machine(
                forced, targets, work / "certs", scrape_interval="1s")}))  # fmt: skip
        with serving(forced_config, work / "tsdb-override") as overridden:

            def series_there(promql: str) -> list[dict[str, str]]:
                url = f"{overridden.url}/api/v1/series?" + urllib.parse.urlencode(
                    {"match[]": promql, "start": str(time.time() - 60)}
                )
                with urllib.request.urlopen(url, timeout=5) as answer:
                    return sorted(
                        (s for s in yaml.safe_load(answer)["data"]), key=lambda s: sorted(s.items())
                    )

            gpu = '{job=~"gpu-exporter|gpuquota-controller"}'
            wait_for(lambda: len(series_there(gpu)) >= len(query(gpu)), timeout=20,
                     what="the overriding Prometheus scraping the agent")  # fmt: skip
            said = {tuple(sorted(s["metric"].items())) for s in query(gpu)}
            there = {tuple(sorted(s.items())) for s in series_there(gpu)}
            assert there >= said, sorted(there - said)[:3]
            assert series_there('{__name__=~".+", exported_namespace!=""}') == []
            assert series_there('{__name__=~".+", exported_node!=""}') == []

        counting_since = time.time()

        def windows_ingested() -> bool:
            """Windows that close after the agent's counters were scraped (two windows of
            5 s on): the pod's use is in them."""
            alive()
            until = query("gpuquota_ledger_ingested_until_timestamp_seconds")
            return bool(until) and float(until[0]["value"][1]) >= counting_since + 10

        wait_for(
            windows_ingested,
            timeout=60,
            what="the ledger ingesting windows "
            f"(controller log: {(work / 'controller.log').read_text()[-2000:]})",
        )
        assert float(query("gpuquota_ledger_windows_ingested_total")[0]["value"][1]) >= 2
        print(f"ledger ingested after {time.monotonic() - started:.1f} s")
        stop_process(quota)

        # --- the CronJob's exact command line, when it runs ---------------------------------
        job = find(docs, "CronJob", "gpuquota-report")["spec"]
        assert (job["schedule"], job["timeZone"]) == ("0 6 1 * *", "Etc/UTC")
        pod_spec = job["jobTemplate"]["spec"]["template"]["spec"]
        (report,) = pod_spec["containers"]
        report_mounts: dict[str, Path] = {}
        for mount in report["volumeMounts"]:
            volume = next(v for v in pod_spec["volumes"] if v["name"] == mount["name"])
            folder = host / f"report-{mount['name']}"
            folder.mkdir()
            if "configMap" in volume:
                assert volume["configMap"]["name"] == "gpuquota-ratecard"
                for key, data in rate_card.items():
                    (folder / key).write_bytes(data)
            report_mounts[mount["mountPath"]] = folder
        clock = work / "clock"
        clock.write_text(repr(next_run(time.time())))
        report_env = env_of(report, docs, values)
        argv = [*report["command"], *expanded(mapped(report["args"], report_mounts), report_env)]
        done = subprocess.run(
            [sys.executable, "-m", "gpuquota.sim.clock", str(clock), "--", *argv],
            env={**os.environ, **report_env},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    month = time.strftime("%Y-%m", time.gmtime())
    written = report_mounts["/reports"] / f"gpuquota-{month}.csv"
    rows = list(csv.DictReader(written.read_text().splitlines()))
    priced = [r for r in rows if r.get("namespace") == TEAM]
    assert priced, written.read_text()
    cost = next(k for k in priced[0] if k.startswith("cost"))
    assert float(priced[0][cost]) > 0, priced[0]
    used_column = next(k for k in priced[0] if "used" in k)
    assert priced[0][used_column] not in ("", None), written.read_text()
