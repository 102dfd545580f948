"""`gpuquota remediate --dry-run` asks the API server (``dryRun=All``) what it would do: a
PodDisruptionBudget's refusal shows as such, nothing is stored or decremented, a dry run
sharing the store with the real run spends a budget of its own, and a dry run never makes a
real run forget a condition it has to clear. The stand-in's dry run is checked
against the real server's rules (pkg/registry/core/pod/storage/eviction.go: every check, no
write; the query's and the body's dryRun must agree; "All" is the only value). Its answers,
code and body, to the same requests on a real server: test_real_server_answers.py."""

from __future__ import annotations

import pytest

from gpuquota.kube.client import STRATEGIC_MERGE_PATCH, ApiStatusError
from tests.remediation.cluster import T0, Cluster, conditions, events, rows, uuid_of

UNHEALTHY = "Unhealthy"


def budget(c: Cluster, name: str, allowed: int, app: str) -> None:
    c.server.apply("ADDED", {"kind": "PodDisruptionBudget", "apiVersion": "policy/v1",
                             "metadata": {"name": name, "namespace": "ml", "uid": f"pdb-{name}"},
                             "spec": {"selector": {"matchLabels": {"app": app}}},
                             "status": {"disruptionsAllowed": allowed}})  # fmt: skip


def allowed(c: Cluster, name: str) -> int:
    return int(
        (c.server.get("poddisruptionbudgets", name, "ml") or {})["status"]["disruptionsAllowed"]
    )


def test_a_dry_run_shows_what_the_server_would_refuse_and_changes_nothing(cluster: Cluster) -> None:
    for i in range(10):
        cluster.add_node(f"node-{i}")
    cluster.add_pod("ml", "db-0", "node-0", {uuid_of("node-0", 0): UNHEALTHY}, labels={"app": "db"})
    cluster.add_pod(
        "ml", "web-0", "node-1", {uuid_of("node-1", 0): UNHEALTHY}, labels={"app": "web"}
    )
    cluster.add_pod("ml", "train", "node-1", {uuid_of("node-1", 1): UNHEALTHY})
    budget(cluster, "db", 0, "db")  # refuses: the server says 429
    budget(cluster, "web", 1, "web")  # allows one: a real eviction would decrement it
    cluster.agents["node-0"].xid(0, 79, at=T0 + 1)  # oldest first: db-0, web-0, train
    cluster.agents["node-1"].xid(0, 79, at=T0 + 2)
    cluster.agents["node-1"].xid(1, 79, at=T0 + 3)
    clock = [T0 + 100]
    fix = cluster.remediator(clock, evict=True, dry_run=True, after_s=0, max_evictions=2)
    fix.round()
    fix.round()  # the budget still refuses: said once, as a real run says it
    # the refusal is the server's (a local decision saw no budget); it spends no place, so
    # both other pods fit in the budget of 2
    assert [r for r in rows(cluster) if r[0] == "evict"] == [
        ("evict", "dry_run_blocked", "db-0"),
        ("evict", "dry_run", "web-0"),
        ("evict", "dry_run", "train"),
    ]
    assert cluster.server.count("pods") == 3
    assert allowed(cluster, "web") == 1  # a dry run decrements no budget
    assert not events(cluster.server, "ml")
    assert fix.metrics.actions.labels("evict", "dry_run_blocked")._value.get() == 1  # type: ignore[attr-defined]


def test_a_dry_run_and_the_real_run_sharing_a_store_each_spend_a_budget_of_their_own(
    cluster: Cluster,
) -> None:
    """Same database, same --cluster: a preview neither starves the real remediation nor is
    starved by it; each instance's budget counts its own evictions only."""
    for i in range(10):
        cluster.add_node(f"node-{i}")
    cluster.add_pod("ml", "a", "node-0", {uuid_of("node-0", 0): UNHEALTHY})
    cluster.add_pod("ml", "b", "node-1", {uuid_of("node-1", 0): UNHEALTHY})
    cluster.agents["node-0"].xid(0, 79, at=T0 + 1)  # oldest first: "a", then "b"
    cluster.agents["node-1"].xid(0, 79, at=T0 + 2)
    clock = [T0 + 100]
    settings = {"evict": True, "after_s": 0, "max_evictions": 1, "window_s": 600}
    real = cluster.remediator(clock, **settings)
    dry = cluster.remediator(clock, dry_run=True, **settings)
    real.round()  # the real budget (1 per 10 min) is spent on "a"
    assert cluster.server.get("pods", "a", "ml") is None
    clock[0] = T0 + 400
    dry.round()  # the preview's budget is untouched by it: it shows "b" would go
    assert cluster.server.get("pods", "b", "ml") is not None
    assert dry.metrics.budget_left._value.get() == 0  # type: ignore[attr-defined]
    clock[0] = T0 + 701  # the real eviction's window is over; the preview's row is not
    real.round()
    assert cluster.server.get("pods", "b", "ml") is None  # the preview spent none of it
    assert [r for r in rows(cluster) if r[0] == "evict"] == [
        ("evict", "evicted", "a"),
        ("evict", "dry_run", "b"),
        ("evict", "evicted", "b"),
    ]


def test_a_dry_run_never_makes_the_real_run_forget_to_clear_a_condition(cluster: Cluster) -> None:
    a = cluster.add_node("node-a")
    cluster.add_node("node-b")
    cluster.add_pod("ml", "train", "node-a", {uuid_of("node-a", 0): UNHEALTHY})
    a.xid(0, 48)
    cluster.remediator([T0 + 100], condition=True).round()
    assert conditions(cluster.server, "ml", "train")["GPUUnhealthy"] == "True"
    a.recover(T0 + 200_000)
    dry = cluster.remediator([T0 + 200_000], condition=True, dry_run=True)
    dry.round()
    dry.round()
    assert conditions(cluster.server, "ml", "train")["GPUUnhealthy"] == "True"  # asked only
    assert cluster.server.requests.get("PATCH pods dryRun") == 1
    cluster.remediator([T0 + 200_001], condition=True).round()
    assert conditions(cluster.server, "ml", "train")["GPUUnhealthy"] == "False"
    assert [r for r in rows(cluster) if r[0] == "condition"] == [
        ("condition", "marked", "train"),
        ("condition", "dry_run", "train"),
        ("condition", "cleared", "train"),
    ]


# -- the stand-in, as the real server ----------------------------------------------------------


def test_the_stand_in_runs_every_check_of_a_dry_run_and_stores_nothing(cluster: Cluster) -> None:
    cluster.add_node("node-a")
    cluster.add_pod("ml", "p", "node-a", {}, uid="uid-p", labels={"app": "web"})
    budget(cluster, "web", 1, "web")
    rv = cluster.server.get("pods", "p", "ml")["metadata"]["resourceVersion"]  # type: ignore[index]
    kube, base = cluster.kube, "/api/v1/namespaces/ml/pods/p"
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "p"},
                "deleteOptions": {"preconditions": {"uid": "uid-p"}}}  # fmt: skip
    dry = [("dryRun", "All")]
    patch = {"metadata": {"uid": "uid-p"},
             "status": {"conditions": [{"type": "GPUUnhealthy", "status": "True"}]}}  # fmt: skip
    answer = kube.call("PATCH", f"{base}/status", dry, patch, STRATEGIC_MERGE_PATCH)
    assert {c["type"] for c in answer["status"]["conditions"]} >= {"GPUUnhealthy"}
    assert kube.call("POST", f"{base}/eviction", dry, eviction)["status"] == "Success"
    stored = cluster.server.get("pods", "p", "ml")
    assert stored is not None and stored["metadata"]["resourceVersion"] == rv
    assert "GPUUnhealthy" not in conditions(cluster.server, "ml", "p")
    assert allowed(cluster, "web") == 1
    # the checks of a real request still answer
    wrong = {**eviction, "deleteOptions": {"preconditions": {"uid": "other"}}}
    for method, path, body, status in (
        ("POST", f"{base}/eviction", wrong, 409),  # the UID precondition
        ("PATCH", f"{base}/status", {**patch, "metadata": {"uid": "other"}}, 422),
        # a plain Go error on the real server: 500 (tests/remediation/test_real_server_answers.py)
        ("POST", f"{base}/eviction", {**eviction, "deleteOptions": {"dryRun": ["Other"]}}, 500),
    ):
        with pytest.raises(ApiStatusError) as refused:
            kube.call(method, path, dry, body, STRATEGIC_MERGE_PATCH if method == "PATCH" else
                      "application/json")  # fmt: skip
        assert refused.value.status == status, refused.value
    with pytest.raises(ApiStatusError) as refused:
        kube.call("PATCH", f"{base}/status", [("dryRun", "Some")], patch, STRATEGIC_MERGE_PATCH)
    assert refused.value.status == 422 and 'supported values: "All"' in str(refused.value)
    budget(cluster, "web", 0, "web")
    with pytest.raises(ApiStatusError) as refused:
        kube.call("POST", f"{base}/eviction", dry, eviction)
    assert refused.value.status == 429
    assert cluster.server.get("pods", "p", "ml") is not None
