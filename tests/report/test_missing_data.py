"""Missing is not zero: where the data ends, clusters and periods the store does not hold,
Prometheus coverage, quota samples, and quota figures per resource that cannot contradict
each other (a property test on generated histories)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import insert

from gpuquota.quota import cli as gpuquota
from gpuquota.quota.store.models import Cluster, Heartbeat
from gpuquota.sim.workload import generate, rfc3339
from tests.report.conftest import Store, ts
from tests.report.helpers import Canned, assert_refused, vector

OCT = ts("2026-10-01T00:00:00")
NOW = "2026-11-22T00:00:00Z"
H = 3600


def heartbeat(
    store: Store, at: int, cluster: str = "c1", holder: str = "replay", begins: int | None = None
) -> None:
    """The cluster's data ends at ``at`` (and begins there too, unless ``begins`` says)."""
    with store.engine.begin() as conn:
        conn.execute(
            insert(Cluster).values(name=cluster, created_at=at if begins is None else begins)
        )
        conn.execute(
            insert(Heartbeat).values(cluster=cluster, holder=holder, at=at, resource_versions={})
        )


def doc_of(report: Any, store: Store, *argv: str) -> dict[str, Any]:
    result = report(*argv, "--json", "--now", NOW, db=store)
    assert result.rc == 0, result.err
    doc: dict[str, Any] = json.loads(result.out)
    return doc


def test_unknown_cluster_is_refused_naming_the_known_ones(store: Store, report: Any) -> None:
    store.alloc("ml", OCT, OCT + H, cluster="east")
    store.alloc("ml", OCT, OCT + H, cluster="west")
    result = report("--month", "2026-10", "--cluster", "nosuch", "--now", NOW, db=store)
    assert_refused(result, "no cluster 'nosuch'", "'east', 'west'")


def test_a_future_period_is_refused(store: Store, report: Any) -> None:
    store.alloc("ml", OCT, None)
    result = report("--month", "2030-01", "--now", NOW, db=store)
    assert_refused(result, "starts after now", "no data")


def test_a_period_after_the_data_ends_is_refused(store: Store, report: Any) -> None:
    store.alloc("ml", OCT, None)
    heartbeat(store, OCT + 10 * H)
    result = report("--month", "2026-11", "--now", NOW, db=store)
    assert_refused(result, "data ends before it", "'c1' up to 2026-10-01T10:00:00")


def test_open_intervals_end_where_the_data_ends_and_the_report_says_so(
    store: Store, report: Any
) -> None:
    store.alloc("ml", OCT + H, None, qos_class="BestEffort")
    store.alloc("ml", OCT, OCT + 2 * H)
    store.capacity("n1", OCT, None, units=8)
    heartbeat(store, OCT + 10 * H, begins=OCT)
    doc = doc_of(report, store, "--month", "2026-10", "--idle")
    assert doc["rows"][0]["gpu_seconds_raw"] == 9 * H + 2 * H  # not up to the end of October
    assert doc["idle"]["total"]["allocatable_gpu_hours"] == 8 * 10
    assert doc["coverage"] == {
        "c1": {"data_ends": "2026-10-01T10:00:00Z", "data_ends_unix": OCT + 10 * H}
    }
    assert any("ends at 2026-10-01T10:00:00Z" in m for m in doc["notes"]["messages"])
    table = report("--month", "2026-10", "--now", NOW, db=store)
    assert "note: the data of cluster 'c1' ends at 2026-10-01T10:00:00Z" in table.out


def test_a_replayed_recording_ends_at_its_last_event(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = generate(3, hours=2)
    events = tmp_path / "events.jsonl"
    events.write_text("\n".join(workload.lines()) + "\n")
    assert gpuquota.main(["replay", str(events), "--db", store.url, "--cluster", "rec"]) == 0
    month = rfc3339(workload.start)[:7]
    capsys.readouterr()
    assert gpuquota.main(["report", "--month", month, "--db", store.url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    truth = sum(workload.truth.gpu_seconds().values())  # open pods counted to the end only
    assert doc["total"]["gpu_seconds_raw"] == truth
    assert doc["coverage"]["rec"]["data_ends"] == rfc3339(workload.end)
    assert any("'rec' ends at" in m for m in doc["notes"]["messages"])


def test_prometheus_coverage_is_shown_not_averaged_in(sqlite_store: Store, report: Any) -> None:
    from gpuquota.quota.report.prometheus import busy_query, step_for

    sqlite_store.clear()
    sqlite_store.alloc("ml", OCT, OCT + 4 * H)  # 4 GPU-hours, Prometheus saw 1 of them
    sqlite_store.alloc("web", OCT, OCT + H)  # Prometheus saw nothing of it
    canned = Canned()
    try:
        q = busy_query(86400, step_for(86400))
        canned.bodies = {
            q: vector({"ml": 0.5 * H}),
            busy_query(86400, step_for(86400), measured=True): vector({"ml": 1.0 * H}),
        }
        result = report(
            *("--from", "2026-10-01", "--to", "2026-10-02", "--prometheus", canned.url),
            *("--json", "--now", NOW),
            db=sqlite_store,
        )
    finally:
        canned.close()
    assert result.rc == 0, result.err
    doc = json.loads(result.out)
    rows = {r["group"]["namespace"]: r for r in doc["rows"]}
    assert rows["ml"]["measured_pct"] == 25.0
    assert rows["ml"]["utilisation_pct"] == 50.0  # of the measured hour, not of all four
    assert rows["ml"]["idle_while_allocated_gpu_hours"] == 0.5
    assert rows["web"]["utilisation_pct"] is None  # no data, not idle
    assert rows["web"]["measured_pct"] is None
    assert rows["web"]["idle_while_allocated_gpu_hours"] is None
    messages = " ".join(doc["notes"]["messages"])
    assert "no utilisation samples for: web" in messages
    assert "covers 20.0% of the allocated GPU-hours" in messages


def test_quota_figures_per_resource_never_added_across_units(store: Store, report: Any) -> None:
    # a namespace with whole GPUs and MIG slices: 4 GPUs used of 8, 7 slices used of 7
    store.quota("ml", OCT - 100, hard=8, used=4)
    store.quota("ml", OCT - 100, hard=7, used=7, resource="requests.nvidia.com/mig-1g.10gb")
    store.quota("ml", OCT - 100, hard=8, used=4, resource="nvidia.com/gpu")  # same quota, bare
    store.alloc("ml", OCT, OCT + H)
    store.alloc("web", OCT, OCT + H)  # no quota at all
    doc = doc_of(report, store, "--month", "2026-10")
    rows = {(r["resource"]): r for r in doc["quota"]["rows"]}
    assert set(rows) == {"nvidia.com/gpu", "nvidia.com/mig-1g.10gb"}
    assert rows["nvidia.com/gpu"]["quota_avg_used"] == 4.0  # requests form once, not twice
    assert rows["nvidia.com/gpu"]["quota_peak_used"] == 4.0
    assert rows["nvidia.com/mig-1g.10gb"]["quota_avg_used"] == 7.0
    assert set(doc["quota"]["totals"]) == {"nvidia.com/gpu", "nvidia.com/mig-1g.10gb"}
    assert "quota_avg_used" not in doc["total"]  # no figure adds GPUs and slices
    assert "no quota samples (no quota figures, not zero) for: web" in doc["notes"]["messages"]


def test_no_quota_samples_at_all_is_said(store: Store, report: Any) -> None:
    store.alloc("ml", OCT, OCT + H)
    doc = doc_of(report, store, "--month", "2026-10")
    assert doc["quota"]["rows"] == []
    assert any("no quota samples in this period" in m for m in doc["notes"]["messages"])


SAMPLE = st.tuples(
    st.sampled_from(["ml", "web"]),
    st.sampled_from(["q1", "q2"]),
    st.sampled_from(["requests.nvidia.com/gpu", "requests.nvidia.com/mig-1g.10gb"]),
    st.integers(min_value=-5 * 86400, max_value=40 * 86400),
    st.integers(min_value=0, max_value=16),
    st.integers(min_value=0, max_value=16),
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(history=st.lists(SAMPLE, min_size=1, max_size=30))
def test_peak_is_never_below_average(
    sqlite_store: Store, report: Any, history: list[tuple[str, str, str, int, int, int]]
) -> None:
    sqlite_store.clear()
    seen = set()
    for ns, quota, resource, offset, hard, used in history:
        if (ns, quota, resource, offset) in seen:
            continue  # one sample per quota, resource and second (the store's key)
        seen.add((ns, quota, resource, offset))
        sqlite_store.quota(ns, OCT + offset, hard=hard, used=used, resource=resource, name=quota)
    sqlite_store.alloc("ml", OCT, OCT + H)
    doc = doc_of(report, sqlite_store, "--month", "2026-10")
    for row in doc["quota"]["rows"]:
        where = (row["group"], row["quota"], row["resource"])
        assert row["quota_peak_used"] >= row["quota_avg_used"], where
        assert row["quota_peak_hard"] >= row["quota_avg_hard"], where
        assert row["quota_avg_used"] >= 0 and row["quota_unused_gpu_hours"] >= 0, where


def test_postgres_url_without_psycopg_names_the_extra(
    report: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [m for m in sys.modules if m == "psycopg" or m.startswith("psycopg.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "psycopg", None)
    result = report(db="postgresql+psycopg://gpuquota@127.0.0.1:1/gpuquota")
    assert_refused(result, "pip install 'gpuquota[postgres]'")


def test_a_live_controllers_heartbeat_is_not_the_end_of_the_data(store: Store, report: Any) -> None:
    now = ts(NOW.rstrip("Z"))
    store.alloc("ml", now - 2 * H, None)
    heartbeat(store, now - 5, holder="ctl-a")  # written at the last flush, seconds ago
    doc = doc_of(report, store, "--last", "1h")
    assert doc["rows"][0]["gpu_seconds_raw"] == H - 5  # counted to what the store knows
    assert not any("ends at" in m for m in doc["notes"]["messages"])  # but no alarm
    # a window wholly after the heartbeat holds no data, however recent: issue 18 reversed
    # this assertion (it was rc 0 with every namespace at 0.00), one rule whatever the distance
    recent = report("--last", "2s", "--json", "--now", NOW, db=store)  # after the heartbeat
    assert_refused(recent, "data ends before it", "'c1' up to 2026-11-21T23:59:55")


def test_one_rule_for_no_data_whatever_the_distance(store: Store, report: Any) -> None:
    """Issue 18 (fails on 6c36c52): a period starting minutes after the data ends printed
    every namespace at 0.00 with a false note that no quota was recorded, and a month before
    the store's first data printed an empty table, both with exit 0."""
    store.alloc("ml", OCT + H, None)
    store.quota("ml", OCT + H, hard=8, used=1)
    heartbeat(store, OCT + 10 * H)  # the data covers [OCT + 10 h, OCT + 10 h]: begins then
    just_after = report(
        "--from", rfc3339(OCT + 10 * H + 60), "--to", rfc3339(OCT + 11 * H),
        "--now", rfc3339(OCT + 10 * H + 120), db=store,
    )  # fmt: skip
    assert_refused(just_after, "data ends before it", "'c1' up to 2026-10-01T10:00:00")
    before = report("--month", "2026-09", "--now", NOW, db=store)
    assert_refused(before, "the store's data begins after it", "'c1' from 2026-10-01T10:00:00")


def test_a_period_reaching_before_the_data_begins_says_so(store: Store, report: Any) -> None:
    store.alloc("ml", OCT + H, None)  # running when the store first knew the cluster
    heartbeat(store, OCT + 10 * H)
    with store.engine.begin() as conn:  # first known at OCT + 2 h, last at OCT + 10 h
        conn.execute(Cluster.__table__.update().values(created_at=OCT + 2 * H))
    doc = doc_of(report, store, "--month", "2026-10")
    assert doc["rows"][0]["gpu_seconds_raw"] == 9 * H  # from the pod's own start
    assert any(
        "begins at 2026-10-01T02:00:00Z" in m and "not covered" in m
        for m in doc["notes"]["messages"]
    )
    doc = doc_of(report, store, "--from", rfc3339(OCT + 2 * H), "--to", rfc3339(OCT + 3 * H))
    assert not any("begins at" in m for m in doc["notes"]["messages"])
