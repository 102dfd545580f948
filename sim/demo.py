"""`make demo`: the whole product on a simulated GPU node and cluster, end to end.

Six acts, each through the real interfaces and the real programs:

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
   exact report commands to rerun on the store;
5. the usage ledger: three more simulated nodes with their gpu-exporters, a real Prometheus
   scraping them and the controller ingesting their usage counters; the report's used
   GPU-seconds and energy per namespace against the stand-in's own truth, the coverage lost
   while one exporter was stopped, and the idle allocations (sim/ledgerdemo.py);
6. every GPU's health history by serial: a GPU fenced, released and fenced again (a relapse),
   a board moved to another node, `gpuquota gpus` against the stand-in's record
   (sim/fleetdemo.py).

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
import sqlite3
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from fractions import Fraction
from pathlib import Path
from typing import Any

from gpuquota.kube.client import Kube
from gpuquota.quota.accounting.rules.config import DEFAULT_CONFIG
from gpuquota.quota.controller.loop import accounts_pod
from gpuquota.sim.apiserver import ApiServer, Driver
from gpuquota.sim.clock import SimClock
from gpuquota.sim.fleetdemo import fleet_act
from gpuquota.sim.harness import caught_up, free_port, poll, stop_process
from gpuquota.sim.kubelet.podresources import Assignment, PodResourcesServer
from gpuquota.sim.kubelet.registration import KubeletStandIn
from gpuquota.sim.ledgerdemo import ledger_act
from gpuquota.sim.nvml.control import SimNode
from gpuquota.sim.workload import Workload, generate

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
GPU = "nvidia.com/gpu"
RATE_CARD = ROOT / "docs" / "examples" / "ratecard.yaml"
QUIET_PERIOD_S = 5
DEFAULT_WORK = ROOT / "build" / "demo"


def title(text: str) -> None:
    print(f"\n\033[1m== {text} ==\033[0m" if sys.stdout.isatty() else f"\n== {text} ==")


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
    args: list[str], env: dict[str, str] | None, log: Path, name: str | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Run one of our programs in the background; stop it (SIGTERM) on the way out."""
    name = name or Path(args[0]).name
    with log.open("wb") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)
        entry = (name, proc, log)
        RUNNING.append(entry)
        try:
            yield proc
        finally:
            RUNNING.remove(entry)
            stop_process(proc)
    if proc.returncode not in (0, -signal.SIGTERM):
        print(f"(log of {name} in {log})")


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


def cluster_act(stack: ExitStack, work: Path) -> Workload:
    title("3. A cluster: kube-apiserver stand-in, generated workload, gpuquota controller")
    # The events are played in seconds on the cluster's own clock (sim/clock.py), which the
    # controller reads too; leave out the cases whose end exists only as the time a pod's
    # change was seen, which a clock that jumps from event to event cannot place to the second
    # (gpuquota replay keeps those exact, from each line's observedAt).
    workload = generate(seed=7, hours=8, pods_per_hour=40, observation_independent=True, dra=True)
    clock = SimClock(work / "clock", workload.start)
    api = ApiServer()
    api.start()
    stack.callback(api.stop)
    kubeconfig = api.write_kubeconfig(work / "kubeconfig")
    db = f"sqlite:///{work / 'gpuquota.db'}"
    metrics_port = free_port()
    controller = [
        sys.executable,
        "-m",
        "gpuquota.sim.clock",
        str(clock.path),
        "--",
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
    print(f"(on the simulated cluster's clock, which starts at {_utc(workload.start)})")

    def settle() -> float:
        # versions are opaque: caught up is the server's own order of what it wrote since the
        # versions the controller stored (gpuquota.sim.harness.caught_up)
        return wait_until("the controller to catch up", lambda: _caught_up(api, work), timeout=60)

    with process(controller, None, work / "controller.log", name="gpuquota controller"):
        wait_until("the controller's first heartbeat", lambda: _heartbeat(work) is not None)
        print(
            f"playing {len(workload.events)} watch events "
            f"({(workload.end - workload.start) / 3600:.0f} h of simulated time) into the API server"
        )
        refused = len(workload.truth.refused)
        print(f"(quota admission refused {refused} pod creations, as a real API server would)")
        driver = Driver(api, workload, clock=clock, settle=settle)
        driver.run()
        driver.settled()
        clock.set(workload.end)  # the span ends: the heartbeat, and the data, reach its end
        took = settle()
        wait_until("the heartbeat at the span's end", lambda: _heartbeat_at(work) >= workload.end)
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
    return workload


def _utc(t: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _heartbeat_at(work: Path) -> int:
    with sqlite3.connect(work / "gpuquota.db") as conn:
        row = conn.execute("SELECT at FROM heartbeats").fetchone()
    return int(row[0]) if row else 0


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


def report_json(args: list[str]) -> dict[str, Any]:
    done = subprocess.run(
        [str(BIN / "gpuquota"), "report", *args, "--format=json"],
        check=True,
        capture_output=True,
        text=True,
    )
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def hours(seconds: Fraction | int) -> str:
    return f"{float(seconds) / 3600:.2f}"


def near(reported: float | None, seconds: Fraction | int) -> bool:
    """A GPU-hour figure (JSON: exact) against exact seconds, to the table's hundredth."""
    return reported is not None and abs(reported - float(seconds) / 3600) <= 0.005


def month_of(t: int) -> str:
    return time.strftime("%Y-%m", time.gmtime(t))


def check_views(db: str, workload: Workload) -> None:
    """Every view of the calendar month that holds the workload against the generator's own
    truth: raw (to the second) and physical GPU-hours per namespace, a label view across the
    label change, the idle view and each quota's peaks. Exits naming the first that is off."""
    truth = workload.truth
    month = [db, f"--month={month_of(workload.start)}"]
    off: list[str] = []
    doc = report_json([*month, "--by=namespace", "--idle"])
    rows = {row["group"]["namespace"]: row for row in doc["rows"]}
    want = truth.namespace_totals()
    print(f"\nthe month {month_of(workload.start)}, every view against the generator's truth:")
    print(f"    {'namespace':<14} {'raw GPU-s':>10} {'truth':>10} {'phys GPU-h':>10} {'truth':>8}")
    for ns in sorted(want.keys() | rows.keys()):
        raw, phys = want.get(ns, (0, Fraction(0)))
        row = rows.get(ns, {})
        got_raw, got_phys = int(row.get("gpu_seconds_raw", 0)), row.get("gpu_hours_physical")
        ok = got_raw == raw and near(got_phys, phys)
        print(
            f"    {ns:<14} {got_raw:>10} {raw:>10} {got_phys!s:>10} {hours(phys):>8}"
            f"   {'exact' if ok else 'OFF'}"
        )
        if not ok:
            off.append(f"namespace {ns}")
    idle = {(r["model"], r["node_pool"]): r for r in doc.get("idle", {}).get("rows", [])}
    # idle counts only the time the store covers (docs/report.md, covered time): the truth's
    # allocatable over the same spans
    spans = [(s["start_unix"], s["end_unix"]) for c in doc["covered"].values() for s in c]
    for cluster, covered in sorted(doc["covered"].items()):
        where = ", ".join(f"{s['start']} .. {s['end']}" for s in covered) or "none"
        print(f"    covered time of cluster {cluster!r}: {where}")
    uncovered = doc.get("idle", {}).get("total", {}).get("uncovered_allocatable_gpu_hours")
    print(f"    allocatable GPU-h outside it (not idle, not priced): {uncovered}")
    allocatable: dict[tuple[str, str], Fraction] = defaultdict(Fraction)
    for lo, hi in spans:
        for key, seconds in truth.allocatable_seconds(lo, hi).items():
            allocatable[key] += seconds
    allocated = truth.allocated_seconds()
    print(
        f"    {'idle: model / pool':<40} {'allocatable':>11} {'truth':>8} {'idle':>8} {'truth':>8}"
    )
    for key in sorted(allocatable.keys() | idle.keys()):
        cap = allocatable.get(key, Fraction(0))
        spare = cap - allocated.get(key, Fraction(0))
        row = idle.get(key, {})
        ok = near(row.get("allocatable_gpu_hours"), cap) and near(row.get("idle_gpu_hours"), spare)
        print(
            f"    {' / '.join(key):<40} {row.get('allocatable_gpu_hours')!s:>11} {hours(cap):>8}"
            f" {row.get('idle_gpu_hours')!s:>8} {hours(spare):>8}   {'exact' if ok else 'OFF'}"
        )
        if not ok:
            off.append(f"idle {key}")
    # a rate card prices, it never measures: priced with the example card (its mig_fractions
    # price MIG instances apart from their physical share), every physical figure is the same,
    # and the idle table's allocated GPU-h (with those outside the covered time) are the
    # usage table's
    priced = report_json([*month, "--by=namespace", "--idle", f"--rate-card={RATE_CARD}"])
    total = doc["total"]["gpu_hours_physical"]
    itotal = priced.get("idle", {}).get("total", {})
    allocated = itotal.get("allocated_gpu_hours", 0) + itotal.get(
        "uncovered_allocated_gpu_hours", 0
    )
    same = priced["total"]["gpu_hours_physical"] == total and abs(allocated - total) < 1e-9
    print(
        f"    physical GPU-h: usage table {total:.2f}, with the rate card "
        f"{priced['total']['gpu_hours_physical']:.2f}, its idle table's allocated "
        f"{allocated:.2f}   {'exact' if same else 'OFF'}"
    )
    if not same:
        off.append("physical GPU-h with the rate card")
    labels = report_json([*month, "--by=label:cost-center"])
    by_label = {r["group"]["label:cost-center"]: int(r["gpu_seconds_raw"]) for r in labels["rows"]}
    want_label = {k or None: v for k, v in truth.label_totals("cost-center").items()}
    for value in sorted(want_label.keys() | by_label.keys(), key=str):
        got, exp = by_label.get(value, 0), want_label.get(value, 0)
        print(
            f"    cost-center {value or '(none)':<8} raw GPU-s {got:>10}   truth {exp:>10}"
            f"   {'exact' if got == exp else 'OFF'}"
        )
        if got != exp:
            off.append(f"label cost-center={value}")
    peaks = truth.quota_peaks()
    for row in doc.get("quota", {}).get("rows", []):
        key = (row["group"]["namespace"], row["resource"])
        used, hard = peaks.get((key[0], f"requests.{key[1]}"), peaks.get(key, (None, None)))
        ok = (row["quota_peak_used"], row["quota_peak_hard"]) == (used, hard)
        print(
            f"    quota {key[0]:<12} {key[1]:<52} peak used {row['quota_peak_used']!s:>3} "
            f"(truth {used}) of hard {row['quota_peak_hard']!s:>3} (truth {hard})"
            f"   {'exact' if ok else 'OFF'}"
        )
        if not ok:
            off.append(f"quota {key}")
    if not doc.get("quota", {}).get("rows"):
        off.append("quota (no figures)")
    if off:
        raise SystemExit("demo: the report does not match the generator's truth: " + ", ".join(off))


def report_act(db_path: Path, workload: Workload) -> None:
    title("4. Chargeback: gpuquota report, with quota use")
    gpuquota = BIN / "gpuquota"
    store = f"--db=sqlite:///{shown(db_path)}"
    month = f"--month={month_of(workload.start)}"
    commands = [
        [store, month, f"--rate-card={shown(RATE_CARD)}", "--idle"],
        [store, month, "--by=namespace,path"],
        [store, month, "--by=label:cost-center,model"],
        [store, month, "--by=namespace,resource", "--format=csv"],
    ]

    def typed(args: list[str]) -> str:
        return shlex.join([shown(gpuquota), "report", *args])

    print(f"$ {typed(commands[0])}")
    subprocess.run([str(gpuquota), "report", *commands[0]], check=True)
    check_views(store, workload)
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
        workload = cluster_act(stack, work)
    report_act(work / "gpuquota.db", workload)
    title("5. The usage ledger: used, idle and energy per namespace, against the stand-in's truth")
    ledger_act(work, RATE_CARD)
    title("6. Every GPU's health history by serial: fences, relapses, a board moved")
    fleet_act(work)
    print(f"\ndemo finished; the store and the logs are in {shown(work)}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
