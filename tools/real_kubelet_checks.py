"""The checks tools/real-kubelet runs against a real kubelet (issue 31): whole GPUs, time-sliced
replicas and MIG (mixed strategy), each with gpu-exporter on the NVML stand-in serving the
device plugin.

Per mode: the exporter starts (``--device-plugin --cdi --node-taint
--node-condition``; ``--cdi`` because the machine has no /dev/nvidia* files, kubelet.md), and the
checks are: the Node's allocatable per resource as the kubelet counts it (replicas and MIG
instances one each), pods admitted and Running, each attributed on /metrics through the real
pod-resources API, time-sliced pods on distinct GPUs, the kubelet's checkpoint naming every pod,
``allocatedResourcesStatus`` Healthy; then an XID on the first pod's GPU (79) or MIG GPU (95):
the pod's own device Unhealthy, the others' not, the pod condition GPUUnhealthy True (set by
`gpuquota remediate --condition`, started beside the agent since issue 35), the
allocatable lower at the next node status sync with the capacity unchanged, the pod still
running (the kubelet evicts nothing); then recovery after the quiet period on every count.

One line per check (``PASS``/``FAIL mode check: detail``) and ``<work>/results.json``; exit 1
when a check failed. Run it through tools/real-kubelet (``check [MODE...]``), which starts the
cluster it expects.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import real_checks  # beside this script (tools/real_checks.py)
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from real_checks import Results

from gpuquota.sim.nvml.control import SimNode
from gpuquota.sim.nvml.spec import load as load_spec

GPU = "nvidia.com/gpu"
NAMESPACE = "gq-checks"
IMAGE = "gq.local/sleeper:1"
QUIET_S = 20
SERVING = re.compile(r"serving http://([\d.]+):(\d+)/metrics")
POD_INFO = re.compile(r"^gpu_pod_info\{([^}]*)\} 1$", re.M)


@dataclass(frozen=True)
class Mode:
    preset: str
    replicas: int
    capacity: dict[str, int]
    pods: dict[str, dict[str, int]]  # pod -> resource -> count; the first one meets the XID
    drop: dict[str, int]  # allocatable lost per resource when the first pod's GPU fails


MIG = ("nvidia.com/mig-3g.20gb", "nvidia.com/mig-2g.10gb", "nvidia.com/mig-1g.5gb")
MODES = {
    "whole": Mode("h100x8", 1, {GPU: 8}, {"whole-0": {GPU: 1}, "whole-pair": {GPU: 2}}, {GPU: 1}),
    "timeslicing": Mode(
        "h100x8", 2, {GPU: 16}, {f"shared-{n}": {GPU: 1} for n in range(3)}, {GPU: 2}
    ),
    "mig": Mode(
        "mixed",
        1,
        {GPU: 3, **dict.fromkeys(MIG, 1)},
        {"mig-small": {MIG[2]: 1}, "mig-big": {MIG[0]: 1}, "mig-whole": {GPU: 1}},
        dict.fromkeys(MIG, 1),  # XID 95 on the MIG GPU: every instance on it
    ),
}


@dataclass
class Run(Results):
    args: argparse.Namespace
    core: client.CoreV1Api

    def record(self, mode: str, check: str, ok: bool, detail: str = "", seconds: float | None = None) -> bool:  # fmt: skip
        return self.add(ok, detail, seconds, mode=mode, check=check)


def poll(check: Callable[[], Any], timeout: float, step: float = 0.2) -> tuple[Any, float]:
    """real_checks.poll, asked more often: a kubelet's answers change within a status sync."""
    return real_checks.poll(check, timeout, step)


class Exporter:
    def __init__(
        self, run: Run, mode: str, node: SimNode, replicas: int, remediate: tuple[str, ...] = ()
    ) -> None:
        a = run.args
        self.log_path = Path(a.work) / "log" / f"exporter-{mode}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log = self.log_path.open("w")
        command = [
            sys.executable, "-m", "gpuquota.exporter.cli", "--listen", "127.0.0.1:0",
            "--interval", "500ms", "--device-plugin", "--device-plugin-dir", a.plugin_dir, "--cdi",
            "--time-slicing-replicas", str(replicas), "--pod-resources-socket",
            a.pod_resources_socket, "--pod-resources-interval", "1s",
            "--health-quiet-period", f"{QUIET_S}s", "--node-name", a.node,
            "--kubeconfig", a.kubeconfig, "--node-taint", "--node-condition", "--dra", "off",
        ]  # fmt: skip
        env = {**os.environ, **node.env()}
        if a.exporter_source:  # another checkout's agent (the "before" of a fix)
            env["PYTHONPATH"] = a.exporter_source
        # python -m puts the working folder first on sys.path: run it where the source is
        self.proc = subprocess.Popen(
            command, env=env, cwd=a.exporter_source or None, stdout=self.log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        found, _ = poll(lambda: SERVING.search(self.log_path.read_text()), 30)
        if not found:
            self.stop()
            raise SystemExit(f"gpu-exporter did not start; see {self.log_path}")
        self.url = f"http://{found.group(1)}:{found.group(2)}"
        # pods are marked and evicted centrally (issue 35): gpuquota remediate beside the agent,
        # on a store of its own, logging into the same file; an older checkout has none
        self.remediate: subprocess.Popen[bytes] | None = None
        if not a.exporter_source:
            url = f"sqlite:///{Path(a.work) / f'remediate-{mode}.db'}"
            subprocess.run([sys.executable, "-m", "gpuquota.quota.cli", "db", "upgrade",
                            "--db", url], check=True, stdout=self.log, stderr=subprocess.STDOUT)  # fmt: skip
            self.remediate = subprocess.Popen(
                [sys.executable, "-m", "gpuquota.quota.cli", "remediate", "--kubeconfig",
                 a.kubeconfig, "--db", url, "--metrics-port", "0", "--interval", "1s",
                 "--condition", *remediate],
                stdout=self.log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def pods_on(self) -> dict[str, str]:
        """pod -> the GPU or MIG UUID /metrics attributes to it (the last, for several)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as response:
            body = response.read().decode()
        out = {}
        for labels in POD_INFO.findall(body):
            pairs = dict(re.findall(r'(\w+)="([^"]*)"', labels))
            if pairs.get("namespace") == NAMESPACE:
                out[pairs["pod"]] = pairs["uuid"]
        return out

    def stop(self) -> None:
        for proc in (self.remediate, self.proc):
            if proc is None:
                continue
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.log.close()


def pod_manifest(name: str, limits: dict[str, int]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            # the agent's node taint stays up while any GPU is unhealthy
            "tolerations": [{"key": "gpuquota.io/gpu-unhealthy", "operator": "Exists"}],
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "imagePullPolicy": "Never",
                    "resources": {"limits": {r: str(n) for r, n in limits.items()}},
                }
            ],
        },
    }


def node_counts(run: Run) -> tuple[dict[str, int], dict[str, int]]:
    status = run.core.read_node(run.args.node).status

    def ints(d: dict[str, str] | None) -> dict[str, int]:
        return {k: int(v) for k, v in (d or {}).items() if k.startswith("nvidia.com/")}

    return ints(status.capacity), ints(status.allocatable)


def resource_health(run: Run, pod: str) -> dict[str, str]:
    """device ID -> health from the pod's allocatedResourcesStatus (KEP-4680)."""
    raw = run.core.api_client.sanitize_for_serialization(
        run.core.read_namespaced_pod(pod, NAMESPACE)
    )
    out = {}
    for status in raw.get("status", {}).get("containerStatuses") or []:
        for group in status.get("allocatedResourcesStatus") or []:
            for resource in group.get("resources") or []:
                out[resource["resourceID"]] = resource.get("health", "")
    return out


def condition(run: Run, pod: str) -> str | None:
    for c in run.core.read_namespaced_pod(pod, NAMESPACE).status.conditions or []:
        if c.type == "GPUUnhealthy":
            return str(c.status)
    return None


def checkpoint_uids(plugin_dir: str) -> set[str]:
    data = json.loads((Path(plugin_dir) / "kubelet_internal_checkpoint").read_text())
    return {e["PodUID"] for e in data["Data"]["PodDeviceEntries"] or []}


def run_mode(run: Run, name: str) -> None:
    mode = MODES[name]
    state = Path(run.args.work) / f"nvml-{name}.state"
    node = SimNode.create(state, mode.preset)
    exporter = Exporter(run, name, node, mode.replicas)
    try:
        _checks(run, name, mode, node, exporter)
    finally:
        for pod in mode.pods:
            with contextlib.suppress(ApiException):
                run.core.delete_namespaced_pod(pod, NAMESPACE, grace_period_seconds=0)
        poll(lambda: not run.core.list_namespaced_pod(NAMESPACE).items, 60)
        exporter.stop()
        node.close()


def _checks(run: Run, name: str, mode: Mode, node: SimNode, exporter: Exporter) -> None:
    r = run.record

    def counts_are(want: dict[str, int], which: int) -> bool:
        got = node_counts(run)[which]
        return all(got.get(k) == v for k, v in want.items())

    _, took = poll(lambda: counts_are(mode.capacity, 1), 40)
    r(name, "allocatable", counts_are(mode.capacity, 1),
      f"want {mode.capacity}, Node says {node_counts(run)[1]}", took)  # fmt: skip

    for pod, limits in mode.pods.items():
        run.core.create_namespaced_pod(NAMESPACE, pod_manifest(pod, limits))

    def running() -> bool:
        phases = {
            p.metadata.name: p.status.phase for p in run.core.list_namespaced_pod(NAMESPACE).items
        }
        return all(phases.get(p) == "Running" for p in mode.pods)

    ok, took = poll(running, 90)
    if not r(name, "pods running", bool(ok), ", ".join(mode.pods), took):
        return
    held, took = poll(lambda: (h := exporter.pods_on()) and set(h) >= set(mode.pods) and h, 15)
    held = held or exporter.pods_on()
    r(name, "attribution", set(held) >= set(mode.pods), f"/metrics gpu_pod_info: {held}", took)
    if name == "timeslicing":
        gpus = [held.get(p) for p in mode.pods]
        r(name, "spread over GPUs", len(set(gpus)) == len(gpus), f"GPUs {gpus}")
    uids = {p: run.core.read_namespaced_pod(p, NAMESPACE).metadata.uid for p in mode.pods}
    r(name, "checkpoint", set(uids.values()) <= checkpoint_uids(run.args.plugin_dir),
      "kubelet_internal_checkpoint names every pod's UID")  # fmt: skip
    healths = {p: resource_health(run, p) for p in mode.pods}
    r(name, "allocatedResourcesStatus healthy",
      all(h and set(h.values()) == {"Healthy"} for h in healths.values()), str(healths))  # fmt: skip

    # the fault, on the first pod's GPU (or MIG GPU)
    first = next(iter(mode.pods))
    uuid = held.get(first, "")
    if uuid.startswith("MIG-"):
        gpu = next(i for i in range(node.gpu_count) if uuid in node.mig_uuids(i))
        instance = next(m for m in load_spec(mode.preset).gpus[gpu].mig if m.uuid == uuid)
        node.inject_xid(gpu, 95, instance.gpu_instance_id, instance.compute_instance_id)
        fault = f"XID 95 on GPU {gpu} (MIG)"
    else:
        gpu = [node.uuid(i) for i in range(node.gpu_count)].index(uuid)
        node.inject_xid(gpu, 79)
        fault = f"XID 79 on GPU {gpu}"
    capacity_before, allocatable_before = node_counts(run)
    sick, took = poll(lambda: "Unhealthy" in resource_health(run, first).values(), 5, 0.05)
    r(name, "pod status Unhealthy", bool(sick), f"{fault}: {resource_health(run, first)}", took)
    # pods on the same physical GPU share the fault: a MIG GPU's uncontained error (XID 95)
    # withdraws every instance on it
    same_gpu = set(node.mig_uuids(gpu)) | {node.uuid(gpu)}
    siblings = {
        p: resource_health(run, p) for p in mode.pods if p != first and held.get(p) in same_gpu
    }
    if siblings:
        r(name, "same-GPU pods Unhealthy",
          all(set(h.values()) == {"Unhealthy"} for h in siblings.values()), str(siblings))  # fmt: skip
    others = {p: resource_health(run, p) for p in mode.pods if p != first and p not in siblings}
    r(name, "other pods Healthy",
      all(set(h.values()) == {"Healthy"} for h in others.values()), str(others))  # fmt: skip
    if not run.args.exporter_source:
        marked, took = poll(lambda: condition(run, first) == "True", 15)
        r(name, "pod condition GPUUnhealthy", bool(marked), f"{condition(run, first)}", took)
    lower = {k: allocatable_before[k] - n for k, n in mode.drop.items()}
    _, took = poll(lambda: counts_are(lower, 1), 20)
    r(name, "allocatable lower at status sync", counts_are(lower, 1),
      f"want {lower}, Node says {node_counts(run)[1]}", took)  # fmt: skip
    r(name, "capacity unchanged", node_counts(run)[0] == capacity_before, str(node_counts(run)[0]))
    time.sleep(15)
    phase = run.core.read_namespaced_pod(first, NAMESPACE).status.phase
    r(name, "kubelet evicts nothing", phase == "Running", f"phase {phase} 15 s later")

    healthy, took = poll(
        lambda: set(resource_health(run, first).values()) == {"Healthy"}, QUIET_S + 30
    )
    r(name, "recovered: pod status Healthy", bool(healthy), str(resource_health(run, first)), took)
    if not run.args.exporter_source:
        cleared, took = poll(lambda: condition(run, first) == "False", 15)
        r(name, "recovered: condition False", bool(cleared), f"{condition(run, first)}", took)
    _, took = poll(lambda: counts_are(allocatable_before, 1), 20)
    r(name, "recovered: allocatable back", counts_are(allocatable_before, 1),
      f"want {allocatable_before}, Node says {node_counts(run)[1]}", took)  # fmt: skip


EVICT_AFTER_S = 5


def run_evict(run: Run) -> None:
    """gpuquota remediate --evict on a real apiserver and kubelet: the pod on a GPU that needs a reboot is
    evicted through the Eviction API once the verdict held --evict-after; a pod whose
    PodDisruptionBudget (counted by the real disruption controller) allows no disruption stays;
    a pod on a healthy GPU stays."""
    name, r = "evict", run.record
    node = SimNode.create(Path(run.args.work) / "nvml-evict.state", "h100x8")
    policy = client.PolicyV1Api(run.core.api_client)
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
           "metadata": {"name": "guarded", "namespace": NAMESPACE},
           "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}}  # fmt: skip
    policy.create_namespaced_pod_disruption_budget(NAMESPACE, pdb)
    pods = {"victim": {}, "guarded": {"app": "guarded"}, "bystander": {}}
    exporter = Exporter(
        run, name, node, 1, ("--evict", f"--evict-after={EVICT_AFTER_S}s", "--evict-max=2")
    )
    try:
        for pod, labels in pods.items():
            manifest = pod_manifest(pod, {GPU: 1})
            manifest["metadata"]["labels"] = labels
            run.core.create_namespaced_pod(NAMESPACE, manifest)
        held, took = poll(lambda: (h := exporter.pods_on()) and set(h) >= set(pods) and h, 90)
        if not r(name, "pods running and attributed", bool(held), str(held), took):
            return
        allowed, _ = poll(
            lambda: policy.read_namespaced_pod_disruption_budget("guarded", NAMESPACE).status
            and policy.read_namespaced_pod_disruption_budget("guarded", NAMESPACE).status.current_healthy == 1,
            30,
        )  # fmt: skip
        gpus = [node.uuid(i) for i in range(node.gpu_count)]
        for pod in ("victim", "guarded"):
            node.inject_xid(gpus.index(held[pod]), 79)

        def gone(pod: str) -> bool:
            try:
                run.core.read_namespaced_pod(pod, NAMESPACE)
            except ApiException as exc:
                return exc.status == 404
            return False

        evicted, took = poll(lambda: gone("victim"), EVICT_AFTER_S + 30)
        r(name, "evicted through the Eviction API", bool(evicted),
          f"victim gone after {EVICT_AFTER_S}s --evict-after", took)  # fmt: skip
        time.sleep(10)
        r(name, "PodDisruptionBudget honoured", not gone("guarded"),
          f"guarded still there (budget counted: {bool(allowed)})")  # fmt: skip
        r(name, "healthy GPU's pod untouched", not gone("bystander"), "bystander still there")
        log = exporter.log_path.read_text()
        r(name, "logged", "evicted gq-checks/victim" in log and "disruption budget" in log,
          "evicted ... / waits for its disruption budget")  # fmt: skip
    finally:
        for pod in pods:
            with contextlib.suppress(ApiException):
                run.core.delete_namespaced_pod(pod, NAMESPACE, grace_period_seconds=0)
        with contextlib.suppress(ApiException):
            policy.delete_namespaced_pod_disruption_budget("guarded", NAMESPACE)
        poll(lambda: not run.core.list_namespaced_pod(NAMESPACE).items, 60)
        exporter.stop()
        node.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modes", nargs="*", help=f"of {', '.join(MODES)}, evict (default: all)")
    parser.add_argument("--work", required=True)
    parser.add_argument("--node", required=True)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--pod-resources-socket", required=True)
    parser.add_argument("--plugin-dir", required=True)
    parser.add_argument(
        "--exporter-source",
        help="run gpu-exporter from this source tree (PYTHONPATH) instead of this one's",
    )
    args = parser.parse_args(argv)
    unknown = [m for m in args.modes if m not in (*MODES, "evict")]
    if unknown:
        parser.error(f"unknown mode(s) {', '.join(unknown)}: choose from {', '.join(MODES)}, evict")
    config.load_kube_config(args.kubeconfig)  # type: ignore[no-untyped-call]
    run = Run(args, client.CoreV1Api())
    try:
        run.core.create_namespace({"metadata": {"name": NAMESPACE}})
    except ApiException as exc:
        if exc.status != 409:
            raise
    # the ServiceAccount admission plugin refuses pods until the controller made "default"
    poll(lambda: run.core.read_namespaced_service_account("default", NAMESPACE), 60)
    for name in args.modes or [*MODES, "evict"]:
        if name == "evict":
            run_evict(run)
        else:
            run_mode(run, name)
    out = Path(args.work) / "results.json"
    out.write_text(json.dumps(run.results, indent=1))
    failed = [x for x in run.results if not x["ok"]]
    print(f"{len(run.results) - len(failed)} passed, {len(failed)} failed; {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
