"""Central pod remediation against the kube-apiserver stand-in over a real socket (issue 35):
the node agents' own code publishes the verdicts, `gpuquota remediate`'s Remediator reads them
and the pods' allocatedResourcesStatus, and acts within a budget kept in the store."""

from __future__ import annotations

import pytest

from gpuquota.quota.remediation.record import Act
from gpuquota.quota.remediation.rules import trouble_of
from gpuquota.quota.remediation.verdicts import read_verdicts
from tests.remediation.cluster import T0, Cluster, conditions, events, rows, uuid_of

UNHEALTHY, HEALTHY = "Unhealthy", "Healthy"


# -- the pod object decides, not its name ------------------------------------------------------


def test_a_pod_recreated_elsewhere_is_never_evicted_or_marked_for_the_old_pods_gpu(
    cluster: Cluster,
) -> None:
    a = cluster.add_node("node-a")
    cluster.add_node("node-b")
    bad = uuid_of("node-a", 0)
    old = cluster.add_pod("ml", "train-0", "node-a", {bad: HEALTHY}, uid="uid-old")
    a.xid(0, 79)  # fell off the bus: reboot; the kubelet marks the device Unhealthy
    old["status"]["containerStatuses"][0]["allocatedResourcesStatus"][0]["resources"][0][
        "health"
    ] = UNHEALTHY
    cluster.server.apply("MODIFIED", old)
    clock = [T0 + 120]
    fix = cluster.remediator(clock, condition=True, evict=True, after_s=60, max_evictions=5)
    # the decision, from the pods as listed: train-0 holds the fenced GPU
    nodes, _ = cluster.kube.list("Node")
    verdicts = read_verdicts(nodes, [])
    trouble = trouble_of(cluster.server.get("pods", "train-0", "ml") or {}, verdicts, {})
    assert trouble is not None and (trouble.uid, trouble.node) == ("uid-old", "node-a")
    # ...then the StatefulSet's pod is recreated under the same name on a healthy node
    cluster.delete_pod("ml", "train-0")
    cluster.add_pod("ml", "train-0", "node-b", {uuid_of("node-b", 1): HEALTHY}, uid="uid-new")
    fix._evictions({trouble.uid: trouble}, {})  # the stale decision acts: it must not
    fix._conditions({trouble.uid: trouble}, {}, fix.ledger.marked())
    assert cluster.server.get("pods", "train-0", "ml") is not None
    assert "GPUUnhealthy" not in conditions(cluster.server, "ml", "train-0")
    # and if the pod changes between the last read and the call, the UID precondition holds
    fix._evict(trouble, 999_999)
    assert cluster.server.get("pods", "train-0", "ml")["metadata"]["uid"] == "uid-new"  # type: ignore[index]
    assert not fix._patch_condition(
        {"metadata": {"namespace": "ml", "name": "train-0", "uid": "uid-old"}},
        {"type": "GPUUnhealthy", "status": "True"},
    )
    assert "GPUUnhealthy" not in conditions(cluster.server, "ml", "train-0")
    # a whole round sees the pod as it is now: on node-b, holding a healthy GPU
    fix.round()
    assert cluster.server.get("pods", "train-0", "ml") is not None
    assert "GPUUnhealthy" not in conditions(cluster.server, "ml", "train-0")
    assert [r for r in rows(cluster) if r[1] in ("evicted", "marked")] == []


def test_the_kubelet_must_confirm_the_device_and_the_pod_must_be_on_the_fenced_node(
    cluster: Cluster,
) -> None:
    a = cluster.add_node("node-a", count=3)
    cluster.add_node("node-b")
    bad = uuid_of("node-a", 0)
    cluster.add_pod("ml", "stale", "node-a", {bad: HEALTHY})  # the kubelet says Healthy
    cluster.add_pod("ml", "elsewhere", "node-b", {bad: UNHEALTHY})  # not on the fenced node
    cluster.add_pod("ml", "other-gpu", "node-a", {uuid_of("node-a", 1): UNHEALTHY})
    cluster.add_pod("ml", "replica", "node-a", {f"{bad}::3": UNHEALTHY})  # time-sliced
    a.xid(0, 79)
    a.xid(1, 13)  # the application's own error: restart it, the GPU is fine
    fix = cluster.remediator([T0 + 120], condition=True)
    fix.round()
    marked = {
        p: conditions(cluster.server, "ml", p).get("GPUUnhealthy")
        for p in ("stale", "elsewhere", "other-gpu", "replica")
    }
    assert marked == {"stale": None, "elsewhere": None, "other-gpu": None, "replica": "True"}


# -- the circuit breaker -----------------------------------------------------------------------


def test_nvml_failing_on_every_node_at_once_evicts_nothing_and_opens_the_breaker(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    names = [f"node-{i}" for i in range(4)]
    for name in names:
        cluster.add_node(name)
        cluster.add_pod("ml", f"job-{name}", name, {uuid_of(name, 0): UNHEALTHY})
    for name in names:
        cluster.agents[name].nvml_fails()  # a driver upgrade: NVML gone everywhere
    node = cluster.server.get("nodes", "node-0") or {}
    [ours] = [c for c in node["status"]["conditions"] if c["type"] == "GPUUnhealthy"]
    assert "nvml_unavailable" in ours["message"] and "reboot_node" in ours["message"]
    clock = [T0 + 3600]
    fix = cluster.remediator(clock, condition=True, evict=True, after_s=0, max_evictions=100)
    fix.round()
    fix.round()
    assert all(cluster.server.get("pods", f"job-{n}", "ml") is not None for n in names)
    assert all("GPUUnhealthy" not in conditions(cluster.server, "ml", f"job-{n}") for n in names)
    assert not any(call[1] in ("pods/eviction", "pods/status") for call in cluster.server.calls)
    assert fix.metrics.breaker_open._value.get() == 1  # type: ignore[attr-defined]
    assert ("breaker", "open", "") in rows(cluster)  # once, however many rounds
    assert rows(cluster).count(("breaker", "open", "")) == 1
    assert "circuit breaker open" in caplog.text and "4 of 4 GPU nodes" in caplog.text
    # a restart does not say it again; recovery on all but one node closes it and acts
    again = cluster.remediator(clock, condition=True, evict=True, after_s=0, max_evictions=100)
    again.round()
    assert rows(cluster).count(("breaker", "open", "")) == 1
    for name in names[1:]:
        cluster.agents[name].recover(T0 + 3700)
    again.round()
    assert ("breaker", "closed", "") in rows(cluster)
    assert again.metrics.breaker_open._value.get() == 0  # type: ignore[attr-defined]
    assert cluster.server.get("pods", "job-node-0", "ml") is None  # one node: acted on


def test_one_node_alone_never_trips_the_breaker(cluster: Cluster) -> None:
    for i in range(2):
        cluster.add_node(f"node-{i}")
    cluster.add_pod("ml", "job", "node-0", {uuid_of("node-0", 0): UNHEALTHY})
    cluster.agents["node-0"].nvml_fails()  # half the fleet, but a single node
    fix = cluster.remediator([T0 + 3600], evict=True, after_s=0)
    fix.round()
    assert cluster.server.get("pods", "job", "ml") is None


# -- the budget --------------------------------------------------------------------------------


def test_the_fleet_budget_holds_across_a_restart_and_pdbs_do_not_spend_it(
    cluster: Cluster,
) -> None:
    names = [f"node-{i}" for i in range(10)]
    for name in names:
        cluster.add_node(name)
    cluster.add_pod("ml", "db-0", "node-0", {uuid_of("node-0", 0): UNHEALTHY},
                    labels={"app": "db"})  # fmt: skip
    cluster.server.apply("ADDED", {"kind": "PodDisruptionBudget", "apiVersion": "policy/v1",
                                   "metadata": {"name": "db", "namespace": "ml", "uid": "pdb"},
                                   "spec": {"selector": {"matchLabels": {"app": "db"}}},
                                   "status": {"disruptionsAllowed": 0}})  # fmt: skip
    cluster.add_pod("ml", "train-1", "node-1", {uuid_of("node-1", 0): UNHEALTHY})
    cluster.add_pod("ml", "train-2", "node-1", {uuid_of("node-1", 1): UNHEALTHY})
    cluster.agents["node-0"].xid(0, 79, at=T0 + 1)
    cluster.agents["node-1"].xid(0, 79, at=T0 + 2)
    cluster.agents["node-1"].xid(1, 48, at=T0 + 3)  # reset
    clock = [T0 + 10]
    settings = {"evict": True, "after_s": 60, "max_evictions": 1, "window_s": 600}
    fix = cluster.remediator(clock, **settings)
    fix.round()
    assert cluster.server.count("pods") == 3  # the verdicts are seconds old: wait
    clock[0] = T0 + 100
    fix.round()
    # oldest first: "db-0" waits for its PDB (429; its place given back), "train-1" goes
    assert cluster.server.get("pods", "db-0", "ml") is not None
    assert cluster.server.get("pods", "train-1", "ml") is None
    assert cluster.server.get("pods", "train-2", "ml") is not None
    fix.round()  # the PDB says no again: not a second row
    assert [r for r in rows(cluster) if r[0] == "evict"] == [
        ("evict", "blocked_by_pdb", "db-0"),
        ("evict", "evicted", "train-1"),
    ]
    # a restart: a new process with an empty memory and the same store
    restarted = cluster.remediator(clock, **settings)
    clock[0] = T0 + 650
    restarted.round()
    assert cluster.server.get("pods", "train-2", "ml") is not None  # the window still holds
    assert restarted.metrics.budget_left._value.get() == 0  # type: ignore[attr-defined]
    clock[0] = T0 + 701  # 600 s after "train-1"
    restarted.round()
    assert cluster.server.get("pods", "train-2", "ml") is None
    # the Eviction carried the pod's UID; Events say it on the pods
    reasons = sorted((e["regarding"]["name"], e["reason"]) for e in events(cluster.server, "ml"))
    assert reasons == [
        ("db-0", "GPUEvictionBlocked"),  # once: the restarted one read it from the store
        ("train-1", "GPUEvicted"),
        ("train-2", "GPUEvicted"),
    ]
    assert all(
        e["reportingController"] == "gpuquota.io/remediate" for e in events(cluster.server, "ml")
    )


@pytest.mark.parametrize("dry_run", [False, True], ids=["real", "dry-run"])
def test_a_restarted_remediate_records_nothing_twice(cluster: Cluster, dry_run: bool) -> None:
    """What was done for which pod and fence is read from the store, not kept in memory: a
    restart (or a replica taking over, the same fresh start) writes no row and no Event again:
    not the refusals, not a PodDisruptionBudget's "not now", not a dry run's answers."""
    cluster.add_node("node-a", count=4)
    cluster.add_node("node-b")
    bad = {i: uuid_of("node-a", i) for i in range(4)}
    cluster.add_pod("kube-system", "static", "node-a", {bad[0]: UNHEALTHY},
                    annotations={"kubernetes.io/config.mirror": "x"})  # fmt: skip
    cluster.add_pod("ml", "keep", "node-a", {bad[1]: UNHEALTHY},
                    annotations={"gpuquota.io/evict-on-gpu-failure": "false"})  # fmt: skip
    cluster.add_pod("ml", "db-0", "node-a", {bad[2]: UNHEALTHY}, labels={"app": "db"})
    cluster.server.apply("ADDED", {"kind": "PodDisruptionBudget", "apiVersion": "policy/v1",
                                   "metadata": {"name": "db", "namespace": "ml", "uid": "pdb"},
                                   "spec": {"selector": {"matchLabels": {"app": "db"}}},
                                   "status": {"disruptionsAllowed": 0}})  # fmt: skip
    cluster.add_pod("ml", "job", "node-a", {bad[3]: UNHEALTHY})
    for i in range(4):
        cluster.agents["node-a"].xid(i, 79, at=T0 + 1 + i)
    clock = [T0 + 100]
    # the pods are marked in one round and evicted in the next: one Event per pod and round
    # (an Event's name is the pod's and the clock's, which stands still here)
    settings = {"condition": True, "after_s": 0, "max_evictions": 10, "dry_run": dry_run}
    cluster.remediator(clock, **settings).round()
    settings["evict"] = True
    first = cluster.remediator(clock, **settings)
    for _ in range(2):
        clock[0] += 10
        first.round()
    written = rows(cluster)
    said = sorted((e["regarding"]["name"], e["reason"]) for e in events(cluster.server, "ml"))
    # one refusal each, written before --evict was added (a refusal is the pod's, not the act's)
    assert [(r, p) for _a, r, p in written if r == "refused"] == [
        ("refused", "static"),
        ("refused", "keep"),
    ]
    blocked = "dry_run_blocked" if dry_run else "blocked_by_pdb"
    assert ("evict", blocked, "db-0") in written
    for _ in range(2):  # two restarts
        clock[0] += 10
        cluster.remediator(clock, **settings).round()
    assert rows(cluster) == written
    assert sorted((e["regarding"]["name"], e["reason"]) for e in events(cluster.server, "ml")) == (
        said
    )
    assert said == ([] if dry_run else sorted([
        ("db-0", "GPUUnhealthy"), ("db-0", "GPUEvictionBlocked"),
        ("job", "GPUUnhealthy"), ("job", "GPUEvicted"),
    ]))  # fmt: skip


def test_a_gpu_fenced_later_on_a_fenced_node_waits_its_own_evict_after(cluster: Cluster) -> None:
    """The Node's condition dates the node's first fence; a second GPU fenced 500 s later is
    dated by its own fence (the agent writes it in the message), not as 500 s old."""
    cluster.add_node("node-a")
    cluster.add_pod("ml", "first", "node-a", {uuid_of("node-a", 0): UNHEALTHY})
    cluster.add_pod("ml", "second", "node-a", {uuid_of("node-a", 1): UNHEALTHY})
    cluster.agents["node-a"].xid(0, 79, at=T0 + 1)
    cluster.agents["node-a"].xid(1, 79, at=T0 + 500)
    clock = [T0 + 510]
    fix = cluster.remediator(clock, evict=True, after_s=60, max_evictions=5)
    fix.round()
    assert cluster.server.get("pods", "first", "ml") is None
    assert cluster.server.get("pods", "second", "ml") is not None  # fenced 10 s ago
    clock[0] = T0 + 561
    fix.round()
    assert cluster.server.get("pods", "second", "ml") is None


def test_a_crash_between_reserving_and_evicting_never_frees_budget(cluster: Cluster) -> None:
    cluster.add_node("node-a")
    cluster.add_pod("ml", "p", "node-a", {uuid_of("node-a", 0): UNHEALTHY})
    cluster.agents["node-a"].xid(0, 79)
    fix = cluster.remediator([T0 + 100], evict=True, after_s=0, max_evictions=1)
    assert fix.ledger.reserve(Act("evict", "evicting", pod="x"), T0 + 50, 1, 600) is not None
    fix.round()  # the reservation of the process that died still counts
    assert cluster.server.get("pods", "p", "ml") is not None


# -- never touched, dry run, the condition's life ----------------------------------------------


def test_static_terminating_and_opted_out_pods_are_never_touched_and_dry_run_writes_nothing(
    cluster: Cluster,
) -> None:
    cluster.add_node("node-a", count=4)
    bad = {i: uuid_of("node-a", i) for i in range(4)}
    cluster.add_pod("kube-system", "static", "node-a", {bad[0]: UNHEALTHY},
                    annotations={"kubernetes.io/config.mirror": "x"})  # fmt: skip
    cluster.add_pod("ml", "leaving", "node-a", {bad[1]: UNHEALTHY},
                    deletionTimestamp="2026-11-29T00:00:00Z")  # fmt: skip
    cluster.add_pod("ml", "keep", "node-a", {bad[2]: UNHEALTHY},
                    annotations={"gpuquota.io/evict-on-gpu-failure": "false"})  # fmt: skip
    cluster.add_pod("ml", "job", "node-a", {bad[3]: UNHEALTHY})
    for i in range(4):
        cluster.agents["node-a"].xid(i, 79)
    fix = cluster.remediator([T0 + 100], condition=True, evict=True, after_s=0, dry_run=True,
                             max_evictions=10)  # fmt: skip
    versions = {k: p["metadata"]["resourceVersion"]
                for k, p in cluster.server.state.objects["pods"].items()}  # fmt: skip
    fix.round()
    fix.round()
    assert cluster.server.count("pods") == 4
    # the server was asked (dryRun=All), and nothing changed: no pod, no Event
    assert {k: p["metadata"]["resourceVersion"]
            for k, p in cluster.server.state.objects["pods"].items()} == versions  # fmt: skip
    assert not events(cluster.server, "ml") and not events(cluster.server, "kube-system")
    assert cluster.server.requests.get("PATCH pods dryRun") == 1
    assert cluster.server.requests.get("POST pods dryRun") == 1
    assert "PATCH pods" not in cluster.server.requests
    assert "POST pods" not in cluster.server.requests
    assert sorted(r for r in rows(cluster)) == sorted([
        ("evict", "refused", "static"), ("evict", "refused", "leaving"),
        ("evict", "refused", "keep"), ("condition", "dry_run", "job"),
        ("evict", "dry_run", "job"),
    ])  # fmt: skip
    real = cluster.remediator([T0 + 100], condition=True, evict=True, after_s=0, max_evictions=10)
    real.round()
    assert {p for _ns, p in cluster.server.state.objects["pods"]} == {"static", "leaving", "keep"}
    for ns, name in (("kube-system", "static"), ("ml", "leaving"), ("ml", "keep")):
        assert "GPUUnhealthy" not in conditions(cluster.server, ns, name)


def test_the_condition_is_set_beside_the_kubelets_and_cleared_after_a_restart(
    cluster: Cluster,
) -> None:
    a = cluster.add_node("node-a")
    cluster.add_node("node-b")
    cluster.add_pod("ml", "train", "node-a", {uuid_of("node-a", 0): UNHEALTHY})
    theirs = conditions(cluster.server, "ml", "train")
    a.xid(0, 48)  # double-bit ECC: reset
    fix = cluster.remediator([T0 + 100], condition=True)
    fix.round()
    assert conditions(cluster.server, "ml", "train") == {**theirs, "GPUUnhealthy": "True"}
    patches = cluster.server.requests.get("PATCH pods", 0)
    fix.round()
    assert cluster.server.requests.get("PATCH pods", 0) == patches  # says so already
    [event] = events(cluster.server, "ml")
    assert (event["reason"], event["regarding"]["uid"]) == ("GPUUnhealthy",
                                                            event["regarding"]["uid"])  # fmt: skip
    a.recover(T0 + 200_000)
    cluster.remediator([T0 + 200_000], condition=True).round()  # a restarted one clears it
    assert conditions(cluster.server, "ml", "train")["GPUUnhealthy"] == "False"
    assert [r for r in rows(cluster) if r[0] == "condition"] == [
        ("condition", "marked", "train"),
        ("condition", "cleared", "train"),
    ]


def test_a_condition_the_store_does_not_know_of_is_noted_and_cleared_later(
    cluster: Cluster,
) -> None:
    a = cluster.add_node("node-a")
    cluster.add_node("node-b")
    cluster.add_pod("ml", "train", "node-a", {uuid_of("node-a", 0): UNHEALTHY})
    a.xid(0, 79)
    cluster.remediator([T0 + 100], cluster="before", condition=True).round()
    assert conditions(cluster.server, "ml", "train")["GPUUnhealthy"] == "True"
    # a store that lost its rows (restored from an older backup): the pod already says so
    restored = cluster.remediator([T0 + 200], cluster="restored", condition=True)
    patches = cluster.server.requests.get("PATCH pods", 0)
    restored.round()
    assert cluster.server.requests.get("PATCH pods", 0) == patches  # nothing to write
    a.recover(T0 + 200_000)
    restored.round()
    assert conditions(cluster.server, "ml", "train")["GPUUnhealthy"] == "False"
