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


def gpu_pod(name: str, tolerate: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 2,
        "containers": [{
            "name": "work", "image": WORKLOAD, "imagePullPolicy": "Never",
            "resources": {"limits": {GPU: "1"}},
        }],
    }  # fmt: skip
    if tolerate:
        spec["tolerations"] = [{"key": TAINT, "operator": "Exists"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


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


def run_gpu_pod(run: Run, name: str) -> tuple[int, str, float] | str:
    """A one-GPU pod Running, its GPU busy at 80 %: (GPU index, UUID, seconds) or what failed."""
    with_ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": CHECKS_NS}}
    kubectl(run, "apply", "-f", "-", stdin=json.dumps(with_ns))
    try:
        run.core.create_namespaced_pod(CHECKS_NS, gpu_pod(name))
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


def check_leader(run: Run) -> None:
    """Two replicas: the leader's pod killed, the other leads within the lease; nothing
    counted twice (one allocation row for gpu-a; its used GPU-seconds at most its age)."""
    lease = run.coord.read_namespaced_lease("gpuquota-controller", NS)
    leader = lease.spec.holder_identity
    duration = lease.spec.lease_duration_seconds or 15
    names = [p.metadata.name for p in pods(run, NS, CONTROLLER) if ready(p)]
    allocations = "SELECT count(*) FROM allocations WHERE pod_name = 'gpu-a'"
    alloc_before = psql(run, allocations)
    run.core.delete_namespaced_pod(leader, NS, grace_period_seconds=0)
    others = [n for n in names if n != leader]

    def new_leader() -> str | None:
        holder = run.coord.read_namespaced_lease("gpuquota-controller", NS).spec.holder_identity
        return holder if holder in others else None

    holder, took = poll(new_leader, duration + 30, 0.5)
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
    """XID 79 on gpu-a's GPU: the pod's device status, the Node's taint and condition; then the
    agent pod deleted while fenced: a new agent Running on the node within 60 s, fence held."""
    got = run_gpu_pod(run, "gpu-f")
    if isinstance(got, str):
        run.record("xid79-fence", False, got)
        return
    index = got[0]
    node = SimNode.attach(run.args.nvml_state)
    start = time.monotonic()
    node.inject_xid(index, 79)
    node.close()

    def unhealthy() -> bool:
        pod = run.core.read_namespaced_pod("gpu-f", CHECKS_NS)
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
    run.record("xid79-fence", bool(bad) and bool(fence),
               f"pod allocatedResourcesStatus Unhealthy after {t1:.1f}s; taint+condition after {t2:.1f}s",
               time.monotonic() - start)  # fmt: skip
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


CHECKS: dict[str, Callable[[Run], None]] = {
    "guard": check_guard,
    "ready": check_ready,
    "targets": check_targets,
    "gpu-pod": start_gpu_pod,
    "labels": check_labels,
    "ledger": check_ledger,
    "fleet": check_fleet,
    "leader": check_leader,
    "rollout": check_rollout,
    "token": check_token,
    "cronjob": check_cronjob,
    "fence": check_fence,
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
