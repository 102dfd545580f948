"""The Accountant against a real store (SQLite and PostgreSQL): intervals, idempotency,
restarts, vanished objects and database outages."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import create_engine, text

from gpuquota.quota.accounting import AccountingError
from gpuquota.quota.accounting.accountant import Accountant
from gpuquota.quota.accounting.rows import QuotaSampleRow
from gpuquota.quota.store.db import Store, StoreError, open_store
from tests.accounting.objects import namespace, node, pod, quota
from tests.store import rows

Event = tuple[str, dict[str, Any], int]


def lifecycle() -> list[Event]:
    """A small day in a cluster: nodes, a labelled namespace, a quota, pods living and dying."""
    mig = node(
        "mig-1",
        product="NVIDIA-A100-SXM4-80GB",
        count=1,
        allocatable={"nvidia.com/mig-1g.10gb": 7},
        mig_strategy="mixed",
        pool="a100",
        created=100,
    )
    shared = node(
        "ts-1",
        product="NVIDIA-A10G-SHARED",
        count=2,
        allocatable={"nvidia.com/gpu": 8},
        replicas=4,
        sharing="time-slicing",
        pool="a10",
        created=100,
    )
    return [
        ("ADDED", node(created=100), 100),
        ("ADDED", mig, 100),
        ("ADDED", shared, 100),
        ("ADDED", namespace(labels={"team": "a"}, created=100), 100),
        ("ADDED", quota(hard=4, used=0, created=100), 100),
        # a training pod: pending, bound, running, restarted, succeeded, deleted
        ("ADDED", pod("p1", start=None, node=None, phase="Pending", gpus=2), 1000),
        ("MODIFIED", pod("p1", start=None, phase="Pending", gpus=2), 1005),
        ("MODIFIED", pod("p1", start=1010, gpus=2), 1010),
        ("MODIFIED", quota(hard=4, used=2), 1011),
        ("MODIFIED", pod("p1", start=1010, gpus=2, phase="Succeeded", finished=1500), 1503),
        (
            "DELETED",
            pod("p1", start=1010, gpus=2, phase="Succeeded", finished=1500, deletion=1600, grace=0),
            1600,
        ),
        ("MODIFIED", quota(hard=4, used=0), 1601),
        # a MIG pod deleted while running: ends at its deletionTimestamp
        (
            "ADDED",
            pod(
                "p2",
                name="mig",
                node="mig-1",
                resource="nvidia.com/mig-1g.10gb",
                gpus=3,
                start=1100,
            ),
            1100,
        ),
        (
            "MODIFIED",
            pod(
                "p2",
                name="mig",
                node="mig-1",
                resource="nvidia.com/mig-1g.10gb",
                gpus=3,
                start=1100,
                deletion=1730,
            ),
            1700,
        ),
        (
            "DELETED",
            pod(
                "p2",
                name="mig",
                node="mig-1",
                resource="nvidia.com/mig-1g.10gb",
                gpus=3,
                start=1100,
                deletion=1730,
            ),
            1735,
        ),
        # a time-sliced pod still running at the end
        ("ADDED", pod("p3", name="notebook", node="ts-1", start=1200, cpu=None), 1200),
        # the name "train" reused by a new pod (new UID) that never gets scheduled
        ("ADDED", pod("p4", start=None, node=None, phase="Pending"), 1700),
        (
            "DELETED",
            pod("p4", start=None, node=None, phase="Pending", deletion=1800, grace=0),
            1800,
        ),
        ("MODIFIED", namespace(labels={"team": "b"}, created=100), 1900),
    ]


def run(
    store: Store,
    cluster: str,
    events: list[Event],
    flush_every: int = 1000,
    *,
    killed: bool = False,
) -> Accountant:
    accountant = Accountant(store, cluster)
    for i, (kind, obj, at) in enumerate(events, start=1):
        accountant.apply(kind, obj, at)
        if i % flush_every == 0:
            accountant.flush()
    if not killed:
        accountant.flush()
    return accountant


def test_lifecycle_rows(store: Store, cluster: str) -> None:
    accountant = run(store, cluster, lifecycle())
    allocs = rows.allocations(store, cluster)
    assert set(allocs) == {
        ("p1", "nvidia.com/gpu"),
        ("p2", "nvidia.com/mig-1g.10gb"),
        ("p3", "nvidia.com/gpu"),
    }
    p1 = allocs[("p1", "nvidia.com/gpu")]
    assert (p1["started_at"], p1["ended_at"], p1["end_reason"], p1["estimated"]) == (
        1010,
        1500,
        "terminated",
        False,
    )
    assert (p1["raw_units"], p1["physical_gpus"], p1["gpu_model"], p1["node_pool"]) == (
        2,
        2.0,
        "NVIDIA-H100-80GB-HBM3",
        "h100",
    )
    p2 = allocs[("p2", "nvidia.com/mig-1g.10gb")]
    assert (p2["started_at"], p2["ended_at"], p2["end_reason"]) == (
        1100,
        1730,
        "deletion_timestamp",
    )
    assert p2["physical_gpus"] == pytest.approx(3 / 7)
    assert (p2["sharing_strategy"], p2["mig_profile"]) == ("mig", "1g.10gb")
    p3 = allocs[("p3", "nvidia.com/gpu")]
    assert (p3["ended_at"], p3["physical_gpus"], p3["replicas"], p3["gpu_model"]) == (
        None,
        0.25,
        4,
        "NVIDIA-A10G",
    )
    assert p3["qos_class"] == "BestEffort"
    assert accountant.best_effort_gpu_pods() == [("team-a", "notebook")]
    assert accountant.quota_usage() == {("team-a", "nvidia.com/gpu"): 1}

    cap = {(r["node"], r["resource_name"]): r for r in rows.capacity(store, cluster)}
    assert cap[("gpu-1", "nvidia.com/gpu")]["physical_gpus"] == 8.0
    assert cap[("mig-1", "nvidia.com/mig-1g.10gb")]["physical_gpus"] == pytest.approx(1.0)
    assert cap[("ts-1", "nvidia.com/gpu")]["physical_gpus"] == 2.0
    assert all(r["started_at"] == 100 and r["ended_at"] is None for r in cap.values())

    assert [(r["labels"], r["valid_from"], r["valid_to"]) for r in rows.labels(store, cluster)] == [
        ({"team": "a"}, 100, 1900),
        ({"team": "b"}, 1900, None),
    ]
    assert [(r["hard"], r["used"], r["observed_at"]) for r in rows.samples(store, cluster)] == [
        (4.0, 0.0, 100),
        (4.0, 2.0, 1011),
        (4.0, 0.0, 1601),
    ]


def test_same_stream_twice_gives_the_same_rows(store: Store, cluster: str) -> None:
    run(store, cluster, lifecycle())
    first = rows.everything(store, cluster)
    run(store, cluster, lifecycle())
    assert rows.everything(store, cluster) == first


@pytest.mark.parametrize("stop", [3, 7, 9, 12, 15, 18])
def test_killed_between_flushes_then_rerun_loses_and_doubles_nothing(
    store: Store, cluster: str, stop: int
) -> None:
    events = lifecycle()
    reference = f"{cluster}-ref"
    run(store, reference, events)
    # the first run flushes after every event and dies after ``stop`` events; what it had
    # not flushed is lost with it. The rerun starts from the store and replays everything.
    run(store, cluster, events[:stop], flush_every=2, killed=True)
    run(store, cluster, events, flush_every=4)
    assert rows.everything(store, cluster) == rows.everything(store, reference)


def test_restart_recomputes_from_timestamps_and_closes_vanished_pods(
    store: Store, cluster: str
) -> None:
    first = Accountant(store, cluster)
    first.apply("ADDED", node(created=0), 100)
    first.apply("ADDED", pod("a", start=1000), 1000)
    first.apply("ADDED", pod("b", name="b", start=1000), 1000)
    first.apply("ADDED", pod("c", name="c", start=1000), 1000)
    first.heartbeat(1200)
    first.flush()
    first.heartbeat(1300)  # never flushed: the controller was killed here
    # while it was down: a finished, b vanished, c still runs
    second = Accountant(store, cluster)
    assert second.heartbeat_at == 1200
    second.resync("Node", [node(created=0)], 5000)
    second.resync(
        "Pod",
        [pod("a", start=1000, phase="Failed", finished=2500), pod("c", name="c", start=1000)],
        5000,
    )
    second.flush()
    allocs = rows.allocations(store, cluster)
    assert (
        allocs[("a", "nvidia.com/gpu")]["ended_at"],
        allocs[("a", "nvidia.com/gpu")]["end_reason"],
    ) == (2500, "terminated")
    b = allocs[("b", "nvidia.com/gpu")]
    assert (b["ended_at"], b["end_reason"], b["estimated"]) == (1200, "vanished", True)
    assert allocs[("c", "nvidia.com/gpu")]["ended_at"] is None
    assert second.stats["estimated"] == 1
    # a later, measured end replaces the estimate (e.g. a recorded stream replayed afterwards)
    third = Accountant(store, cluster)
    third.apply("DELETED", pod("b", name="b", start=1000, deletion=1250, grace=0), 1250)
    third.flush()
    b = rows.allocations(store, cluster)[("b", "nvidia.com/gpu")]
    assert (b["ended_at"], b["end_reason"], b["estimated"]) == (1250, "deletion_timestamp", False)


def test_node_deletion_ends_its_pods_and_capacity(store: Store, cluster: str) -> None:
    accountant = Accountant(store, cluster)
    accountant.apply("ADDED", node(created=50), 100)
    accountant.apply("ADDED", pod("a", start=1000), 1000)
    accountant.apply("DELETED", node(created=50), 2000)
    # the pod garbage collector deletes the pod later: its interval already ended
    accountant.apply("DELETED", pod("a", start=1000, deletion=2600, grace=0), 2600)
    # a late copy of the deleted node does not bring it back
    accountant.apply("MODIFIED", node(created=50), 1900)
    accountant.flush()
    a = rows.allocations(store, cluster)[("a", "nvidia.com/gpu")]
    assert (a["ended_at"], a["end_reason"]) == (2000, "node_deleted")
    assert [(r["started_at"], r["ended_at"]) for r in rows.capacity(store, cluster)] == [(50, 2000)]
    # a new node with the same name starts a new interval
    accountant.apply("ADDED", node(created=3000), 3000)
    accountant.flush()
    assert [(r["started_at"], r["ended_at"]) for r in rows.capacity(store, cluster)] == [
        (50, 2000),
        (3000, None),
    ]


def test_node_capacity_change_splits_the_interval(store: Store, cluster: str) -> None:
    accountant = Accountant(store, cluster)
    accountant.apply("ADDED", node(created=10), 100)
    accountant.apply("MODIFIED", node(created=10), 150)  # nothing changed
    accountant.apply(
        "MODIFIED", node(created=10, allocatable={"nvidia.com/gpu": 7}), 200
    )  # a GPU went bad
    accountant.apply("MODIFIED", node(created=10, allocatable={}), 300)  # drained of GPUs
    accountant.flush()
    assert [
        (r["allocatable_units"], r["started_at"], r["ended_at"])
        for r in rows.capacity(store, cluster)
    ] == [
        (8, 10, 200),
        (7, 200, 300),
    ]


def test_resync_closes_vanished_nodes_namespaces_and_quotas(store: Store, cluster: str) -> None:
    accountant = Accountant(store, cluster)
    accountant.apply("ADDED", node(created=10), 100)
    accountant.apply("ADDED", namespace(created=10), 100)
    accountant.apply("ADDED", quota(hard=2, used=1), 100)
    accountant.heartbeat(400)
    accountant.resync("Node", [], 900)
    accountant.resync("Namespace", [], 900)
    accountant.resync("ResourceQuota", [], 900)
    accountant.flush()
    assert [(r["started_at"], r["ended_at"]) for r in rows.capacity(store, cluster)] == [(10, 400)]
    assert [(r["valid_from"], r["valid_to"]) for r in rows.labels(store, cluster)] == [(10, 400)]
    assert [(r["hard"], r["used"], r["observed_at"]) for r in rows.samples(store, cluster)] == [
        (2.0, 1.0, 100),
        (None, None, 400),
    ]
    assert rows.heartbeat(store, cluster)[0]["at"] == 400


def test_database_outage_keeps_the_batch_for_the_next_flush(store: Store, cluster: str) -> None:
    accountant = Accountant(store, cluster)
    accountant.apply("ADDED", node(created=10), 100)
    accountant.apply("ADDED", pod("a", start=1000), 1000)
    accountant.heartbeat(1000)
    # the database goes away: nothing is written and nothing is lost
    accountant.store = Store(
        "postgresql+psycopg://gpuquota@127.0.0.1:1/down",
        create_engine("postgresql+psycopg://gpuquota@127.0.0.1:1/down"),
    )
    with pytest.raises(StoreError, match=r"write to .* failed"):
        accountant.flush()
    accountant.apply("MODIFIED", pod("a", start=1000, phase="Succeeded", finished=1400), 1401)
    with pytest.raises(StoreError):
        accountant.flush()
    assert rows.allocations(store, cluster) == {}
    accountant.store.close()
    accountant.store = store  # back
    assert accountant.pending() == 3
    accountant.flush()
    a = rows.allocations(store, cluster)[("a", "nvidia.com/gpu")]
    assert (a["started_at"], a["ended_at"]) == (1000, 1400)
    assert rows.heartbeat(store, cluster)[0]["at"] == 1000
    assert accountant.pending() == 0


def test_a_failing_batch_writes_nothing(store: Store, cluster: str) -> None:
    accountant = Accountant(store, cluster)
    accountant.apply("ADDED", node(created=10), 100)
    accountant.apply("ADDED", namespace(created=10), 100)
    accountant.apply("ADDED", pod("a", start=1000), 1000)
    batch = accountant.batch()
    assert batch.allocations and batch.node_capacity and batch.namespace_labels
    # the last row of the batch breaks a NOT NULL constraint: the rows before it roll back
    broken = QuotaSampleRow(None, "q", "requests.nvidia.com/gpu", 1.0, 0.0, [], 5)  # type: ignore[arg-type]
    batch.quota_samples.append(broken)
    with pytest.raises(StoreError, match="write to"):
        store.write(cluster, batch)
    assert rows.everything(store, cluster) == {
        "allocations": {},
        "capacity": [],
        "labels": [],
        "samples": [],
        "claims": [],
    }
    accountant.flush()  # the Accountant's own batch is intact
    assert len(rows.allocations(store, cluster)) == 1


def test_bookmarks_and_resource_versions_reach_the_heartbeat(store: Store, cluster: str) -> None:
    accountant = Accountant(store, cluster, holder="pod-7")
    accountant.apply("ADDED", pod("a", start=1000, resource_version="41"), 1000)
    accountant.apply(
        "BOOKMARK", {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "57"}}, 1001
    )
    accountant.heartbeat(1002)
    accountant.flush()
    (beat,) = rows.heartbeat(store, cluster)
    assert beat == {"holder": "pod-7", "at": 1002, "resource_versions": {"Pod": "57"}}
    assert Accountant(store, cluster).resource_versions == {"Pod": "57"}


def test_gone_pods_are_forgotten_after_retention_and_late_events_ignored(
    store: Store, cluster: str
) -> None:
    accountant = Accountant(store, cluster, retention_seconds=100)
    accountant.apply("ADDED", node(created=0), 0)
    accountant.apply("ADDED", pod("a", start=1000), 1000)
    accountant.apply("DELETED", pod("a", start=1000, deletion=1050, grace=0), 1050)
    accountant.apply("ADDED", pod("b", name="b", start=1000), 1000)
    accountant.flush()
    assert accountant.pods.count() == 2  # within retention: kept for late events
    accountant.apply("MODIFIED", pod("b", name="b", start=1000), 1200)
    accountant.flush()
    assert accountant.pods.count() == 1
    # a late stale copy of the forgotten pod neither returns to memory nor changes its row
    accountant.apply("MODIFIED", pod("a", start=1000), 1010)
    assert accountant.pods.count() == 1
    assert accountant.pending() == 0
    assert accountant.quota_usage() == {("team-a", "nvidia.com/gpu"): 1}
    a = rows.allocations(store, cluster)[("a", "nvidia.com/gpu")]
    assert (a["ended_at"], a["end_reason"]) == (1050, "deletion_timestamp")


def test_pod_started_before_its_node_was_seen_gets_the_node_facts(
    store: Store, cluster: str
) -> None:
    accountant = Accountant(store, cluster)
    accountant.apply("ADDED", pod("a", start=1000, node="ts-1"), 1000)
    accountant.flush()
    assert rows.allocations(store, cluster)[("a", "nvidia.com/gpu")]["gpu_model"] is None
    shared = node(
        "ts-1",
        product="Tesla-T4-SHARED",
        count=1,
        allocatable={"nvidia.com/gpu": 4},
        replicas=4,
        sharing="mps",
    )
    accountant.apply("ADDED", shared, 1100)
    # later relabelling of the node does not rewrite the recorded facts
    accountant.apply("MODIFIED", node("ts-1", product="Tesla-T4", count=1), 1200)
    accountant.flush()
    a = rows.allocations(store, cluster)[("a", "nvidia.com/gpu")]
    assert (a["gpu_model"], a["replicas"], a["sharing_strategy"], a["physical_gpus"]) == (
        "Tesla-T4",
        4,
        "mps",
        0.25,
    )


def test_namespace_recreated_under_the_same_name_starts_a_new_row(
    store: Store, cluster: str
) -> None:
    accountant = Accountant(store, cluster)
    accountant.apply("ADDED", namespace("ml", {"team": "a"}, created=10), 10)
    accountant.apply("DELETED", namespace("ml", {"team": "a"}, created=10), 500)
    accountant.apply("ADDED", namespace("ml", {"team": "a"}, created=600), 600)
    accountant.apply("MODIFIED", namespace("ml", {"team": "a"}, created=10), 300)  # stale copy
    accountant.flush()
    assert [(r["valid_from"], r["valid_to"]) for r in rows.labels(store, cluster)] == [
        (10, 500),
        (600, None),
    ]


def test_quota_lines_removed_and_quota_deleted(store: Store, cluster: str) -> None:
    accountant = Accountant(store, cluster)
    accountant.apply("ADDED", quota(hard=4, used=1, scopes=["NotBestEffort"]), 100)
    accountant.apply("MODIFIED", quota(hard=4, used=1, scopes=["NotBestEffort"]), 150)  # unchanged
    accountant.apply("MODIFIED", quota(hard=None, used=None), 200)  # GPU lines removed
    accountant.apply("MODIFIED", quota(hard=2, used=0), 300)
    accountant.apply("MODIFIED", quota(hard=8, used=0), 250)  # stale copy
    accountant.apply("DELETED", quota(hard=2, used=0), 400)
    accountant.flush()
    assert [
        (r["hard"], r["used"], r["scopes"], r["observed_at"]) for r in rows.samples(store, cluster)
    ] == [
        (4.0, 1.0, ["NotBestEffort"], 100),
        (None, None, [], 200),
        (2.0, 0.0, [], 300),
        (None, None, [], 400),
    ]


def test_unreadable_object_changes_nothing(store: Store, cluster: str) -> None:
    accountant = Accountant(store, cluster)
    bad = pod("a", start=1000)
    bad["status"]["startTime"] = "at noon"
    with pytest.raises(AccountingError, match=r"status\.startTime"):
        accountant.apply("ADDED", bad, 1000)
    with pytest.raises(AccountingError, match="no kind"):
        accountant.apply("ADDED", {"metadata": {}}, 1000)
    with pytest.raises(AccountingError, match="unknown event type"):
        accountant.apply("UPSERT", pod(), 1000)
    assert accountant.pending() == 0
    assert accountant.pods.count() == 0


def test_postgresql_restart_drops_connections_and_the_next_flush_reconnects(
    pg_session_url: str, cluster: str, postgres_url: str
) -> None:
    store = open_store(pg_session_url)
    accountant = Accountant(store, cluster)
    accountant.apply("ADDED", pod("a", start=1000), 1000)
    accountant.flush()
    with store.engine.connect() as conn:  # the pooled connection the next flush will reuse
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
    admin = create_engine(postgres_url)
    try:
        with admin.begin() as conn:
            assert conn.execute(
                text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}
            ).scalar_one()
    finally:
        admin.dispose()
    accountant.apply("MODIFIED", pod("a", start=1000, phase="Succeeded", finished=1300), 1300)
    accountant.flush()
    assert rows.allocations(store, cluster)[("a", "nvidia.com/gpu")]["ended_at"] == 1300
    store.close()


def test_single_strategy_mig_node_records_the_profile(store: Store, cluster: str) -> None:
    accountant = Accountant(store, cluster)
    mig = node(
        "a100",
        product="NVIDIA-A100-SXM4-40GB-MIG-3g.20gb",
        count=8,
        mig_strategy="single",
        created=5,
    )
    accountant.apply("ADDED", mig, 10)
    accountant.apply("ADDED", pod("a", node="a100", gpus=2, start=1000), 1000)
    accountant.flush()
    a = rows.allocations(store, cluster)[("a", "nvidia.com/gpu")]
    assert (a["gpu_model"], a["mig_profile"], a["sharing_strategy"]) == (
        "NVIDIA-A100-SXM4-40GB",
        "3g.20gb",
        "mig",
    )
    assert a["physical_gpus"] == pytest.approx(6 / 7)
    (cap,) = rows.capacity(store, cluster)
    assert (cap["mig_profile"], cap["allocatable_units"]) == ("3g.20gb", 8)
    assert cap["physical_gpus"] == pytest.approx(24 / 7)
