"""`make demo`: the whole product on a simulated GPU node and cluster, end to end.

Four acts, each through the real interfaces and the real programs:

1. a node of 8 simulated H100s (the NVML stand-in) with pods from a kubelet pod-resources
   stand-in: `gpu-exporter` serves /metrics with pod-attributed GPU series;
2. an injected XID 79 turns one GPU Unhealthy in the health endpoint, the metrics and the
   kubelet device plugin stream, and it turns Healthy again after the quiet period;
3. a kube-apiserver stand-in fed by the workload generator (device-plugin pods, and a DRA
   team whose pods get GPUs and MIG devices through ResourceClaims), watched by
   `gpuquota controller` writing to SQLite;
4. `gpuquota report` prints the chargeback report of that cluster - GPU-hours, cost, idle
   GPUs and quota use against each namespace's ResourceQuota (device-class quota too), DRA
   usage beside device-plugin usage - checked against the generator's own truth, and the
   exact report commands to rerun on the store.

The store, the logs and the simulated node's state stay in build/demo/ (or --work DIR),
replaced by the next run.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from gpuquota.kube.client import Kube
from gpuquota.quota.accounting.rules.config import DEFAULT_CONFIG
from gpuquota.quota.controller.loop import accounts_pod
from gpuquota.sim.apiserver import ApiServer, Driver
from gpuquota.sim.harness import caught_up, poll, stop_process
from gpuquota.sim.kubelet.podresources import Assignment, PodResourcesServer
from gpuquota.sim.kubelet.registration import KubeletStandIn
from gpuquota.sim.nvml.control import SimNode
from gpuquota.sim.workload import generate

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
GPU = "nvidia.com/gpu"
RATE_CARD = ROOT / "docs" / "examples" / "ratecard.yaml"
QUIET_PERIOD_S = 5
DEFAULT_WORK = ROOT / "build" / "demo"


def title(text: str) -> None:
    print(f"\n\033[1m== {text} ==\033[0m" if sys.stdout.isatty() else f"\n== {text} ==")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def http_get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body: bytes = response.read()
        return body.decode()


RUNNING: list[tuple[str, subprocess.Popen[bytes], Path]] = []  # our programs and their logs


def wait_until(what: str, check: Callable[[], bool], timeout: float = 30.0) -> float:
    """Poll ``check`` until it holds; returns the seconds it took, or exits naming ``what``
    (at once, with its last log lines, if one of our programs dies meanwhile)."""

    def ready() -> bool:
        for name, proc, log in RUNNING:
            if proc.poll() is not None:
                tail = log.read_text().strip().splitlines()[-3:]
                raise SystemExit(
                    f"demo: {name} exited ({proc.returncode}) while "
                    f"waiting for {what}:\n  " + "\n  ".join(tail)
                )
        try:
            return check()
        except OSError:  # not listening yet
            return False

    start = time.monotonic()
    if not poll(ready, timeout):
        raise SystemExit(f"demo: gave up waiting for {what} after {timeout:.0f} s")
    return time.monotonic() - start


@contextmanager
def process(
    args: list[str], env: dict[str, str] | None, log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """Run one of our programs in the background; stop it (SIGTERM) on the way out."""
    with log.open("wb") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)
        entry = (Path(args[0]).name, proc, log)
        RUNNING.append(entry)
        try:
            yield proc
        finally:
            RUNNING.remove(entry)
            stop_process(proc)
    if proc.returncode not in (0, -signal.SIGTERM):
        print(f"(log of {Path(args[0]).name} in {log})")


def show_metrics(exposition: str, prefixes: tuple[str, ...], limit: int = 4) -> None:
    for prefix in prefixes:
        lines = [line for line in exposition.splitlines() if line.startswith(prefix + "{")]
        for line in lines[:limit]:
            print("   ", line)
        if len(lines) > limit:
            print(f"    ... {len(lines) - limit} more {prefix} series")


def node_act(stack: ExitStack, work: Path) -> tuple[SimNode, KubeletStandIn, str]:
    title("1. A GPU node: 8 x H100 (NVML stand-in), pods from the kubelet, gpu-exporter")
    node = SimNode.create(work / "node.state", "h100x8")
    for i in range(node.gpu_count):
        node.set(i, gpu_utilization_ratio=0.1 * i, power_watts=120.0 + 60 * i)
        node.set_gpm(i, sm_activity=0.09 * i, tensor_activity=0.08 * i, dram_activity=0.03 * i)
    uuids = [node.uuid(i) for i in range(node.gpu_count)]
    pods = [
        Assignment("ml-training", "llama-ft-0", "trainer", GPU, tuple(uuids[0:4])),
        Assignment("inference", "chat-api-7d9f", "server", GPU, (uuids[4],)),
        Assignment("research", "notebook-ana", "jupyter", GPU, (f"{uuids[5]}::0",)),
        Assignment("research", "notebook-bo", "jupyter", GPU, (f"{uuids[5]}::1",)),
    ]
    kubelet_pods = PodResourcesServer(work / "pod-resources.sock", pods).start()
    stack.callback(kubelet_pods.stop)
    plugin_dir = work / "device-plugins"
    plugin_dir.mkdir()
    kubelet = KubeletStandIn(plugin_dir)
    kubelet.start()
    stack.callback(kubelet.stop)

    base = f"http://127.0.0.1:{free_port()}"
    exporter = [
        str(BIN / "gpu-exporter"),
        f"--listen={base.removeprefix('http://')}",
        "--interval=1s",
        f"--pod-resources-socket={work / 'pod-resources.sock'}",
        "--device-plugin",
        f"--device-plugin-dir={plugin_dir}",
        f"--health-quiet-period={QUIET_PERIOD_S}s",
    ]
    print("$", " ".join(Path(a).name if a.startswith("/") else a for a in exporter))
    env = {**os.environ, **node.env()}
    stack.enter_context(process(exporter, env, work / "gpu-exporter.log"))
    wait_until("gpu-exporter /readyz", lambda: http_get(f"{base}/readyz") is not None)
    wait_until(
        "pod attribution", lambda: "gpu_pod_info{" in http_get(f"{base}/metrics"), timeout=15
    )
    wait_until("GPM profiling", lambda: "gpu_sm_active_ratio{" in http_get(f"{base}/metrics"))
    print(f"\n{base}/metrics (a selection):")
    show_metrics(
        http_get(f"{base}/metrics"),
        ("gpu_info", "gpu_utilization_ratio", "gpu_sm_active_ratio", "gpu_power_watts",
         "gpu_pod_info"),
    )  # fmt: skip
    return node, kubelet, base


def device_health(base: str, uuid: str) -> dict[str, object]:
    report = json.loads(http_get(f"{base}/health"))
    for device in report["devices"]:
        if device["uuid"] == uuid:
            return dict(device)
    raise SystemExit(f"demo: {uuid} missing from {base}/health")


def health_act(node: SimNode, kubelet: KubeletStandIn, base: str) -> None:
    title("2. Health: an XID 79 (GPU fallen off the bus) on GPU 3, then recovery")
    plugin = kubelet.wait_for_plugin(GPU, timeout=15)
    if plugin is None:
        raise SystemExit("demo: the device plugin did not register with the kubelet stand-in")
    uuid = node.uuid(3)
    wait_until("the device list", lambda: uuid in plugin.devices(), timeout=10)
    healthy = sum(1 for h in plugin.devices().values() if h == "Healthy")
    print(f"device plugin stream: {healthy}/{len(plugin.devices())} devices Healthy")

    def everywhere(state: str) -> None:
        health = device_health(base, uuid)
        metrics = http_get(f"{base}/metrics")
        state_lines = [
            line
            for line in metrics.splitlines()
            if line.startswith("gpu_health_state{") and uuid in line and line.endswith(" 1")
        ]
        print(f"  health endpoint: {health['state']}", end="")
        for reason in health.get("reasons", []) or []:  # type: ignore[attr-defined]
            print(
                f" - {reason['reason']}: {reason['message']} (action: {reason['action']})",
                end="",
            )
        print()
        print(f"  metrics:         {state_lines[0] if state_lines else '(no gpu_health_state)'}")
        print(f"  device plugin:   {uuid} {plugin.devices().get(uuid)}")
        if health["state"] != state:
            raise SystemExit(f"demo: expected {state}, the health endpoint says {health['state']}")

    injected = time.monotonic()
    node.inject_xid(3, 79)
    took = wait_until(
        "GPU 3 Unhealthy in the device plugin stream",
        lambda: plugin.devices().get(uuid) == "Unhealthy",
    )
    print(f"XID 79 injected; Unhealthy in the ListAndWatch stream after {took * 1000:.0f} ms")
    wait_until("the health endpoint", lambda: device_health(base, uuid)["state"] == "unhealthy")
    everywhere("unhealthy")
    print(f"\nno further XID for the {QUIET_PERIOD_S} s quiet period...")
    wait_until(
        "recovery", lambda: plugin.devices().get(uuid) == "Healthy", timeout=QUIET_PERIOD_S + 15
    )
    wait_until("the health endpoint", lambda: device_health(base, uuid)["state"] == "healthy")
    print(f"Healthy again {time.monotonic() - injected:.1f} s after the XID")
    everywhere("healthy")


def cluster_act(stack: ExitStack, work: Path) -> tuple[int, int, dict[str, int]]:
    title("3. A cluster: kube-apiserver stand-in, generated workload, gpuquota controller")
    # The events are played in seconds, so the controller observes them "now": leave out the
    # cases whose end exists only as the time a change was seen (gpuquota replay keeps those
    # exact, from each line's observedAt).
    workload = generate(seed=7, hours=8, pods_per_hour=40, observation_independent=True, dra=True)
    api = ApiServer()
    api.start()
    stack.callback(api.stop)
    kubeconfig = api.write_kubeconfig(work / "kubeconfig")
    db = f"sqlite:///{work / 'gpuquota.db'}"
    metrics_port = free_port()
    controller = [
        str(BIN / "gpuquota"),
        "controller",
        f"--kubeconfig={kubeconfig}",
        f"--db={db}",
        "--cluster=demo",
        "--migrate",
        f"--metrics-port={metrics_port}",
        "--metrics-address=127.0.0.1",
        "--flush-interval=500ms",
        "--node-pool-label=node-pool",  # the label the generated nodes name their pool with
    ]
    print(
        "$ gpuquota controller --kubeconfig=... --db=sqlite:///.../gpuquota.db --cluster=demo "
        "--node-pool-label=node-pool"
    )
    with process(controller, None, work / "controller.log"):
        wait_until("the controller's first heartbeat", lambda: _heartbeat(work) is not None)
        print(
            f"playing {len(workload.events)} watch events "
            f"({(workload.end - workload.start) / 3600:.0f} h of simulated time) into the API server"
        )
        Driver(api, workload).run()
        took = wait_until(
            "the controller to catch up",
            lambda: _caught_up(api, work),
            timeout=60,
        )
        print(f"the store caught up with the API server {took:.1f} s after the last event")
        metrics = http_get(f"http://127.0.0.1:{metrics_port}/metrics")
    print("\nthe store (SQLite):")
    with sqlite3.connect(work / "gpuquota.db") as conn:
        for table in (
            "allocations",
            "claim_allocations",
            "node_capacity",
            "quota_samples",
            "namespace_labels",
        ):
            (count,) = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
            print(f"    {table:<18} {count} rows")
    print("\ncontroller metrics (a selection):")
    show_metrics(
        metrics,
        (
            "gpuquota_namespace_gpu_quota_hard",
            "gpuquota_namespace_gpus_allocated",
            "gpuquota_namespace_dra_gpus_allocated",
        ),
    )
    truth: dict[str, int] = {}
    for (namespace, _resource), seconds in workload.truth.gpu_seconds().items():
        truth[namespace] = truth.get(namespace, 0) + seconds
    # DRA claims: each claim's time once, however many pods shared it
    for (namespace, _class), seconds in workload.truth.dra_gpu_seconds().items():
        truth[namespace] = truth.get(namespace, 0) + seconds
    return workload.start, workload.end, truth


def _heartbeat(work: Path) -> dict[str, str] | None:
    """The resourceVersions in the controller's durable heartbeat, once it has written one."""
    path = work / "gpuquota.db"
    if not path.exists():
        return None
    try:
        with sqlite3.connect(path) as conn:
            row = conn.execute("SELECT resource_versions FROM heartbeats").fetchone()
    except sqlite3.Error:
        return None
    return dict(json.loads(row[0])) if row else None


def _caught_up(api: ApiServer, work: Path) -> bool:
    """The controller's heartbeat names, for every kind it watches, a version after which the
    API server wrote nothing it applies (versions are opaque: only the server orders its own)."""
    versions = _heartbeat(work) or {}
    kinds = (*Kube.KINDS, *Kube.DRA_KINDS)  # the stand-in serves resource.k8s.io/v1
    return caught_up(
        api,
        versions,
        kinds,
        lambda obj: obj.get("kind") != "Pod" or accounts_pod(obj, DEFAULT_CONFIG),
    )


def shown(path: Path) -> str:
    """A path as a newcomer types it: relative to the current folder when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def report_act(db_path: Path, start: int, end: int, truth: dict[str, int]) -> None:
    title("4. Chargeback: gpuquota report, with quota use")
    gpuquota = BIN / "gpuquota"
    period = [
        f"--from={time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(start))}",
        f"--to={time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(end))}",
    ]
    store = f"--db=sqlite:///{shown(db_path)}"
    commands = [
        [store, *period, f"--rate-card={shown(RATE_CARD)}", "--idle"],
        [store, *period, "--by=namespace,path"],
        [store, *period, "--by=label:team,model"],
        [store, *period, "--by=namespace,resource", "--format=csv"],
    ]

    def typed(args: list[str]) -> str:
        return shlex.join([shown(gpuquota), "report", *args])

    print(f"$ {typed(commands[0])}")
    subprocess.run([str(gpuquota), "report", *commands[0]], check=True)
    as_json = subprocess.run(
        [str(gpuquota), "report", *commands[0], "--format=json"],
        check=True,
        capture_output=True,
        text=True,
    )
    doc = json.loads(as_json.stdout)
    reported = {row["group"]["namespace"]: int(row["gpu_seconds_raw"]) for row in doc["rows"]}
    print("\nraw GPU-seconds per namespace, the report against the generator's own truth:")
    for namespace in sorted(truth.keys() | reported.keys()):
        got, want = reported.get(namespace, 0), truth.get(namespace, 0)
        verdict = "exact" if got == want else f"OFF BY {got - want:+d} s"
        print(f"    {namespace:<16} report {got:>10}   truth {want:>10}   {verdict}")
    if reported != truth:
        raise SystemExit("demo: the report does not match the generator's truth")
    if not doc.get("quota", {}).get("rows"):
        raise SystemExit("demo: the report has no quota figures")
    print("\nDRA claims beside device-plugin requests (path: which way the GPUs came):")
    print(f"$ {typed(commands[1])}")
    subprocess.run([str(gpuquota), "report", *commands[1]], check=True)
    print(f"\nthe store stays in {shown(db_path)}; rerun the report, or try other views:")
    for args in commands:
        print(f"  {typed(args)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="make demo",
        description=textwrap.dedent(__doc__ or ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--work",
        type=Path,
        default=DEFAULT_WORK,
        metavar="DIR",
        help=f"folder for the store, logs and node state, emptied first ({shown(DEFAULT_WORK)})",
    )
    args = parser.parse_args(argv)
    work: Path = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    with ExitStack() as stack:
        node, kubelet, base = node_act(stack, work)
        health_act(node, kubelet, base)
    with ExitStack() as stack:
        start, end, truth = cluster_act(stack, work)
    report_act(work / "gpuquota.db", start, end, truth)
    print(f"\ndemo finished; the store and the logs are in {shown(work)}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
