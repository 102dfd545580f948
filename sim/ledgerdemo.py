"""Act 5 of `make demo`: the usage ledger, checked against the NVML stand-in's own truth.

Three simulated GPU nodes, each with its real `gpu-exporter`, a real Prometheus scraping them
every second, and the real `gpuquota controller` ingesting the agents' counters into its store:

- ``gpu-b``: two whole H100s (a busy trainer, an idle notebook) and an H100 in MIG mode (a
  service on its 3g.40gb instance);
- ``gpu-c``: one H100 time-sliced between two pods (per-process SM utilisation);
- ``gpu-a``: two H100s held by one trainer, whose exporter is stopped for a while and
  restarted (a counter reset), so its namespace shows the coverage it lost.

The stand-in is driven with known activity and power for a known stretch of wall-clock time
(power is 0 W outside it, so each GPU's energy counter says exactly what it used); the
controller is restarted in the middle. `gpuquota report` then shows allocated, used, idle and
energy per namespace, and each full-coverage namespace must match the truth within 1 %.
"""

from __future__ import annotations

import calendar
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuquota.quota.promhttp import PrometheusError, instant_query
from gpuquota.sim.apiserver import ApiServer
from gpuquota.sim.harness import free_port, poll, stop_process
from gpuquota.sim.kubelet.checkpoint import CHECKPOINT_FILE
from gpuquota.sim.kubelet.podresources import Assignment, PodResourcesServer
from gpuquota.sim.nvml.control import SimNode
from gpuquota.sim.promserver import scraping
from gpuquota.sim.workload import rfc3339

BIN = Path(sys.executable).parent
GPU = "nvidia.com/gpu"
MIG_RESOURCE = "nvidia.com/mig-3g.40gb"
H100_LABEL = "NVIDIA-H100-80GB-HBM3"
WINDOW_S = 5  # the ledger's window in the demo (production: 1 h)
ACTIVE_S = 40  # how long the stand-in is driven: a multiple of the slow interval (5 s), see drive()
DOWNTIME_S = 10  # how long gpu-a's exporter is stopped
INTERVAL = "250ms"  # the exporters' collection interval
TOLERANCE = 0.01


@dataclass
class DemoPod:
    namespace: str
    name: str
    uid: str
    node: str
    resource: str
    device_ids: tuple[str, ...]  # as the kubelet hands them out (uuid, uuid::replica, MIG uuid)
    container_id: str
    pid: int | None = None  # its process on a time-sliced GPU
    truth_used: float = 0.0  # physical GPU-seconds
    truth_energy: float = 0.0  # joules


@dataclass
class DemoNode:
    name: str
    sim: SimNode
    work: Path
    pods: list[DemoPod] = field(default_factory=list)
    pod_resources: PodResourcesServer | None = None
    port: int = 0
    exporter: subprocess.Popen[bytes] | None = None
    restarts: int = 0


def _uid(n: int) -> str:
    return f"5e1d9a00-0000-4000-8000-{n:012x}"


def node_object(name: str, labels: dict[str, str], capacity: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": _uid(0x100 + int(name[-1], 16)),
            "creationTimestamp": rfc3339(int(time.time()) - 86400),
            "labels": {"kubernetes.io/hostname": name, "node-pool": "h100", **labels},
        },
        "spec": {},
        "status": {
            "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110", **capacity},
            "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", **capacity},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def pod_object(pod: DemoPod, started: float) -> dict[str, Any]:
    units = len(pod.device_ids)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod.name,
            "namespace": pod.namespace,
            "uid": pod.uid,
            "creationTimestamp": rfc3339(int(started)),
        },
        "spec": {
            "nodeName": pod.node,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/main:1.0",
                    "resources": {
                        "limits": {pod.resource: str(units), "cpu": "4"},
                        "requests": {pod.resource: str(units), "cpu": "4"},
                    },
                }
            ],
        },
        "status": {
            "phase": "Running",
            "startTime": rfc3339(int(started)),
            "qosClass": "Burstable",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [
                {
                    "name": "main",
                    "containerID": f"containerd://{pod.container_id}",
                    "ready": True,
                    "restartCount": 0,
                    "image": "registry.example/main:1.0",
                    "imageID": "",
                    "state": {"running": {"startedAt": rfc3339(int(started))}},
                }
            ],
        },
    }


def _cgroup(pod: DemoPod) -> str:
    slice_ = f"kubepods-besteffort-pod{pod.uid.replace('-', '_')}.slice"
    return (
        f"0::/kubepods.slice/kubepods-besteffort.slice/{slice_}/"
        f"cri-containerd-{pod.container_id}.scope\n"
    )


class LedgerDemo:
    """Builds the three nodes, runs the programs, drives the stand-in and checks the report."""

    def __init__(
        self, stack: ExitStack, work: Path, rate_card: Path, say: Callable[[str], None] = print
    ) -> None:
        self.stack = stack
        self.rate_card = rate_card
        self.work = work
        self.say = say
        self.db = f"sqlite:///{work / 'ledger.db'}"
        self.api = ApiServer()
        self.nodes: dict[str, DemoNode] = {}
        self.logs: dict[str, Path] = {}
        self.controller: subprocess.Popen[bytes] | None = None
        self.controller_port = free_port()
        self.prometheus_url = ""
        self.proc_root = work / "proc"
        self.exporter_args: list[str] = []  # more flags of every exporter (the fleet act's)

    # --- set-up ----------------------------------------------------------------------------

    def build(self) -> None:
        self.api.start()
        self.stack.callback(self.api.stop)
        self.kubeconfig = self.api.write_kubeconfig(self.work / "kubeconfig")
        h100 = {"model": "H100-SXM5-80GB"}
        specs = {
            "gpu-a": {"name": "gpu-a", "gpus": [{**h100, "count": 2}]},
            "gpu-b": {
                "name": "gpu-b",
                "gpus": [
                    {**h100, "count": 2},
                    {**h100, "count": 1, "mig": ["3g.40gb", "2g.20gb", "1g.10gb"]},
                ],
            },
            "gpu-c": {"name": "gpu-c", "gpus": [{**h100, "count": 1}]},
        }
        for name, spec in specs.items():
            folder = self.work / name
            folder.mkdir()
            sim = SimNode.create(folder / "node.state", spec)
            for i in range(sim.gpu_count):
                sim.set(i, power_watts=0.0, gpu_utilization_ratio=0.0)
            self.nodes[name] = DemoNode(name, sim, folder)
        labels = {"nvidia.com/gpu.product": H100_LABEL}
        self.api.apply("ADDED", node_object("gpu-a", {**labels, "nvidia.com/gpu.count": "2"},
                                            {GPU: "2"}))  # fmt: skip
        self.api.apply(
            "ADDED",
            node_object(
                "gpu-b",
                {**labels, "nvidia.com/gpu.count": "3", "nvidia.com/mig.strategy": "mixed"},
                {GPU: "2", MIG_RESOURCE: "1", "nvidia.com/mig-2g.20gb": "1",
                 "nvidia.com/mig-1g.10gb": "1"},
            ),
        )  # fmt: skip
        self.api.apply(
            "ADDED",
            node_object(
                "gpu-c",
                {**labels, "nvidia.com/gpu.count": "1", "nvidia.com/gpu.replicas": "2",
                 "nvidia.com/gpu.sharing-strategy": "time-slicing"},
                {GPU: "2"},
            ),
        )  # fmt: skip
        for ns in ("ml", "vision", "inference", "research"):
            self.api.apply(
                "ADDED",
                {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": ns, "uid": _uid(0x200 + len(ns)),
                              "labels": {"team": ns}}},
            )  # fmt: skip
        a, b, c = self.nodes["gpu-a"], self.nodes["gpu-b"], self.nodes["gpu-c"]
        cid = "c0ffee".ljust(64, "0")
        a.pods = [DemoPod("ml", "trainer", _uid(1), "gpu-a", GPU,
                          (a.sim.uuid(0), a.sim.uuid(1)), cid.replace("0", "1", 1))]  # fmt: skip
        b.pods = [
            DemoPod("vision", "train-0", _uid(2), "gpu-b", GPU, (b.sim.uuid(0),),
                    cid.replace("0", "2", 1)),
            DemoPod("vision", "notebook-idle", _uid(3), "gpu-b", GPU, (b.sim.uuid(1),),
                    cid.replace("0", "3", 1)),
            DemoPod("inference", "mig-svc", _uid(4), "gpu-b", MIG_RESOURCE,
                    (b.sim.mig_uuids(2)[0],), cid.replace("0", "4", 1)),
        ]  # fmt: skip
        c.pods = [
            DemoPod("research", "ana", _uid(5), "gpu-c", GPU, (f"{c.sim.uuid(0)}::0",),
                    cid.replace("0", "5", 1), pid=4101),
            DemoPod("research", "bo", _uid(6), "gpu-c", GPU, (f"{c.sim.uuid(0)}::1",),
                    cid.replace("0", "6", 1), pid=4102),
        ]  # fmt: skip
        for node in self.nodes.values():
            server = PodResourcesServer(
                node.work / "pod-resources.sock", (), checkpoint=node.work / CHECKPOINT_FILE
            ).start()
            self.stack.callback(server.stop)
            node.pod_resources = server
            for pod in node.pods:
                if pod.pid is not None:
                    (self.proc_root / str(pod.pid)).mkdir(parents=True)
                    (self.proc_root / str(pod.pid) / "cgroup").write_text(_cgroup(pod))

    def start_exporter(self, node: DemoNode) -> None:
        if node.port == 0:
            node.port = free_port()
        log = node.work / f"gpu-exporter-{node.restarts}.log"
        args = [
            str(BIN / "gpu-exporter"),
            f"--listen=127.0.0.1:{node.port}",
            f"--interval={INTERVAL}",
            f"--pod-resources-socket={node.work / 'pod-resources.sock'}",
            "--pod-usage",
            f"--device-checkpoint={node.work / CHECKPOINT_FILE}",
            f"--node-name={node.name}",
            f"--kubeconfig={self.kubeconfig}",
            f"--proc-root={self.proc_root}",
            *self.exporter_args,
        ]
        with log.open("wb") as out:
            node.exporter = subprocess.Popen(
                args, env={**os.environ, **node.sim.env()}, stdout=out, stderr=subprocess.STDOUT
            )
        self.logs[f"gpu-exporter on {node.name}"] = log
        node.restarts += 1

    def stop_exporter(self, node: DemoNode) -> None:
        if node.exporter is not None:
            stop_process(node.exporter)
            node.exporter = None

    def start_controller(self, generation: int) -> None:
        log = self.work / f"controller-{generation}.log"
        args = [
            str(BIN / "gpuquota"),
            "controller",
            f"--kubeconfig={self.kubeconfig}",
            f"--db={self.db}",
            "--cluster=ledger-demo",
            "--migrate",
            f"--metrics-port={self.controller_port}",
            "--metrics-address=127.0.0.1",
            "--flush-interval=500ms",
            "--node-pool-label=node-pool",
            f"--ledger-prometheus-url={self.prometheus_url}",
            f"--ledger-window={WINDOW_S}s",
            "--ledger-delay=3s",
            "--ledger-lookback=10s",
            "--ledger-backfill=2m",
            "--ledger-max-gap=3s",  # Prometheus scrapes every second here
            "--idle-for=20s",
        ]
        with log.open("wb") as out:
            self.controller = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        self.logs["gpuquota controller"] = log

    def stop_controller(self) -> None:
        if self.controller is not None:
            stop_process(self.controller)
            self.controller = None

    def check_alive(self) -> None:
        procs: list[tuple[str, subprocess.Popen[bytes] | None]] = [
            ("gpuquota controller", self.controller),
            *((f"gpu-exporter on {n.name}", n.exporter) for n in self.nodes.values()),
        ]
        for name, proc in procs:
            if proc is not None and proc.poll() is not None:
                tail = self.logs[name].read_text(errors="replace").strip().splitlines()[-5:]
                raise SystemExit(
                    f"demo: {name} exited ({proc.returncode}):\n  " + "\n  ".join(tail)
                )

    def wait(self, what: str, check: Callable[[], bool], timeout: float = 30.0) -> None:
        def ready() -> bool:
            self.check_alive()
            try:
                return check()
            except (OSError, sqlite3.Error, ValueError, KeyError, PrometheusError):
                return False

        if poll(ready, timeout, interval=0.2) is None:
            raise SystemExit(f"demo: gave up waiting for {what} after {timeout:.0f} s")

    def query(self, promql: str) -> list[dict[str, Any]]:
        return list(instant_query(self.prometheus_url, promql, time.time(), 5.0)["result"])

    def ingested_until(self) -> int:
        with sqlite3.connect(self.work / "ledger.db") as conn:
            row = conn.execute("SELECT ingested_until FROM ledger_progress").fetchone()
        return int(row[0]) if row else 0

    # --- the run ---------------------------------------------------------------------------

    def place_pods(self) -> float:
        started = time.time()
        for node in self.nodes.values():
            for pod in node.pods:
                self.api.apply("ADDED", pod_object(pod, started))
                if pod.pid is not None:
                    node.sim.add_process(0, pod.pid, 4 * 2**30)  # gpu-c's one GPU
            assert node.pod_resources is not None
            node.pod_resources.set_assignments(
                [Assignment(p.namespace, p.name, "main", p.resource, p.device_ids, p.uid)
                 for p in node.pods]
            )  # fmt: skip
        return started

    def drive(self) -> tuple[float, float]:
        """Known activity and power for ACTIVE_S seconds; gpu-a's exporter stopped for
        DOWNTIME_S and the controller restarted in between. Returns (t0, t1).

        The agents read GPM on each GPU's slow turn (every 5 s) and per-process samples once a
        second, and a counter takes a reading from the round that reads it: a change shows one
        reading period late, at the start and at the end alike, so over a span that is a whole
        number of periods the two delays cancel and the truth is activity x span."""
        a, b, c = self.nodes["gpu-a"], self.nodes["gpu-b"], self.nodes["gpu-c"]
        before = {(n.name, i): n.sim.get(i, "energy_joules")
                  for n in self.nodes.values() for i in range(n.sim.gpu_count)}  # fmt: skip
        t0 = time.time()
        for i in (0, 1):
            a.sim.set_gpm(i, sm_activity=0.9)
            a.sim.set(i, power_watts=600.0)
        b.sim.set_gpm(0, sm_activity=0.8)
        b.sim.set(0, power_watts=500.0)
        b.sim.set_gpm(1, sm_activity=0.02)
        b.sim.set(1, power_watts=90.0)
        b.sim.set_gpm(2, mig=0, sm_activity=0.6)
        b.sim.set(2, power_watts=280.0)
        c.sim.set_process_utilization(0, 4101, sm=0.3, memory=0.1)
        c.sim.set_process_utilization(0, 4102, sm=0.5, memory=0.2)
        c.sim.set(0, power_watts=400.0)
        self.say(f"driving the stand-in for {ACTIVE_S} s with known activity and power")
        time.sleep(10)
        self.say(f"  stopping the exporter on gpu-a for {DOWNTIME_S} s")
        self.stop_exporter(a)
        time.sleep(DOWNTIME_S)
        self.start_exporter(a)
        self.say("  gpu-a's exporter restarted (its counters start again from 0)")
        time.sleep(5)
        self.say("  restarting the controller")
        self.stop_controller()
        time.sleep(3)
        self.start_controller(2)
        remaining = ACTIVE_S - (time.time() - t0)
        time.sleep(max(0.0, remaining))
        for node in self.nodes.values():
            for i in range(node.sim.gpu_count):
                node.sim.set(i, power_watts=0.0)
        for i in (0, 1):
            a.sim.set_gpm(i, sm_activity=0.0)
        b.sim.set_gpm(0, sm_activity=0.0)
        b.sim.set_gpm(1, sm_activity=0.0)
        b.sim.set_gpm(2, mig=0, sm_activity=0.0)
        c.sim.set_process_utilization(0, 4101, sm=0.0, memory=0.0)
        c.sim.set_process_utilization(0, 4102, sm=0.0, memory=0.0)
        t1 = time.time()
        energy = {key: n.sim.get(key[1], "energy_joules") - before[key]
                  for n in self.nodes.values() for key in before if key[0] == n.name}  # fmt: skip
        span = t1 - t0
        (trainer,) = a.pods
        trainer.truth_used = 2 * 0.9 * span
        trainer.truth_energy = energy[("gpu-a", 0)] + energy[("gpu-a", 1)]
        train, idle, mig = b.pods
        train.truth_used, train.truth_energy = 0.8 * span, energy[("gpu-b", 0)]
        idle.truth_used, idle.truth_energy = 0.02 * span, energy[("gpu-b", 1)]
        mig.truth_used, mig.truth_energy = 0.6 * 3 / 7 * span, energy[("gpu-b", 2)] * 3 / 7
        ana, bo = c.pods
        ana.truth_used, ana.truth_energy = 0.3 * span, energy[("gpu-c", 0)] * 0.3 / 0.8
        bo.truth_used, bo.truth_energy = 0.5 * span, energy[("gpu-c", 0)] * 0.5 / 0.8
        return t0, t1

    def report(self, args: list[str]) -> dict[str, Any]:
        done = subprocess.run(
            [str(BIN / "gpuquota"), "report", f"--db={self.db}", *args, "--format=json"],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"demo: gpuquota report {' '.join(args)} failed: {done.stderr}")
        doc: dict[str, Any] = json.loads(done.stdout)
        return doc

    def start_stack(self) -> None:
        """Every node's gpu-exporter, a Prometheus scraping them and the controller reading it
        (stopped in reverse when the demo's stack closes)."""
        for node in self.nodes.values():
            self.start_exporter(node)
        jobs = {"gpu-exporter": [n.port for n in self.nodes.values()]}
        served = self.stack.enter_context(scraping(self.work / "prometheus", jobs))
        self.prometheus_url = served.url
        self.stack.callback(self.stop_controller)
        for node in self.nodes.values():
            self.stack.callback(self.stop_exporter, node)
        self.start_controller(1)

    def run(self) -> None:
        self.build()
        self.start_stack()
        started = self.place_pods()
        self.say("3 GPU nodes, 6 pods (whole GPUs, a MIG instance, a time-sliced GPU), "
                 "3 gpu-exporters, Prometheus, the controller with the ledger on")  # fmt: skip
        self.wait(
            "the counters of every pod in Prometheus",
            lambda: len(self.query("count by (pod_uid) (gpu_pod_used_seconds_total)")) == 6,
            timeout=40,
        )
        _t0, t1 = self.drive()
        final = int(t1) + 2 * WINDOW_S
        self.say("waiting for the ledger to ingest the last windows")
        self.wait(
            "the ledger to reach the end of the run",
            lambda: self.ingested_until() >= final,
            timeout=60,
        )
        self.check(started, final)

    def check(self, started: float, final: int) -> None:
        period = [f"--from={rfc3339(int(started))}", f"--to={rfc3339(final)}"]
        doc = self.report([*period, "--by=namespace"])
        rows = {row["group"]["namespace"]: row for row in doc["rows"]}
        off: list[str] = []
        self.say(
            f"\n    {'namespace':<10} {'used GPU-s':>10} {'truth':>8} "
            f"{'energy J':>9} {'truth':>9} {'coverage':>8}"
        )
        for node in self.nodes.values():
            by_ns: dict[str, tuple[float, float]] = {}
            for pod in node.pods:
                used, joules = by_ns.get(pod.namespace, (0.0, 0.0))
                by_ns[pod.namespace] = (used + pod.truth_used, joules + pod.truth_energy)
            for ns, (used, joules) in sorted(by_ns.items()):
                row = rows.get(ns, {})
                got_used = row.get("gpu_seconds_used")
                got_energy = row.get("energy_joules")
                coverage = row.get("usage_coverage_ratio")
                full = node.name != "gpu-a"
                if full:
                    ok = (
                        got_used is not None
                        and got_energy is not None
                        and abs(got_used - used) <= TOLERANCE * used
                        and abs(got_energy - joules) <= TOLERANCE * joules
                    )
                    verdict = "within 1 %" if ok else "OFF"
                else:
                    # the stopped exporter's usage is missing, never counted twice
                    ok = (
                        got_used is not None
                        and coverage is not None
                        and coverage < 0.95
                        and got_used <= used * (1 + TOLERANCE)
                    )
                    verdict = "coverage shown" if ok else "OFF"
                if not ok:
                    off.append(ns)
                self.say(
                    f"    {ns:<10} {_num(got_used):>10} {used:>8.1f} {_num(got_energy):>9} {joules:>9.0f} "
                    f"{_num(coverage, 3):>8}   {verdict}"
                )
        self.say(
            "    (coverage: the seconds each pod held GPUs with usage samples; a pod's first "
            "seconds have none, until its exporter knows its UID and Prometheus scrapes)"
        )
        if off:
            raise SystemExit(
                "demo: the ledger does not match the stand-in's truth: " + ", ".join(off)
            )
        self.idle_view(period, idle_since_before=final - 2 * WINDOW_S - ACTIVE_S // 2)

    def idle_view(self, period: list[str], idle_since_before: int) -> None:
        """The report as a user reads it, and its idle allocations: the notebook that held a
        GPU at 2 % must be listed from the start (every pod is idle once the drive ends)."""
        args = [*period, "--by=namespace", "--idle-allocations", "--idle-for=20s",
                f"--rate-card={self.rate_card}"]  # fmt: skip
        self.say(f"\n$ gpuquota report --db=... {' '.join(args[2:])} --from=... --to=...")
        shown = subprocess.run(
            [str(BIN / "gpuquota"), "report", f"--db={self.db}", *args],
            capture_output=True,
            text=True,
            check=False,
        )
        if shown.returncode != 0:
            raise SystemExit(f"demo: gpuquota report failed: {shown.stderr}")
        self.say("\n".join(line for line in shown.stdout.splitlines()
                           if not line.startswith("note:")))  # fmt: skip
        doc = self.report(args)
        for cluster, spans in sorted(doc["covered"].items()):  # what the bill can speak for
            where = ", ".join(f"{s['start']} .. {s['end']}" for s in spans) or "none"
            self.say(f"covered time of cluster {cluster!r}: {where}")
        idle = [
            row
            for row in doc["idle_allocations"]["rows"]
            if row["name"] == "notebook-idle" and row["namespace"] == "vision"
        ]
        since = [_epoch(row["idle_since"]) for row in idle]
        if not since or min(since) > idle_since_before:
            raise SystemExit(
                "demo: the idle view does not list vision/notebook-idle as idle while the "
                f"others were busy: {idle}"
            )
        self.say(
            f"\nvision/notebook-idle: idle since {idle[0]['idle_since']} at "
            f"{idle[0]['activity_pct']:.1f} % activity: a reclaim candidate (nothing is evicted)"
        )


def _epoch(text: str) -> int:
    return calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ"))


def _num(value: Any, decimals: int = 1) -> str:
    return "-" if value is None else f"{float(value):.{decimals}f}"


def ledger_act(work: Path, rate_card: Path) -> None:
    """Act 5 of the demo (see the module's docstring)."""
    folder = work / "ledger"
    folder.mkdir(parents=True)
    with ExitStack() as stack:
        LedgerDemo(stack, folder, rate_card).run()
