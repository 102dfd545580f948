"""Two `gpuquota remediate` replicas against the kube-apiserver stand-in, electing through a
coordination.k8s.io Lease as the controller's replicas do: only the holder acts; when it is
killed, the other takes the Lease once it is not renewed for --lease-duration, and acts
from what the store says (the fleet-wide budget the first one spent, the pods it marked),
so no action is done twice."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpuquota.sim.harness import stop_process, wait_for
from tests.remediation.cluster import T0, Cluster, conditions, events, rows, uuid_of

LEASE = ("gpuquota", "gpuquota-remediate")
DURATION, RETRY = 4, 1


def replica(cluster: Cluster, tmp_path: Path, identity: str, *extra: str) -> subprocess.Popen[Any]:
    log = (tmp_path / f"{identity}.log").open("w")
    return subprocess.Popen(
        [sys.executable, "-m", "gpuquota.quota.cli", "remediate",
         f"--kubeconfig={tmp_path / 'kubeconfig'}", f"--db={cluster.db_url}", "--cluster=test",
         "--metrics-port=0", "--condition", "--evict", "--evict-max=1", "--evict-window=1h",
         "--evict-after=100ms", "--interval=200ms",
         f"--lease-name={LEASE[1]}", f"--lease-namespace={LEASE[0]}", f"--identity={identity}",
         f"--lease-duration={DURATION}", "--renew-deadline=3", f"--retry-period={RETRY}",
         *extra],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip


def holder(cluster: Cluster, name: str = LEASE[1]) -> str | None:
    lease = cluster.server.get("leases", name, LEASE[0])
    return None if lease is None else (lease.get("spec") or {}).get("holderIdentity")


def reporters(cluster: Cluster) -> dict[str, str]:
    """pod -> the replica that wrote each Event on it (its reportingInstance)."""
    found: dict[str, set[str]] = {}
    for e in events(cluster.server, "ml"):
        found.setdefault(e["regarding"]["name"], set()).add(e["reportingInstance"])
    assert all(len(v) == 1 for v in found.values()), found
    return {pod: next(iter(v)) for pod, v in found.items()}


def test_only_the_lease_holder_acts_and_a_successor_does_nothing_twice(
    cluster: Cluster, tmp_path: Path
) -> None:
    for i in range(20):  # three of them fenced at most: the breaker stays closed
        cluster.add_node(f"node-{i}")
    cluster.add_pod("ml", "one", "node-0", {uuid_of("node-0", 0): "Unhealthy"})
    cluster.add_pod("ml", "two", "node-1", {uuid_of("node-1", 0): "Unhealthy"})
    cluster.add_pod("kube-system", "static", "node-0", {uuid_of("node-0", 1): "Unhealthy"},
                    annotations={"kubernetes.io/config.mirror": "x"})  # never touched  # fmt: skip
    cluster.agents["node-0"].xid(0, 79, at=T0 + 1)  # oldest first: "one" is evicted
    cluster.agents["node-0"].xid(1, 79, at=T0 + 1)
    cluster.agents["node-1"].xid(0, 79, at=T0 + 2)
    procs = {name: replica(cluster, tmp_path, name) for name in ("a", "b")}
    logs = lambda: {n: (tmp_path / f"{n}.log").read_text() for n in procs}  # noqa: E731
    try:
        wait_for(
            lambda: (
                cluster.server.get("pods", "one", "ml") is None
                and conditions(cluster.server, "ml", "two").get("GPUUnhealthy") == "True"
            ),
            timeout=60,
            what="the leader's first rounds",
        )
        time.sleep(1.0)  # rounds go on: the budget (1 per hour) holds "two" back
        leader = holder(cluster)
        assert leader in procs, leader
        standby = next(n for n in procs if n != leader)
        assert procs[standby].poll() is None, logs()[standby]
        assert set(reporters(cluster).values()) == {leader}  # the standby wrote nothing
        assert cluster.server.get("pods", "two", "ml") is not None
        # the leader dies without a word; the standby takes over within the Lease's duration
        procs[leader].kill()
        killed = time.monotonic()
        wait_for(lambda: holder(cluster) == standby, timeout=30, what="a takeover")
        assert time.monotonic() - killed <= DURATION + 2 * RETRY + 2
        # the new leader acts: a GPU fenced now gets its pod marked ...
        cluster.add_pod("ml", "three", "node-2", {uuid_of("node-2", 0): "Unhealthy"})
        cluster.agents["node-2"].xid(0, 79, at=T0 + 3)
        wait_for(
            lambda: conditions(cluster.server, "ml", "three").get("GPUUnhealthy") == "True",
            timeout=30,
            what="the new leader's rounds",
        )
        time.sleep(1.0)
        # ... but the budget the first one spent still holds, and "two" is not marked again
        assert cluster.server.get("pods", "two", "ml") is not None
        assert cluster.server.get("pods", "three", "ml") is not None
    finally:
        for proc in procs.values():
            stop_process(proc)
        print(logs())  # pytest shows it when the test fails
    assert reporters(cluster) == {"one": leader, "two": leader, "three": standby}
    acts = [r for r in rows(cluster) if r[0] != "breaker"]
    assert sorted(acts) == sorted([
        ("condition", "marked", "one"), ("evict", "evicted", "one"),
        ("condition", "gone", "one"),  # the marked pod was evicted: nothing to clear
        ("condition", "marked", "two"), ("condition", "marked", "three"),
        ("evict", "refused", "static"),  # once: the successor read it from the store
    ]), acts  # fmt: skip


def test_a_dry_run_beside_the_replicas_elects_through_a_lease_of_its_own(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A preview started with the replicas' --lease-name never takes their turn: it holds the
    Lease <name>-dry-run while the real leader holds its own and acts."""
    for i in range(10):
        cluster.add_node(f"node-{i}")
    cluster.add_pod("ml", "one", "node-0", {uuid_of("node-0", 0): "Unhealthy"})
    cluster.add_pod("ml", "two", "node-1", {uuid_of("node-1", 0): "Unhealthy"})
    cluster.agents["node-0"].xid(0, 79, at=T0 + 1)
    cluster.agents["node-1"].xid(0, 79, at=T0 + 2)
    dry = replica(cluster, tmp_path, "preview", "--dry-run")
    try:  # the preview first: were it the same Lease, it would hold it and the real one wait
        wait_for(lambda: holder(cluster, f"{LEASE[1]}-dry-run") == "preview", timeout=30,
                 what="the preview's Lease")  # fmt: skip
        real = replica(cluster, tmp_path, "a")
        try:
            wait_for(lambda: cluster.server.get("pods", "one", "ml") is None, timeout=30,
                     what="the real leader's eviction")  # fmt: skip
            assert holder(cluster) == "a"
            assert holder(cluster, f"{LEASE[1]}-dry-run") == "preview"
        finally:
            stop_process(real)
    finally:
        stop_process(dry)
        print({n: (tmp_path / f"{n}.log").read_text() for n in ("preview", "a")})
    assert "the Lease gpuquota/gpuquota-remediate-dry-run" in (tmp_path / "preview.log").read_text()
    assert set(reporters(cluster).values()) == {"a"}  # the preview wrote no Event
    assert ("evict", "dry_run", "one") in rows(cluster)


def test_a_leader_that_cannot_renew_stops_and_exits(cluster: Cluster, tmp_path: Path) -> None:
    """The API server unreachable past --renew-deadline: the leader stops acting and exits 1
    (restarted, it is a standby), never acting on beside a successor."""
    cluster.add_node("node-0")
    proc = replica(cluster, tmp_path, "a")
    try:
        wait_for(lambda: holder(cluster) == "a", timeout=30, what="the Lease taken")
        cluster.server.refuse_for(8.0)
        assert proc.wait(30) == 1
    finally:
        stop_process(proc)
    assert "lost the lease gpuquota/gpuquota-remediate" in (tmp_path / "a.log").read_text()
