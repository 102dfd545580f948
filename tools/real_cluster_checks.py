"""The checks tools/real-cluster runs on the real one-node cluster (issue 38, item 3): our image
and deploy/examples/production as applied there, behind a Prometheus scraping as the Operator
renders, with the store in PostgreSQL.

One line per check (``PASS``/``FAIL check (seconds): detail``) and ``<work>/results.json``;
exit 1 when a check failed. The checks run in an order that keeps each one's world intact for
the next: the XID 79 fence (which lasts until a reboot) comes last. Run it through
tools/real-cluster (``check [CHECK...]``), which starts the cluster it expects.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime as dt
import io
import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException
from real_checks import Results, poll  # beside this script (tools/real_checks.py)

from gpuquota.sim.nvml.control import SimNode

NS = "gpuquota"
CHECKS_NS = "gq-checks"
GPU = "nvidia.com/gpu"
TAINT = "gpuquota.io/gpu-unhealthy"
WORKLOAD = "gq.local/sleeper:1"
AGENT = "app.kubernetes.io/name=gpu-exporter"
CONTROLLER = "app.kubernetes.io/name=gpuquota-controller"
REMEDIATE = "app.kubernetes.io/name=gpuquota-remediate"
REMEDIATOR = "gpuquota.io/remediate"  # the reportingController of its Events
PDB_LABEL = {"gq-check": "pdb"}
REPO = Path(__file__).resolve().parent.parent


@dataclass
class Run(Results):
    args: argparse.Namespace
    core: client.CoreV1Api
    apps: client.AppsV1Api
    coord: client.CoordinationV1Api
    facts: dict[str, Any] = field(default_factory=dict)

    def record(self, check: str, ok: bool, detail: str = "", seconds: float | None = None) -> bool:
        return self.add(ok, detail, seconds, check=check)


def prom(run: Run, query: str) -> list[dict[str, Any]]:
    url = f"{run.args.prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.load(response)
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def gpuquota(run: Run, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUQUOTA_DB": run.args.db}
    return subprocess.run(
        [str(REPO / ".venv/bin/gpuquota"), *args], capture_output=True, text=True, env=env,
        timeout=120, check=False,
    )  # fmt: skip


def pods(run: Run, namespace: str, selector: str = "") -> list[Any]:
    items: list[Any] = run.core.list_namespaced_pod(namespace, label_selector=selector).items
    return items


def ready(pod: Any) -> bool:
    return pod.metadata.deletion_timestamp is None and any(
        c.type == "Ready" and c.status == "True" for c in pod.status.conditions or []
    )


def agent_pod(run: Run) -> Any:
    live = [p for p in pods(run, NS, AGENT) if p.metadata.deletion_timestamp is None]
    return live[0] if len(live) == 1 else None


def gpu_pod(
    name: str, tolerate: bool = False, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 2,
        "containers": [{
            "name": "work", "image": WORKLOAD, "imagePullPolicy": "Never",
            "resources": {"limits": {GPU: "1"}},
        }],
    }  # fmt: skip
    if tolerate:
        spec["tolerations"] = [{"key": TAINT, "operator": "Exists"}]
    meta = {"name": name, "labels": labels or {}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def kubectl(run: Run, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", f"--kubeconfig={run.args.kubeconfig}", *args], input=stdin,
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


# -- the checks ------------------------------------------------------------------------------


def check_guard(run: Run) -> None:
    out = subprocess.run(["iptables", "-L", "FORWARD", "1", "-n", "-v", "-x"],
                         capture_output=True, text=True, check=False).stdout  # fmt: skip
    ok = "gq-guard" in out and "DROP" in out
    drops = out.split()[0] if ok else "?"
    run.facts["guard_drops"] = drops
    run.record(
        "guard", ok, f"FORWARD #1 drops pod subnet -> outside; {drops} packets dropped so far"
    )


def check_ready(run: Run) -> None:
    def all_ready() -> list[str] | None:
        found = pods(run, NS)
        names = [p.metadata.name for p in found if ready(p)]
        return names if found and len(names) == len(found) and len(names) >= 3 else None

    names, took = poll(all_ready, 240, 2)
    detail = ", ".join(sorted(names)) if names else ", ".join(
        f"{p.metadata.name} {p.status.phase}{'' if ready(p) else ' not ready'}" for p in pods(run, NS)
    )  # fmt: skip
    run.record("pods-ready", bool(names), detail, took)


def targets(run: Run) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{run.args.prometheus}/api/v1/targets", timeout=10) as response:
        active: list[dict[str, Any]] = json.load(response)["data"]["activeTargets"]
    return active


def check_targets(run: Run) -> None:
    def up() -> list[dict[str, Any]] | None:
        found = targets(run)
        jobs = {t["labels"].get("job") for t in found}
        if {"gpu-exporter", "gpuquota-controller"} <= jobs and all(
            t["health"] == "up" for t in found
        ):
            return found
        return None

    found, took = poll(up, 120, 2)
    detail = "; ".join(f"{t['labels'].get('job')} {t['scrapeUrl']} {t['health']} {t.get('lastError', '')}"
                       for t in (found or targets(run)))  # fmt: skip
    run.record("targets-up", bool(found), detail, took)


def run_gpu_pod(
    run: Run, name: str, labels: dict[str, str] | None = None
) -> tuple[int, str, float] | str:
    """A one-GPU pod Running, its GPU busy at 80 %: (GPU index, UUID, seconds) or what failed."""
    with_ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": CHECKS_NS}}
    kubectl(run, "apply", "-f", "-", stdin=json.dumps(with_ns))
    try:
        run.core.create_namespaced_pod(CHECKS_NS, gpu_pod(name, labels=labels))
    except ApiException as error:
        if error.status != 409:
            raise
    pod, took = poll(lambda: (p := run.core.read_namespaced_pod(name, CHECKS_NS)).status.phase == "Running" and p, 120)  # fmt: skip
    if not pod:
        return f"{name} not Running"

    def device() -> str | None:
        for series in prom(run, "gpu_pod_info"):
            labels = series["metric"]
            if name in (labels.get("pod"), labels.get("exported_pod")):
                return str(labels["uuid"])
        return None

    uuid, took2 = poll(device, 90, 2)
    if not uuid:
        return f"{name} Running but no gpu_pod_info series"
    node = SimNode.attach(run.args.nvml_state)
    index = next(i for i in range(node.gpu_count) if node.uuid(i) == uuid)
    node.set(index, gpu_utilization_ratio=0.8)
    node.set_gpm(index, sm_activity=0.8)  # a whole GPU held by one pod: GPM SM activity counts
    node.close()
    return index, uuid, took + took2


def start_gpu_pod(run: Run) -> None:
    """gpu-a: one GPU, busy at 80 % (the stand-in's utilisation and GPM SM activity)."""
    got = run_gpu_pod(run, "gpu-a")
    if isinstance(got, str):
        run.record("gpu-pod-running", False, got)
        return
    index, uuid, took = got
    node = SimNode.attach(run.args.nvml_state)
    run.facts["serial"] = node.serial(index)
    node.close()
    run.record("gpu-pod-running", True, f"gpu-a on GPU {index} ({uuid}), busy at 80 %", took)


def check_labels(run: Run) -> None:
    """A GPU pod's series carry that pod's namespace and name, not the agent's."""

    def series() -> list[dict[str, str]] | None:
        found = [s["metric"] for s in prom(run, 'gpu_pod_info or gpu_pod_used_seconds_total')
                 if "gpu-a" in (s["metric"].get("pod"), s["metric"].get("exported_pod"))]  # fmt: skip
        return found or None

    found, took = poll(series, 60, 2)
    if not found:
        run.record("pod-labels", False, "no series of gpu-a in Prometheus", took)
        return
    bad = [s for s in found if s.get("namespace") != CHECKS_NS or s.get("pod") != "gpu-a"]
    sample = bad[0] if bad else found[0]
    shown = {k: sample.get(k) for k in ("__name__", "namespace", "pod", "exported_namespace", "exported_pod", "node")}  # fmt: skip
    run.record("pod-labels", not bad, f"{len(found)} series, {len(bad)} wrong; e.g. {shown}", took)


def check_ledger(run: Run) -> None:
    """The controller's usage ledger ingests gpu-a's used GPU-seconds from Prometheus."""
    query = (
        "SELECT coalesce(sum(w.used_gpu_seconds), 0) FROM usage_windows w "
        "JOIN usage_series s ON s.id = w.series_id WHERE s.holder_name = 'gpu-a' "
        f"AND s.namespace = '{CHECKS_NS}'"
    )

    def used() -> float | None:
        value = float(psql(run, query) or 0)
        return value if value > 0 else None

    value, took = poll(used, 240, 5)
    run.facts["ledger_used_s"] = value
    run.record("ledger-ingest", bool(value), f"usage_windows hold {value or 0:.1f} used GPU-seconds of gpu-a", took)  # fmt: skip


def psql(run: Run, query: str) -> str:
    from sqlalchemy import create_engine, text

    engine = create_engine(run.args.db)
    with engine.connect() as conn:
        row = conn.execute(text(query)).first()
    engine.dispose()
    return "" if row is None or row[0] is None else str(row[0])


def check_cronjob(run: Run) -> None:
    """The CronJob's Job, started by hand, writes a priced CSV matching the store's figures.

    The CronJob bills the previous month; this cluster's usage is this month's, so the Job is
    the CronJob's own template plus ``--now`` on the 1st of next month ('previous' = now)."""
    # gpu-a ends first and the ledger ingests past its end: a bill of open allocations and
    # windows not yet ingested changes by the second, and the two reports run seconds apart
    with contextlib.suppress(ApiException):
        run.core.delete_namespaced_pod("gpu-a", CHECKS_NS, grace_period_seconds=0)
    ended, _ = poll(lambda: psql(run, "SELECT max(ended_at) FROM allocations WHERE pod_name = 'gpu-a' AND ended_at IS NOT NULL"), 60, 1)  # fmt: skip
    if ended:
        poll(lambda: float(psql(run, "SELECT min(ingested_until) FROM ledger_progress") or 0) >= float(ended) + 60, 200, 5)  # fmt: skip
    now = dt.datetime.now(dt.UTC)
    first_next = (now.replace(day=1) + dt.timedelta(days=32)).replace(day=1).strftime("%Y-%m-%d")
    name = f"report-by-hand-{int(time.time())}"
    made = kubectl(run, "-n", NS, "create", "job", name, "--from=cronjob/gpuquota-report",
                   "--dry-run=client", "-o", "json")  # fmt: skip
    job = json.loads(made.stdout)
    job["spec"]["template"]["spec"]["containers"][0]["args"].append(f"--now={first_next}")
    start = time.monotonic()
    created = kubectl(run, "create", "-f", "-", stdin=json.dumps(job))
    if created.returncode != 0:
        run.record("report-cronjob", False, created.stderr.strip())
        return
    batch = client.BatchV1Api(run.core.api_client)

    def finished() -> str | None:
        status = batch.read_namespaced_job(name, NS).status
        return "ok" if status.succeeded else ("failed" if (status.failed or 0) >= 1 else None)

    state, _ = poll(finished, 180, 2)
    month = now.strftime("%Y-%m")
    path = Path(run.args.reports) / f"gpuquota-{month}.csv"
    took = time.monotonic() - start
    if state != "ok" or not path.is_file():
        logs = sorted(Path("/var/log/pods").glob(f"{NS}_{name}*/*/*.log"))
        tail = logs[-1].read_text()[-400:] if logs else "no log"
        run.record("report-cronjob", False, f"job {state}; {path} {'exists' if path.is_file() else 'missing'}; {tail}", took)  # fmt: skip
        return
    job_csv = path.read_text()
    # the same report on the host: the Job's own arguments, its environment's cluster name
    cluster = run.core.read_namespaced_config_map("gpuquota-controller", NS).data[
        "GPUQUOTA_CLUSTER"
    ]
    args = [a.replace("$(GPUQUOTA_CLUSTER)", cluster) for a in job["spec"]["template"]["spec"]["containers"][0]["args"]
            if not a.startswith(("--output", "--rate-card"))]  # fmt: skip
    ours = gpuquota(run, "report", *args, f"--rate-card={REPO / 'docs/examples/ratecard.yaml'}")
    rows = list(csv.DictReader(io.StringIO(job_csv)))
    mine = [r for r in rows if CHECKS_NS in r.values()]
    same = ours.returncode == 0 and ours.stdout == job_csv
    detail = (f"{path.name}: {len(rows)} rows, gq-checks {mine[0] if mine else 'missing'}; "
              f"{'identical to' if same else 'DIFFERS from'} `gpuquota report` on the store")  # fmt: skip
    run.record("report-cronjob", same and bool(mine), detail, took)


def fleet(run: Run, *args: str) -> dict[str, Any]:
    done = gpuquota(run, "gpus", "--json", *args)
    if done.returncode != 0:
        raise ValueError(f"gpuquota gpus {' '.join(args)}: exit {done.returncode}: {done.stderr.strip()[-300:]}")  # fmt: skip
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def check_fleet(run: Run) -> None:
    """`gpuquota gpus` names the node by its name; an agent restart records no move."""

    def nodes() -> list[str] | None:
        found = sorted(str(g["group"]) for g in fleet(run, "--by", "node")["groups"])
        return found or None

    found, took = poll(nodes, 240, 10)
    run.record("fleet-node-name", found == [run.args.node], f"gpus --by node: {found}", took)
    # the fleet history finds the GPUs that changed by the agent's counter: one series per GPU
    counters = [s["metric"] for s in prom(run, "gpu_history_changes_total")]
    per_gpu = sorted({(c.get("node"), c.get("uuid")) for c in counters})
    run.record("history-counter", len(counters) == len(per_gpu) == 8 and {n for n, _ in per_gpu} == {run.args.node},
               f"gpu_history_changes_total: {len(counters)} series, {len(per_gpu)} GPUs on nodes "
               f"{sorted({str(n) for n, _ in per_gpu})}")  # fmt: skip
    old = agent_pod(run)
    start = time.monotonic()
    if old is not None:
        run.core.delete_namespaced_pod(old.metadata.name, NS)
    back, _ = poll(lambda: (p := agent_pod(run)) and p.metadata.name != old.metadata.name and ready(p) and p, 120, 1)  # fmt: skip
    moved_ip = back and old is not None and back.status.pod_ip != old.status.pod_ip
    time.sleep(100)  # ledger windows of 1 min and their 20 s delay: the restart is in the store
    boards = fleet(run)["gpus"]
    placed = sorted({tuple(b["nodes"]) for b in boards})
    ok = bool(back) and len(boards) == 8 and placed == [(run.args.node,)]
    run.record("fleet-no-move", ok,
               f"agent back {'on a new IP' if moved_ip else 'on the same IP' if back else 'NOT back'}; "
               f"{len(boards)} boards, their nodes {placed}", time.monotonic() - start)  # fmt: skip


def used_of_gpu_a(run: Run) -> float:
    return float(psql(run, (
        "SELECT coalesce(sum(w.used_gpu_seconds), 0) FROM usage_windows w JOIN usage_series s "
        f"ON s.id = w.series_id WHERE s.holder_name = 'gpu-a' AND s.namespace = '{CHECKS_NS}'"
    )) or 0)  # fmt: skip


def take_over(run: Run, lease_name: str, selector: str) -> tuple[str, str | None, float, int]:
    """The Lease holder's pod killed (grace 0): (the old holder, the replica that held the Lease
    next or None, seconds until it did, the lease duration)."""
    lease = run.coord.read_namespaced_lease(lease_name, NS)
    leader = lease.spec.holder_identity
    duration = lease.spec.lease_duration_seconds or 15
    others = [p.metadata.name for p in pods(run, NS, selector) if ready(p) and p.metadata.name != leader]  # fmt: skip
    run.core.delete_namespaced_pod(leader, NS, grace_period_seconds=0)

    def new_leader() -> str | None:
        holder = run.coord.read_namespaced_lease(lease_name, NS).spec.holder_identity
        return holder if holder in others else None

    holder, took = poll(new_leader, duration + 30, 0.5)
    return leader, holder, took, duration


def check_leader(run: Run) -> None:
    """Two replicas: the leader's pod killed, the other leads within the lease; nothing
    counted twice (one allocation row for gpu-a; its used GPU-seconds at most its age)."""
    allocations = "SELECT count(*) FROM allocations WHERE pod_name = 'gpu-a'"
    alloc_before = psql(run, allocations)
    leader, holder, took, duration = take_over(run, "gpuquota-controller", CONTROLLER)
    time.sleep(100)  # the new leader ingests the ledger windows the old one may have begun
    alloc_after = psql(run, allocations)
    pod = run.core.read_namespaced_pod("gpu-a", CHECKS_NS)
    age = (dt.datetime.now(dt.UTC) - pod.status.start_time).total_seconds()
    used = used_of_gpu_a(run)
    ok = bool(holder) and took <= duration + 5 and alloc_before == alloc_after == "1" and 0 < used <= age  # fmt: skip
    run.record("leader-failover", ok,
               f"{leader} killed; {holder} leads after {took:.1f}s (lease {duration}s); gpu-a "
               f"allocation rows {alloc_before} -> {alloc_after}; its used GPU-seconds {used:.0f} "
               f"of {age:.0f} s alive at 80 %", took)  # fmt: skip


def check_remediate_leader(run: Run) -> None:
    """components/remediation's two replicas: one leads (the holder of the Lease
    gpuquota-remediate, the one replica whose gpuquota_remediation_leader is 1); its pod killed,
    the other holds the Lease within the lease duration."""

    def one_leads() -> tuple[str, list[str], list[str]] | None:
        holder = run.coord.read_namespaced_lease("gpuquota-remediate", NS).spec.holder_identity
        by_ip = {p.status.pod_ip: p.metadata.name for p in pods(run, NS, REMEDIATE) if ready(p)}

        def named(query: str) -> list[str]:
            return sorted(by_ip.get(s["metric"]["instance"].rsplit(":", 1)[0], s["metric"]["instance"])
                          for s in prom(run, query))  # fmt: skip

        leading, standing = named("gpuquota_remediation_leader == 1"), named("gpuquota_remediation_leader == 0")  # fmt: skip
        ok = len(by_ip) == 2 and leading == [holder] and len(standing) == 1 and standing[0] != holder  # fmt: skip
        return (holder, leading, standing) if ok else None

    seen, took0 = poll(one_leads, 120, 2)
    if not seen:
        leaders = [(s["metric"].get("instance"), s["value"][1]) for s in prom(run, "gpuquota_remediation_leader")]  # fmt: skip
        run.record("remediate-leader", False, f"not one leader: gpuquota_remediation_leader {leaders}", took0)  # fmt: skip
        return
    leader, holder, took, duration = take_over(run, "gpuquota-remediate", REMEDIATE)
    run.record("remediate-leader", bool(holder) and took <= duration + 5,
               f"Lease gpuquota-remediate held by {seen[0]}, the one replica with "
               f"gpuquota_remediation_leader 1 (standby {seen[2][0]}); {leader} killed, {holder} "
               f"holds it after {took:.1f}s (lease {duration}s)", took)  # fmt: skip


def check_rollout(run: Run) -> None:
    """GPU pods created while the agent rolls out are admitted; none UnexpectedAdmissionError."""
    start = time.monotonic()
    kubectl(run, "-n", NS, "rollout", "restart", "ds/gpu-exporter")
    made = []
    for n in range(6):
        name = f"roll-{n}"
        run.core.create_namespaced_pod(CHECKS_NS, gpu_pod(name))
        made.append(name)
        time.sleep(2)
    done = kubectl(run, "-n", NS, "rollout", "status", "ds/gpu-exporter", "--timeout=120s")

    def settled() -> dict[str, str] | None:
        states = {}
        for name in made:
            pod = run.core.read_namespaced_pod(name, CHECKS_NS)
            states[name] = pod.status.reason or pod.status.phase
        return states if all(s in ("Running", "Failed", "UnexpectedAdmissionError") for s in states.values()) else None  # fmt: skip

    states, _ = poll(settled, 120, 1)
    bad = {k: v for k, v in (states or {}).items() if v != "Running"}
    run.record("rollout-admission", done.returncode == 0 and states is not None and not bad,
               f"{len(made)} pods during the rollout: {states}", time.monotonic() - start)  # fmt: skip
    for name in made:
        with contextlib.suppress(ApiException):
            run.core.delete_namespaced_pod(name, CHECKS_NS, grace_period_seconds=0)


def check_token(run: Run) -> None:
    """The agent's token is refused what docs/operations.md says it cannot do."""
    agent = agent_pod(run)
    made = kubectl(run, "-n", NS, "create", "token", "gpu-exporter", "--bound-object-kind=Pod",
                   f"--bound-object-name={agent.metadata.name}",
                   f"--bound-object-uid={agent.metadata.uid}", "--duration=10m")  # fmt: skip
    token = made.stdout.strip()
    # a second Node (never Ready, nothing runs there) to try another node's taint on
    other = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gq-other"}}
    kubectl(run, "apply", "-f", "-", stdin=json.dumps(other))
    taint = json.dumps({"spec": {"taints": [{"key": TAINT, "effect": "NoSchedule"}]}})
    label = json.dumps({"metadata": {"labels": {"gq-check": "x"}}})
    attempts = {
        "read Secrets": ["-n", NS, "get", "secrets"],
        # issue 35: the agent names pods from its node (pod-resources, the device checkpoint)
        "list Pods": ["get", "pods", "--all-namespaces"],
        "get its own Pod": ["-n", NS, "get", "pod", agent.metadata.name],
        "create a Pod": ["-n", NS, "run", "gq-x", f"--image={WORKLOAD}", "--restart=Never"],
        "taint another Node": ["patch", "node", "gq-other", "-p", taint],
        "label its own Node": ["patch", "node", run.args.node, "-p", label],
        "create a Node": ["create", "-f", "-"],
        "delete its own Node": ["delete", "node", run.args.node, "--dry-run=server"],
    }
    refused, allowed = [], []
    for what, argv in attempts.items():
        stdin = json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gq-new"}}) if what == "create a Node" else None  # fmt: skip
        done = subprocess.run(
            ["kubectl", "--server=https://127.0.0.1:6443", f"--certificate-authority={run.args.work}/pki/ca.crt",
             f"--token={token}", *argv], input=stdin, capture_output=True, text=True, check=False,
        )  # fmt: skip
        (refused if done.returncode != 0 and ("forbidden" in done.stderr.lower() or "denied" in done.stderr.lower()) else allowed).append(what)  # fmt: skip
    kubectl(run, "delete", "node", "gq-other", "gq-new", "--ignore-not-found")
    run.record("agent-token", bool(token) and not allowed,
               f"refused: {', '.join(refused)}; allowed: {', '.join(allowed) or 'nothing'}")  # fmt: skip


def check_fence(run: Run) -> None:
    """Three GPU pods before any fence: gpu-p (a PodDisruptionBudget allows it no disruption),
    gpu-f and gpu-d. XID 79 on gpu-p's GPU: the pod's device status, the Node's taint and
    condition; then the agent pod deleted while fenced: a new agent Running on the node within
    60 s, fence held. The remediation checks after this one use the three pods."""
    kubectl(run, "apply", "-f", "-", stdin=json.dumps(
        {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
         "metadata": {"name": "gpu-p", "namespace": CHECKS_NS},
         "spec": {"maxUnavailable": 0, "selector": {"matchLabels": PDB_LABEL}}}))  # fmt: skip
    gpus = run.facts.setdefault("gpus", {})
    for name, labels in (("gpu-p", PDB_LABEL), ("gpu-f", None), ("gpu-d", None)):
        got = run_gpu_pod(run, name, labels)
        if isinstance(got, str):
            run.record("xid79-fence", False, got)
            return
        gpus[name] = got[0]
    node = SimNode.attach(run.args.nvml_state)
    start = time.monotonic()
    node.inject_xid(gpus["gpu-p"], 79)
    node.close()

    def unhealthy() -> bool:
        pod = run.core.read_namespaced_pod("gpu-p", CHECKS_NS)
        for status in pod.status.container_statuses or []:
            for res in status.allocated_resources_status or []:
                if any(r.health == "Unhealthy" for r in res.resources or []):
                    return True
        return False

    def fenced() -> tuple[bool, bool] | None:
        n = run.core.read_node(run.args.node)
        taint = any(t.key == TAINT for t in n.spec.taints or [])
        cond = any(
            c.type == "GPUUnhealthy" and c.status == "True" for c in n.status.conditions or []
        )
        return (taint, cond) if taint and cond else None

    bad, t1 = poll(unhealthy, 30, 0.2)
    fence, t2 = poll(fenced, 30, 0.2)
    run.facts["fenced_at"] = {"gpu-p": time.time()}
    run.record("xid79-fence", bool(bad) and bool(fence),
               f"XID 79 on gpu-p's GPU {gpus['gpu-p']}: pod allocatedResourcesStatus Unhealthy "
               f"after {t1:.1f}s; taint+condition after {t2:.1f}s", time.monotonic() - start)  # fmt: skip
    old = agent_pod(run)
    start = time.monotonic()
    run.core.delete_namespaced_pod(old.metadata.name, NS)

    def back() -> Any:
        pod = agent_pod(run)
        return pod if pod and pod.metadata.name != old.metadata.name and pod.status.phase == "Running" else None  # fmt: skip

    new, took = poll(back, 60, 0.5)
    held = fenced()
    pending = [f"{p.metadata.name} {p.status.phase}" for p in pods(run, NS, AGENT)]
    run.record("fenced-agent-restart", bool(new) and bool(held),
               f"new agent {'Running' if new else 'NOT Running'} ({', '.join(pending)}); fence {'held' if held else 'gone'}", took)  # fmt: skip


# -- gpuquota remediate (components/remediation: --condition --evict --evict-after=20s, at most
# one eviction per 10 min across the cluster) ------------------------------------------------


def gpu_index(run: Run, pod: str) -> int:
    """The stand-in's index of the GPU a pod of gq-checks holds (gpu_pod_info names its UUID),
    so each remediation check also runs on its own (`check remediate-dry-run`)."""
    if pod in run.facts.get("gpus", {}):
        return int(run.facts["gpus"][pod])
    uuid = next(s["metric"]["uuid"] for s in prom(run, f'gpu_pod_info{{pod="{pod}"}}'))
    node = SimNode.attach(run.args.nvml_state)
    try:
        return next(i for i in range(node.gpu_count) if node.uuid(i) == uuid)
    finally:
        node.close()


def rows(run: Run, query: str, db: str | None = None) -> list[tuple[Any, ...]]:
    from sqlalchemy import create_engine, text

    engine = create_engine(db or run.args.db)
    with engine.connect() as conn:
        found = [tuple(r) for r in conn.execute(text(query))]
    engine.dispose()
    return found


def acts(run: Run, pod: str, db: str | None = None) -> list[tuple[str, str]]:
    """(action, result) of the store's remediation rows for a pod of gq-checks, oldest first."""
    return [(str(a), str(r)) for a, r in rows(run, (
        "SELECT action, result FROM remediation_actions WHERE namespace = 'gq-checks' "
        f"AND pod = '{pod}' ORDER BY id"), db)]  # fmt: skip


def condition(run: Run, pod: str) -> str | None:
    """The pod's GPUUnhealthy condition status; None without one (or without the pod)."""
    found = run.core.read_namespaced_pod(pod, CHECKS_NS)
    return next((c.status for c in found.status.conditions or [] if c.type == "GPUUnhealthy"), None)  # fmt: skip


def events(run: Run) -> list[dict[str, Any]]:
    """The Events gpuquota remediate wrote in gq-checks (events.k8s.io/v1), as the server
    sends them (the official client's model refuses the kubelet's Events there: they have no
    eventTime)."""
    listed = kubectl(run, "-n", CHECKS_NS, "get", "events.v1.events.k8s.io", "-o", "json")
    found: list[dict[str, Any]] = json.loads(listed.stdout)["items"]
    return [e for e in found if e.get("reportingController") == REMEDIATOR]


def reasons(run: Run, pod: str) -> list[str]:
    return sorted({e["reason"] for e in events(run) if (e.get("regarding") or {}).get("name") == pod})  # fmt: skip


def policy(run: Run) -> client.PolicyV1Api:
    return client.PolicyV1Api(run.core.api_client)


def check_remediate_pdb(run: Run) -> None:
    """gpu-p, fenced by the XID 79 above, behind a PodDisruptionBudget that allows no
    disruption: marked (pod condition), its eviction refused by the real Eviction API (429):
    a blocked_by_pdb row and a GPUEvictionBlocked Event, nothing evicted."""
    start = time.monotonic()
    uid = run.core.read_namespaced_pod("gpu-p", CHECKS_NS).metadata.uid
    blocked, took = poll(lambda: ("evict", "blocked_by_pdb") in acts(run, "gpu-p"), 120, 2)
    pod = run.core.read_namespaced_pod("gpu-p", CHECKS_NS)
    kept = pod.metadata.uid == uid and pod.metadata.deletion_timestamp is None and pod.status.phase == "Running"  # fmt: skip
    budget = policy(run).read_namespaced_pod_disruption_budget("gpu-p", CHECKS_NS).status
    found, said = acts(run, "gpu-p"), reasons(run, "gpu-p")
    ok = bool(blocked) and kept and condition(run, "gpu-p") == "True" and ("condition", "marked") in found \
        and "GPUEvictionBlocked" in said and ("evict", "evicted") not in found and not budget.disrupted_pods  # fmt: skip
    run.record("remediate-pdb", ok,
               f"gpu-p rows {found}; Events {said}; condition GPUUnhealthy={condition(run, 'gpu-p')}; "
               f"pod {'still Running, same UID' if kept else 'GONE or changed'}; PDB disruptionsAllowed "
               f"{budget.disruptions_allowed}, disruptedPods {budget.disrupted_pods or {}}; "
               f"blocked after {took:.0f}s", time.monotonic() - start)  # fmt: skip


def check_remediate_evict(run: Run) -> None:
    """XID 79 on gpu-f's GPU: gpu-f marked, then evicted through the real Eviction API (the
    budget's one place); a row in the store, Events on the pod, and `gpuquota gpus --serial S`
    lists it after the board."""
    index = gpu_index(run, "gpu-f")
    node = SimNode.attach(run.args.nvml_state)
    serial = node.serial(index)
    start = time.monotonic()
    node.inject_xid(index, 79)
    node.close()
    marked, t1 = poll(lambda: condition(run, "gpu-f") == "True", 45, 0.5)

    def gone() -> bool:
        try:
            pod = run.core.read_namespaced_pod("gpu-f", CHECKS_NS)
        except ApiException as error:
            return error.status == 404
        return pod.metadata.deletion_timestamp is not None

    evicted, t2 = poll(lambda: ("evict", "evicted") in acts(run, "gpu-f") and gone(), 120, 1)
    said = reasons(run, "gpu-f")
    board = fleet(run, "--serial", serial)["gpus"]
    listed = [(a["action"], a["result"]) for b in board for a in b.get("pod_actions") or [] if a["pod"] == "gpu-f"]  # fmt: skip
    ok = bool(marked) and bool(evicted) and {"GPUUnhealthy", "GPUEvicted"} <= set(said) and ("evict", "evicted") in listed  # fmt: skip
    run.record("remediate-evict", ok,
               f"XID 79 on GPU {index} (serial {serial}): gpu-f GPUUnhealthy=True after {t1:.1f}s, "
               f"evicted and gone after {t2:.1f}s more; rows {acts(run, 'gpu-f')}; Events {said}; "
               f"gpus --serial {serial} lists {listed}", time.monotonic() - start)  # fmt: skip


def world(run: Run) -> dict[str, Any]:
    """What a dry run must leave as it is: the pods, the budget, the Events, the real store."""
    found: dict[str, Any] = {}
    for name in ("gpu-p", "gpu-d"):
        pod = run.core.read_namespaced_pod(name, CHECKS_NS)
        found[name] = (pod.metadata.uid, pod.metadata.deletion_timestamp, pod.status.phase,
                       sorted(c.type for c in pod.status.conditions or []))  # fmt: skip
    budget = policy(run).read_namespaced_pod_disruption_budget("gpu-p", CHECKS_NS).status
    found["pdb"] = (budget.disruptions_allowed, budget.disrupted_pods)
    found["events"] = sorted(e["metadata"]["name"] for e in events(run))
    found["store"] = rows(run, "SELECT id, action, result, pod FROM remediation_actions WHERE result <> 'evicting' ORDER BY id")  # fmt: skip
    return found


def raw(
    run: Run,
    token: str,
    method: str,
    path: str,
    body: Any,
    query: str = "dryRun=All",
    content_type: str = "application/json",
) -> tuple[int, Any]:
    """One request as gpuquota-remediate's ServiceAccount: (HTTP status, body)."""
    import ssl

    request = urllib.request.Request(
        f"https://127.0.0.1:6443{path}?{query}", data=json.dumps(body).encode(), method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": content_type},
    )  # fmt: skip
    context = ssl.create_default_context(cafile=f"{run.args.work}/pki/ca.crt")
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def probes(run: Run, token: str) -> dict[str, tuple[int, Any]]:
    """The real server's answers to the dry-run requests gpuquota remediate makes, and to
    the ones tests/remediation/test_dry_run.py asks the stand-in (all dryRun: none changes
    anything), as the component's ServiceAccount: for docs/real-cluster.md and sim/apiserver."""
    uid = {p: run.core.read_namespaced_pod(p, CHECKS_NS).metadata.uid for p in ("gpu-d", "gpu-p")}

    def eviction(pod: str, uid: str | None, **options: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction",
                                "metadata": {"name": pod, "namespace": CHECKS_NS}}  # fmt: skip
        if uid or options:
            body["deleteOptions"] = {**({"preconditions": {"uid": uid}} if uid else {}), **options}
        return body

    def status(uid: str) -> dict[str, Any]:
        return {"metadata": {"uid": uid}, "status": {"conditions": [
            {"type": "GPUUnhealthy", "status": "True", "reason": "GPUNeedsReboot", "message": "probe"}]}}  # fmt: skip

    wrong = "00000000-0000-0000-0000-000000000000"
    dry = "dryRun=All"
    asks = [
        ("evict gpu-d (no PDB)", "gpu-d/eviction", eviction("gpu-d", uid["gpu-d"]), dry),
        ("evict gpu-p (PDB maxUnavailable 0)", "gpu-p/eviction", eviction("gpu-p", uid["gpu-p"]), dry),
        ("evict gpu-d, no preconditions.uid", "gpu-d/eviction", eviction("gpu-d", None), dry),
        ("evict gpu-d, a wrong uid", "gpu-d/eviction", eviction("gpu-d", wrong), dry),
        ("evict gpu-d, deleteOptions.dryRun [Other]", "gpu-d/eviction",
         eviction("gpu-d", uid["gpu-d"], dryRun=["Other"]), dry),
        ("patch gpu-d status", "gpu-d/status", status(uid["gpu-d"]), dry),
        ("patch gpu-d status, a wrong uid", "gpu-d/status", status(wrong), dry),
        ("patch gpu-d status, dryRun=Some", "gpu-d/status", status(uid["gpu-d"]), "dryRun=Some"),
    ]  # fmt: skip
    return {
        what: raw(run, token, "PATCH" if path.endswith("/status") else "POST",
                  f"/api/v1/namespaces/{CHECKS_NS}/pods/{path}", body, query,
                  "application/strategic-merge-patch+json" if path.endswith("/status") else "application/json")
        for what, path, body, query in asks
    }  # fmt: skip


def check_remediate_dry_run(run: Run) -> None:
    """XID 79 on gpu-d's GPU: the real remediate marks it but its budget (one per 10 min, spent
    on gpu-f) keeps it. A second instance on the host, as the component's ServiceAccount, with
    --dry-run, the component's --lease-name (so it elects through gpuquota-remediate-dry-run, as
    the component's Role allows) and its own store: the real server's dryRun=All answers
    recorded (gpu-d would be evicted, gpu-p's budget refuses), nothing changed in the cluster."""
    index = gpu_index(run, "gpu-d")
    node = SimNode.attach(run.args.nvml_state)
    node.inject_xid(index, 79)
    node.close()
    poll(lambda: condition(run, "gpu-d") == "True", 45, 0.5)
    time.sleep(35)  # past --evict-after and a round: the real one has decided and waits
    waiting = ("evict", "evicted") not in acts(run, "gpu-d")
    work = Path(run.args.work)
    # the component's Lease name: a dry run elects through "<name>-dry-run", which the
    # component's Role grants beside the real one (docs/health.md, "A dry run beside the real one")
    lease = "gpuquota-remediate"
    token = kubectl(run, "-n", NS, "create", "token", "gpuquota-remediate", "--duration=10m").stdout.strip()  # fmt: skip
    kubeconfig = work / "dry-run.kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "dry",
        "clusters": [{"name": "gq", "cluster": {"server": "https://127.0.0.1:6443",
                                                 "certificate-authority": f"{work}/pki/ca.crt"}}],
        "users": [{"name": "remediate", "user": {"token": token}}],
        "contexts": [{"name": "dry", "context": {"cluster": "gq", "user": "remediate"}}],
    }))  # fmt: skip
    db = f"sqlite:///{work}/dry-run.db"
    upgraded = gpuquota(run, "db", "upgrade", f"--db={db}")
    before = world(run)
    start = time.monotonic()
    done = gpuquota(run, "remediate", f"--kubeconfig={kubeconfig}", f"--db={db}", "--cluster=dry-run",
                    "--condition", "--evict", "--dry-run", "--evict-after=1s", "--evict-max=10",
                    "--once", f"--lease-name={lease}", f"--lease-namespace={NS}",
                    "--identity=dry-run-on-host", "--metrics-port=0")  # fmt: skip
    took = time.monotonic() - start
    (work / "log").mkdir(exist_ok=True)
    (work / "log" / "remediate-dry-run.log").write_text(done.stdout + done.stderr)
    said = [line.split("dry run: ", 1)[1][:90] for line in (done.stdout + done.stderr).splitlines() if "dry run: " in line]  # fmt: skip
    dry = {pod: acts(run, pod, db) for pod in ("gpu-d", "gpu-p")}
    time.sleep(3)  # anything it had changed would show by now
    after = world(run)
    # the real server's answers to the same requests, for docs/real-cluster.md and sim/apiserver
    run.facts["dry_run_answers"] = probes(run, token)
    codes = {k: v[0] for k, v in run.facts["dry_run_answers"].items()}
    unchanged = before == after and world(run) == before
    ok = upgraded.returncode == 0 and done.returncode == 0 and waiting and ("evict", "dry_run") in dry["gpu-d"] \
        and ("evict", "dry_run_blocked") in dry["gpu-p"] and unchanged  # fmt: skip
    changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
    run.record("remediate-dry-run", ok,
               f"real one {'waits (budget spent)' if waiting else 'EVICTED gpu-d'}; dry run exit "
               f"{done.returncode}, its rows {dry}; it said {said}; cluster and real store "
               f"{'unchanged' if unchanged else f'CHANGED {changed}'}; the same requests by hand: {codes}"
               + ("" if done.returncode == 0 else f"; {done.stderr.strip()[-300:]}"), took)  # fmt: skip


CHECKS: dict[str, Callable[[Run], None]] = {
    "guard": check_guard,
    "ready": check_ready,
    "targets": check_targets,
    "gpu-pod": start_gpu_pod,
    "labels": check_labels,
    "ledger": check_ledger,
    "fleet": check_fleet,
    "leader": check_leader,
    "remediate-leader": check_remediate_leader,
    "rollout": check_rollout,
    "token": check_token,
    "cronjob": check_cronjob,
    "fence": check_fence,
    "remediate-pdb": check_remediate_pdb,
    "remediate-evict": check_remediate_evict,
    "remediate-dry-run": check_remediate_dry_run,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", required=True)
    parser.add_argument("--node", required=True)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--prometheus", required=True)
    parser.add_argument("--db", required=True, help="the store's URL from the host")
    parser.add_argument("--nvml-state", required=True)
    parser.add_argument("--reports", required=True, help="the reports volume's host folder")
    parser.add_argument("checks", nargs="*", help=f"some of {', '.join(CHECKS)} (default all)")
    args = parser.parse_args(argv)
    unknown = [c for c in args.checks if c not in CHECKS]
    if unknown:
        parser.error(f"unknown checks {unknown}; choose from {list(CHECKS)}")
    api = config.new_client_from_config(args.kubeconfig)
    run = Run(args, client.CoreV1Api(api), client.AppsV1Api(api), client.CoordinationV1Api(api))
    started = time.monotonic()
    for name in args.checks or list(CHECKS):
        t0 = time.monotonic()
        try:
            CHECKS[name](run)
        except Exception as error:  # one check's surprise must not hide the others' results
            run.record(name, False, f"{type(error).__name__}: {error}", time.monotonic() - t0)
    if not args.checks or "guard" in args.checks:
        check_guard(run)
    failed = [r for r in run.results if not r["ok"]]
    out = Path(args.work) / "results.json"
    # results.json is the latest run; results-<time>.json keeps each
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    (Path(args.work) / f"results-{stamp}.json").write_text(json.dumps({"results": run.results}, indent=1, default=str))  # fmt: skip
    out.write_text(json.dumps({"results": run.results, "facts": run.facts,
                               "seconds": time.monotonic() - started}, indent=1, default=str))  # fmt: skip
    print(f"{len(run.results) - len(failed)} of {len(run.results)} checks passed; {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
