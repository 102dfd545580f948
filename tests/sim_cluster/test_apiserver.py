"""The API server stand-in, driven through the official kubernetes client over a socket."""

from __future__ import annotations

import json
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest
import urllib3
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from gpuquota.sim.apiserver import ApiServer, Driver, merge_patch
from gpuquota.sim.harness import wait_for
from gpuquota.sim.workload import generate
from tests.sim_cluster.watching import watch_lines

WL = generate(5, 1.0)


def test_list_pages_are_one_consistent_snapshot(apiserver, kube):
    Driver(apiserver, WL).run(until=WL.start + 1800)
    v1 = client.CoreV1Api(kube)
    total = apiserver.count("pods")
    assert total > 4
    first = json.loads(v1.list_pod_for_all_namespaces(limit=3, _preload_content=False).data)
    rv = first["metadata"]["resourceVersion"]
    Driver(apiserver, WL).run()  # the cluster moves on between pages
    names = [p["metadata"]["name"] for p in first["items"]]
    token = first["metadata"]["continue"]
    while token:
        page = json.loads(
            v1.list_pod_for_all_namespaces(limit=3, _continue=token, _preload_content=False).data
        )
        assert page["metadata"]["resourceVersion"] == rv
        names += [p["metadata"]["name"] for p in page["items"]]
        token = page["metadata"].get("continue")
    assert len(names) == total and "kind" not in first["items"][0]
    # the model path works on the same objects (all fields the client requires are there)
    assert len(v1.list_node().items) == apiserver.count("nodes") == 6  # one node was deleted


def test_watch_resumes_from_resource_version_with_bookmarks(apiserver, kube):
    driver = Driver(apiserver, WL)
    driver.run(until=WL.start + 600)
    v1 = client.CoreV1Api(kube)
    rv = json.loads(v1.list_pod_for_all_namespaces(_preload_content=False).data)["metadata"][
        "resourceVersion"
    ]
    resp = v1.list_pod_for_all_namespaces(
        watch=True,
        resource_version=rv,
        allow_watch_bookmarks=True,
        timeout_seconds=3,
        _preload_content=False,
    )
    threading.Thread(target=driver.run, kwargs={"until": WL.start + 1200}).start()
    seen = list(watch_lines(resp))  # ends by timeoutSeconds
    expected = [
        (e.type, e.object["metadata"]["uid"])
        for e in WL.events
        if e.object["kind"] == "Pod" and WL.start + 600 <= e.at < WL.start + 1200
    ]
    assert [
        (e["type"], e["object"]["metadata"]["uid"]) for e in seen if e["type"] != "BOOKMARK"
    ] == expected
    # bookmarks are rare, as on a real server: one, shortly before timeoutSeconds
    assert [e["type"] for e in seen].count("BOOKMARK") == 1 and seen[-1]["type"] == "BOOKMARK"
    # the server's own order (a client never compares versions)
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in seen]
    assert rvs == sorted(rvs) and rvs[0] > int(rv)


def _watch_types(api: ApiServer, kube: client.ApiClient, seconds: int) -> list[str]:
    v1 = client.CoreV1Api(kube)
    rv = json.loads(v1.list_node(_preload_content=False).data)["metadata"]["resourceVersion"]
    resp = v1.list_node(
        watch=True,
        resource_version=rv,
        allow_watch_bookmarks=True,
        timeout_seconds=seconds,
        _preload_content=False,
    )
    return [e["type"] for e in watch_lines(resp)]


@pytest.mark.parametrize(
    ("mode", "bookmarks"), [("none", 0), ("rare", 1), ("every-second", (3, 6))]
)
def test_bookmarks_on_a_quiet_watch_are_rare_absent_or_frequent(mode, bookmarks):
    with ApiServer(bookmarks=mode, bookmark_interval=0.5) as api:
        path = Path(tempfile.mkdtemp(dir="/tmp")) / "kubeconfig"
        kube = config.new_client_from_config(str(api.write_kubeconfig(path)))
        types = _watch_types(api, kube, 3)
    assert set(types) <= {"BOOKMARK"}
    if isinstance(bookmarks, tuple):
        assert bookmarks[0] <= len(types) <= bookmarks[1]
    else:
        assert len(types) == bookmarks
    with pytest.raises(ValueError, match="bookmarks"):
        ApiServer(bookmarks="sometimes")


def test_versions_are_a_fresh_epoch_per_server():
    # opaque to clients: a second server's versions may be lower than the first's
    low, high = ApiServer(first_version=1_000), ApiServer(first_version=900_000)
    assert low.resource_version < high.resource_version
    firsts = {ApiServer().resource_version for _ in range(5)}
    assert len(firsts) > 1


def test_a_version_never_handed_out_is_silence_to_a_watch_and_too_large_to_a_list(apiserver, kube):
    """As a real kube-apiserver 1.36 (watch cache on) answered (docs/real-kube-apiserver.md):
    a watch from a version it has not reached gets HTTP 200 and nothing until timeoutSeconds;
    a one-item list NotOlderThan it gets 504 "Too large resource version"."""
    v1 = client.CoreV1Api(kube)
    ahead = str(apiserver.resource_version + 1000)
    started = time.monotonic()
    lines = watch_lines(
        v1.list_node(watch=True, resource_version=ahead, timeout_seconds=1, _preload_content=False)
    )
    assert list(lines) == [] and time.monotonic() - started >= 0.9
    with pytest.raises(client.ApiException) as err:
        v1.list_node(resource_version=ahead, resource_version_match="NotOlderThan", limit=1)
    assert err.value.status == 504 and "Too large resource version" in str(err.value.body)
    current = str(apiserver.resource_version)
    v1.list_node(resource_version=current, resource_version_match="NotOlderThan", limit=1)


def test_over_an_etcd_without_progress_notify_only_an_exact_list_tells_reached(tmp_path):
    """As a real kube-apiserver 1.36.2 over etcd 3.5.1 (no RequestWatchProgress) answered
    (docs/real-kube-apiserver.md): a quiet kind's watch cache stays at its last change, so a
    one-item list NotOlderThan a version the server handed out since (here by a write of
    another kind, and returned by a consistent list) gets 504 "Too large resource version";
    a one-item list at exactly that version gets 200, and at one not handed out 504."""
    with ApiServer(progress_notify=False) as api:
        v1 = client.CoreV1Api(
            config.new_client_from_config(str(api.write_kubeconfig(tmp_path / "k")))
        )
        api.apply("ADDED", {"kind": "Node", "metadata": {"name": "n1"}})
        api.apply("ADDED", {"kind": "Namespace", "metadata": {"name": "team-a"}})
        handed_out = json.loads(v1.list_node(limit=1, _preload_content=False).data)["metadata"][
            "resourceVersion"
        ]
        with pytest.raises(ApiException) as err:
            v1.list_node(
                resource_version=handed_out, resource_version_match="NotOlderThan", limit=1
            )
        assert err.value.status == 504 and "Too large resource version" in str(err.value.body)
        v1.list_node(resource_version=handed_out, resource_version_match="Exact", limit=1)
        v1.list_namespace(
            resource_version=handed_out, resource_version_match="NotOlderThan", limit=1
        )
        ahead = str(int(handed_out) + 1000)
        for match in ("Exact", "NotOlderThan"):
            with pytest.raises(ApiException) as err:
                v1.list_node(resource_version=ahead, resource_version_match=match, limit=1)
            assert err.value.status == 504 and "Too large resource version" in str(err.value.body)
    with ApiServer() as api:  # over etcd 3.6 the cache catches up: both lists answer
        v1 = client.CoreV1Api(
            config.new_client_from_config(str(api.write_kubeconfig(tmp_path / "k")))
        )
        api.apply("ADDED", {"kind": "Node", "metadata": {"name": "n1"}})
        api.apply("ADDED", {"kind": "Namespace", "metadata": {"name": "team-a"}})
        handed_out = str(api.resource_version)
        for match in ("Exact", "NotOlderThan"):
            v1.list_node(resource_version=handed_out, resource_version_match=match, limit=1)


def test_a_watcher_that_stops_reading_is_closed_by_the_server():
    with ApiServer(unresponsive_after=0.5) as api:
        api.apply("ADDED", {"kind": "Namespace", "metadata": {"name": "big"}})
        with socket.create_connection(("127.0.0.1", api.port)) as conn:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            conn.sendall(
                b"GET /api/v1/namespaces?watch=true&resourceVersion=0&timeoutSeconds=60 "
                b"HTTP/1.1\r\nHost: x\r\n\r\n"
            )
            wait_for(lambda: api.active_watches == 1, 5, "the watch")
            # the client reads nothing while the cluster writes far more than the socket
            # buffers hold (loopback buffers grow to megabytes)
            label = "x" * 60_000
            for i in range(2000):
                api.apply(
                    "MODIFIED",
                    {
                        "kind": "Namespace",
                        "metadata": {"name": "big", "annotations": {"n": f"{i}{label}"}},
                    },
                )
                if api.active_watches == 0:
                    break
            wait_for(lambda: api.active_watches == 0, 10, "the server to close the watch")


def test_too_old_resource_version_gets_410(apiserver, kube):
    Driver(apiserver, WL).run(until=WL.start + 600)
    v1 = client.CoreV1Api(kube)
    rv = json.loads(v1.list_node(_preload_content=False).data)["metadata"]["resourceVersion"]
    apiserver.force_gone()
    (err,) = watch_lines(v1.list_node(watch=True, resource_version=rv, _preload_content=False))
    assert err["type"] == "ERROR" and err["object"]["code"] == 410
    with pytest.raises(ApiException) as exc:
        v1.list_node(resource_version=rv, resource_version_match="Exact")
    assert exc.value.status == 410


def test_stalled_watch_sends_nothing_until_the_client_times_out(apiserver, kube):
    v1 = client.CoreV1Api(kube)
    resp = v1.list_node(
        watch=True,
        resource_version="0",
        allow_watch_bookmarks=True,
        timeout_seconds=30,
        _preload_content=False,
        _request_timeout=(2, 0.6),
    )
    time.sleep(0.1)
    apiserver.stall_watches()
    time.sleep(0.3)
    Driver(apiserver, WL).run(until=WL.start + 60)
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        list(watch_lines(resp))


def test_cut_and_refused_connections(apiserver, kube):
    v1 = client.CoreV1Api(kube)
    resp = v1.list_pod_for_all_namespaces(
        watch=True, resource_version="0", timeout_seconds=30, _preload_content=False
    )
    threading.Timer(0.3, apiserver.cut_watches).start()
    t0 = time.monotonic()
    with pytest.raises(urllib3.exceptions.ProtocolError):
        list(watch_lines(resp))
    assert time.monotonic() - t0 < 5
    apiserver.refuse_for(0.8)
    with pytest.raises(urllib3.exceptions.MaxRetryError):
        v1.list_node(_request_timeout=1)
    time.sleep(1.2)
    assert v1.list_node(_request_timeout=2).items == []


def test_lease_conflicts_and_node_patches(apiserver, kube):
    co = client.CoordinationV1Api(kube)
    body = client.V1Lease(metadata={"name": "lock"}, spec=client.V1LeaseSpec(holder_identity="a"))
    co.create_namespaced_lease("kube-system", body)
    with pytest.raises(ApiException) as exc:
        co.create_namespaced_lease("kube-system", body)
    assert exc.value.status == 409
    mine = co.read_namespaced_lease("lock", "kube-system")
    theirs = co.read_namespaced_lease("lock", "kube-system")
    theirs.spec.holder_identity = "b"
    co.replace_namespaced_lease("lock", "kube-system", theirs)
    mine.spec.holder_identity = "a2"
    with pytest.raises(ApiException) as exc:
        co.replace_namespaced_lease("lock", "kube-system", mine)
    assert exc.value.status == 409
    assert co.read_namespaced_lease("lock", "kube-system").spec.holder_identity == "b"

    Driver(apiserver, WL).run(until=WL.start + 1)
    v1 = client.CoreV1Api(kube)
    v1.patch_node(
        "gpu-h100-0", {"spec": {"taints": [{"key": "gpu-unhealthy", "effect": "NoSchedule"}]}}
    )
    v1.patch_node_status(
        "gpu-h100-0", {"status": {"conditions": [{"type": "GPUHealthy", "status": "False"}]}}
    )
    node = v1.read_node("gpu-h100-0")
    assert [t.key for t in node.spec.taints] == ["gpu-unhealthy"]
    assert [c.type for c in node.status.conditions] == ["Ready", "GPUHealthy"]
    with pytest.raises(ApiException) as exc:
        v1.read_node("nope")
    assert exc.value.status == 404


def test_merge_patch_rules():
    assert merge_patch({"a": 1, "b": {"c": 2}}, {"b": {"c": None, "d": 3}}) == {
        "a": 1,
        "b": {"d": 3},
    }
    conds = {"conditions": [{"type": "Ready", "status": "True"}]}
    merged = merge_patch(
        conds, {"conditions": [{"type": "Ready", "status": "False"}, {"type": "X"}]}, True
    )
    assert merged == {"conditions": [{"type": "Ready", "status": "False"}, {"type": "X"}]}
    assert merge_patch(conds, {"conditions": [{"type": "X"}]}) == {"conditions": [{"type": "X"}]}


def gpu_pod(name: str, gpus: int, cpu: bool = True) -> dict:
    extra = {"cpu": "1"} if cpu else {}
    limits = {"nvidia.com/gpu": str(gpus), **extra}
    return {
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}]},
    }


def test_quota_admission_refuses_past_hard_and_counts_every_pod(apiserver, kube):
    """Issue 18 (fails on 6c36c52, whose stand-in admitted any pod and never touched a quota's
    status.used): the real server's quota admission, as seen on kube-apiserver 1.36."""
    core = client.CoreV1Api(kube)
    core.create_namespace({"metadata": {"name": "qa"}})
    quota = {
        "metadata": {"name": "gpu"},
        "spec": {"hard": {"requests.nvidia.com/gpu": "2"}},
        "status": {"hard": {"requests.nvidia.com/gpu": "2"}, "used": {}},
    }
    core.create_namespaced_resource_quota("qa", quota)
    seen: list[str] = []
    for i in range(2):  # two pods in the same second: two quota updates
        core.create_namespaced_pod("qa", gpu_pod(f"p{i}", 1))
        used = core.read_namespaced_resource_quota("gpu", "qa").status.used
        seen.append(used["requests.nvidia.com/gpu"])
    assert seen == ["1", "2"]
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod("qa", gpu_pod("p2", 1))
    assert refused.value.status == 403
    assert json.loads(refused.value.body)["message"] == (
        'pods "p2" is forbidden: exceeded quota: gpu, requested: requests.nvidia.com/gpu=1, '
        "used: requests.nvidia.com/gpu=2, limited: requests.nvidia.com/gpu=2"
    )
    assert core.list_namespaced_pod("qa").items and len(core.list_namespaced_pod("qa").items) == 2
    core.delete_namespaced_pod("p0", "qa")
    used = core.read_namespaced_resource_quota("gpu", "qa").status.used
    assert used["requests.nvidia.com/gpu"] == "1"
    core.create_namespaced_pod("qa", gpu_pod("p2", 1))  # room again


def test_quota_scopes_select_pods(apiserver, kube):
    core = client.CoreV1Api(kube)
    core.create_namespace({"metadata": {"name": "qb"}})
    hard = {"requests.nvidia.com/gpu": "1"}
    quota = {"metadata": {"name": "gpu"}, "spec": {"hard": hard, "scopes": ["NotBestEffort"]}}
    core.create_namespaced_resource_quota("qb", quota)
    core.create_namespaced_pod("qb", gpu_pod("be", 4, cpu=False))  # BestEffort: not counted
    core.create_namespaced_pod("qb", gpu_pod("g", 1))
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod("qb", gpu_pod("g2", 1))
    assert refused.value.status == 403
