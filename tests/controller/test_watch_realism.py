"""The controller against a stand-in that behaves like a real kube-apiserver 1.36 on the points
that broke bills (../shared/kube-apiserver.md): no bookmarks on a quiet watch, a resumed watch
whose version was compacted while the controller was down, a relist that takes a while, and
resourceVersions that mean nothing across servers.

Each test fails on 6c36c52:
- quiet: the controller restarted every watch silent for --read-timeout and froze the
  heartbeat, so a report charged a running pod only up to the frozen heartbeat;
- restart over a compacted version: the heartbeat was written before the Pod watch got its
  410, so a pod deleted while the controller was down was closed at the new heartbeat, and no
  gap was stored (there was no gap table);
- relist: ``gpuquota_controller_synced`` stayed 1 during the relist and no gap was stored;
- another server's versions: a version the server never handed out was retried forever.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from datetime import UTC

from gpuquota.quota.report import build, compute, period, render
from gpuquota.sim.apiserver import RESOURCES, ApiServer
from gpuquota.sim.harness import wait_for
from tests.accounting.objects import namespace, node, pod
from tests.controller.conftest import (
    WATCHED,
    Store,
    caught_up,
    metric,
    ready,
    start,
)


def _cluster(api: ApiServer, started: int, pods: tuple[str, ...] = ("a",)) -> None:
    api.apply("ADDED", node(created=started - 100))
    api.apply("ADDED", namespace(created=started - 100))
    for name in pods:
        api.apply("ADDED", pod(f"uid-{name}", name, created=started - 1, start=started))


def _readyz(ctl) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{ctl.metrics_port}/readyz", timeout=5
        ) as answer:
            return answer.status, answer.read().decode().strip()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode().strip()


def _allocation(store: Store, name: str) -> dict | None:
    rows = [r for r in store.allocations() if r["pod_uid"] == f"uid-{name}"]
    return rows[0] if rows else None


def _report(store: Store, lo: int, hi: int) -> compute.Report:
    request = build.ReportRequest(period.Period(lo, hi, UTC), hi, ("namespace",), store.cluster)
    with store.engine.connect() as conn:
        return build.build_report(conn, request)


def test_a_quiet_cluster_keeps_the_heartbeat_and_the_bill_going(store, controllers):
    # a real server sends no bookmark on a quiet watch for minutes; here: never
    with ApiServer(bookmarks="none") as api:
        began = int(time.time()) - 5
        _cluster(api, began)
        # the flags 6c36c52's tests ran with: a read timeout below the watch timeout
        ctl = start(api, store, controllers, "--watch-timeout", "20", "--read-timeout", "1.5")
        ready(store)
        first = store.heartbeat()
        assert first is not None
        time.sleep(6)  # nothing changes: not one event, not one bookmark
        now = int(time.time())
        wait_for(lambda: store.heartbeat()[1] >= now - 1, 10, "the heartbeat to advance")
        text_ = ctl.metrics()
        assert metric(text_, "gpuquota_controller_synced") == 1
        assert _readyz(ctl) == (200, "current")
        assert 'reason="stalled"' not in text_
        # the report charges the pod up to where the data ends: now, not a frozen heartbeat
        report = _report(store, began - 60, now)
        (group,) = report.groups
        assert group.raw_seconds >= now - began - 2
        assert not report.gaps
        assert ctl.terminate() == 0
    assert "silent" not in ctl.log()


def test_a_restart_over_a_compacted_version_closes_at_the_old_heartbeat(
    apiserver, store, controllers
):
    began = int(time.time()) - 30
    _cluster(apiserver, began, ("a", "b"))
    ctl = start(apiserver, store, controllers)
    ready(store)
    wait_for(lambda: _allocation(store, "a") is not None, 20, "pod a stored")
    wait_for(lambda: caught_up(store, apiserver), 20, "catch-up")
    ctl.kill()
    beat = store.heartbeat()
    assert beat is not None
    old = beat[1]
    time.sleep(2)
    # deleted while the controller is down, and the history compacted: no DELETED to replay
    apiserver.delete(RESOURCES["pods"], "team-a", "a")
    apiserver.force_gone()
    time.sleep(1.5)
    restarted_at = int(time.time())
    ctl = start(apiserver, store, controllers)
    wait_for(
        lambda: (_allocation(store, "a") or {}).get("ended_at") is not None, 20, "pod a closed"
    )
    wait_for(lambda: caught_up(store, apiserver), 20, "catch-up after the restart")
    closed = _allocation(store, "a")
    assert closed is not None
    # never later than the last time the controller knew it ran
    assert closed["ended_at"] <= old
    assert (closed["estimated"], closed["end_reason"]) == (True, "vanished")
    assert (_allocation(store, "b") or {}).get("ended_at") is None
    # the downtime the resumed Pod watch could not replay is a gap, reported in every format
    pod_gaps = [g for g in store.gaps() if g[0] == "Pod"]
    assert len(pod_gaps) == 1
    _, start_at, end_at, reason = pod_gaps[0]
    assert (start_at, reason) == (old, "restart") and end_at >= restarted_at
    now = int(time.time())
    report = _report(store, began - 60, now)
    window = period.Period(began - 60, now, UTC)
    assert any("Pod not followed" in n for n in render.notes(report))
    assert "Pod not followed" in render.render_table(report, window)
    assert "\ngap," in render.render_csv(report)
    assert [g["kind"] for g in json.loads(render.render_json(report, window))["gaps"]] == [
        k for k, *_ in store.gaps()
    ]
    assert ctl.terminate() == 0


def test_the_heartbeat_holds_during_a_relist_and_the_gap_is_stored(apiserver, store, controllers):
    began = int(time.time()) - 10
    _cluster(apiserver, began)
    ctl = start(apiserver, store, controllers)
    ready(store)
    wait_for(lambda: caught_up(store, apiserver), 20, "catch-up")
    # the Pod watch expires (410) and its relist cannot finish for a while
    apiserver.forbid("pods")
    apiserver.force_gone()
    cut = int(time.time())
    wait_for(lambda: metric(ctl.metrics(), "gpuquota_controller_synced") == 0, 10, "synced 0")
    held = store.heartbeat()
    assert held is not None and held[1] <= cut + 1
    time.sleep(3)
    assert store.heartbeat()[1] == held[1]  # not one heartbeat during the relist
    assert metric(ctl.metrics(), "gpuquota_controller_synced") == 0
    assert _readyz(ctl) == (503, "not current: Pod")
    apiserver.forbid("pods", False)
    relisted = int(time.time())
    wait_for(lambda: caught_up(store, apiserver), 20, "catch-up after the relist")
    wait_for(lambda: store.heartbeat()[1] > held[1], 10, "the heartbeat to move again")
    assert metric(ctl.metrics(), "gpuquota_controller_synced") == 1
    assert _readyz(ctl) == (200, "current")
    pod_gaps = [g for g in store.gaps() if g[0] == "Pod"]
    assert len(pod_gaps) == 1, (store.gaps(), ctl.log()[-3000:])
    _, start_at, end_at, reason = pod_gaps[0]
    assert reason == "gone" and start_at <= cut and relisted <= end_at <= relisted + 5
    assert ctl.terminate() == 0


def test_versions_of_another_server_are_relisted_not_retried(store, controllers):
    # versions are opaque: a new server (an etcd restore, a rebuilt cluster) may hand out
    # lower ones than the controller stored
    began = int(time.time()) - 10
    with ApiServer(first_version=900_000) as first:
        _cluster(first, began)
        ctl = start(first, store, controllers)
        ready(store)
        wait_for(lambda: caught_up(store, first), 20, "catch-up")
        ctl.kill()
    with ApiServer(first_version=1_000) as second:
        _cluster(second, began)
        ctl = start(second, store, controllers)
        wait_for(lambda: caught_up(store, second), 20, "catch-up on the new server")
        beat = store.heartbeat()
        assert beat is not None and len(beat[2]) == WATCHED
        assert metric(ctl.metrics(), "gpuquota_controller_synced") == 1
        assert ctl.terminate() == 0
    # the same pod, still running: nothing vanished, nothing estimated
    assert [r["ended_at"] for r in store.allocations()] == [None]
    assert {g[3] for g in store.gaps()} == {"restart"}
