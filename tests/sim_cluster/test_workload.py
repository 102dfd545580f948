"""The workload generator is the oracle: check it is deterministic and self-consistent."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime
from fractions import Fraction

import pytest

from gpuquota.sim import workload
from gpuquota.sim.workload import generate, rfc3339


def ts(s: str) -> int:
    return int(datetime.strptime(s, "%Y-%m-%dT%H:%M:%S%z").timestamp())


@pytest.fixture(scope="module", params=[False, True], ids=["replay", "independent"])
def wl(request):
    return generate(7, 2.0, observation_independent=request.param)


def test_same_seed_same_events_and_truth():
    a, b = generate(3, 1.0), generate(3, 1.0)
    assert [e.line() for e in a.events] == [e.line() for e in b.events]
    assert a.truth.gpu_seconds() == b.truth.gpu_seconds()
    assert [e.line() for e in generate(4, 1.0).events] != [e.line() for e in a.events]


def test_events_are_a_valid_watch_stream(wl):
    live: dict[tuple[str, str, str], str] = {}
    last_rv, last_at = 0, 0
    for ev in wl.events:
        meta = ev.object["metadata"]
        rv = int(meta["resourceVersion"])
        assert rv > last_rv and ev.at >= last_at
        last_rv, last_at = rv, ev.at
        key = (ev.object["kind"], meta.get("namespace", ""), meta["name"])
        if ev.type == "ADDED":
            assert key not in live, f"{key} added twice"
            live[key] = meta["uid"]
        else:
            assert live.get(key) == meta["uid"], f"{ev.type} of unknown {key}"
            if ev.type == "DELETED":
                del live[key]
    assert wl.start <= wl.events[0].at and wl.events[-1].at < wl.end


def test_every_case_is_covered(wl):
    reasons = {iv.reason for iv in wl.truth.intervals}
    assert {"terminated", "deleted", "node_deleted", "open"} <= reasons
    resources = {iv.resource for iv in wl.truth.intervals}
    assert {workload.GPU, workload.GPU_SHARED, workload.MIG_1G, workload.MIG_3G} <= resources
    names = [iv.pod_name for iv in wl.truth.intervals if iv.pod_name == "trainer-0"]
    uids = {iv.pod_uid for iv in wl.truth.intervals if iv.pod_name == "trainer-0"}
    assert len(names) == 2 and len(uids) == 2  # name reused with a new UID
    pods = {e.object["metadata"]["uid"]: e.object for e in wl.events if e.object["kind"] == "Pod"}
    never = [p for p in pods.values() if "startTime" not in p["status"]]
    assert never, "some pods are never started"
    assert not {p["metadata"]["uid"] for p in never} & {iv.pod_uid for iv in wl.truth.intervals}
    shapes = {json.dumps(sorted(p["spec"])) for p in pods.values()}
    assert any("initContainers" in s for s in shapes) and any("overhead" in s for s in shapes)
    kinds = {e.object["kind"] for e in wl.events}
    assert kinds == {"Node", "Namespace", "ResourceQuota", "Pod"}
    assert any(e.type == "DELETED" and e.object["kind"] == "Node" for e in wl.events)


def test_truth_agrees_with_object_timestamps(wl):
    """Starts are status.startTime; in independent mode every end is an object timestamp."""
    last: dict[str, dict] = {}
    for ev in wl.events:
        if ev.object["kind"] == "Pod":
            last[ev.object["metadata"]["uid"]] = ev.object
    node_deleted = next(
        e.at for e in wl.events if e.type == "DELETED" and e.object["kind"] == "Node"
    )
    for iv in wl.truth.intervals:
        obj = last[iv.pod_uid]
        assert ts(obj["status"]["startTime"]) == iv.start
        assert obj["spec"]["nodeName"] == iv.node
        if iv.end is None:
            continue
        assert iv.end > iv.start or iv.reason == "deleted"
        if iv.reason == "node_deleted":
            assert iv.end == node_deleted
        if wl.events[0] and iv.reason == "terminated" and "containerStatuses" in obj["status"]:
            ends = [
                ts(cs["state"]["terminated"]["finishedAt"])
                for cs in obj["status"]["containerStatuses"]
            ]
            assert max(ends) == iv.end
        if iv.reason == "deleted" and "deletionTimestamp" in obj["metadata"]:
            assert iv.end <= ts(obj["metadata"]["deletionTimestamp"])
    independent = all(
        "containerStatuses" in last[iv.pod_uid]["status"]
        for iv in wl.truth.intervals
        if iv.reason == "terminated"
    )
    if independent:
        for iv in wl.truth.intervals:
            obj = last[iv.pod_uid]
            if iv.reason in ("deleted", "node_deleted") and "deletionTimestamp" in obj["metadata"]:
                # either the deadline itself or a DELETED event after it
                assert iv.end <= ts(obj["metadata"]["deletionTimestamp"])


def test_totals_add_up_and_labels_split(wl):
    raw = wl.truth.gpu_seconds()
    phys = wl.truth.physical_seconds()
    assert sum(raw.values()) == sum(iv.units * iv.seconds(wl.end) for iv in wl.truth.intervals)
    assert all(phys[k] <= raw[k] for k in raw)
    by_cc = wl.truth.by_label("cost-center")
    assert sum(v[0] for v in by_cc.values()) == sum(raw.values())
    ml = {k: v for k, v in raw.items() if k[0] == "ml-research"}
    split = {k: v for k, v in by_cc.items() if k[0] in ("cc-300", "cc-310")}
    assert sum(v[0] for v in split.values()) == sum(ml.values())
    assert any(k[0] == "cc-310" for k in split) and any(k[0] == "cc-300" for k in split)


def test_cli_writes_replay_lines(tmp_path):
    truth = tmp_path / "truth.json"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuquota.sim.workload",
            "--seed",
            "2",
            "--hours",
            "0.5",
            "--truth",
            str(truth),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    first = json.loads(out[0])
    assert set(first) == {"type", "object", "observedAt"} and first["type"] == "ADDED"
    workload = generate(2, 0.5)
    assert len(out) == len(workload.events) + 1  # and a bookmark where the recording ends
    last = json.loads(out[-1])
    assert last["type"] == "BOOKMARK" and last["observedAt"] == rfc3339(workload.end)
    assert json.loads(truth.read_text())["gpu_seconds"]
    bad = subprocess.run(
        [sys.executable, "-m", "gpuquota.sim.workload", "--hours", "0.01"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "at least 10 minutes" in bad.stderr


@pytest.fixture(scope="module", params=[False, True], ids=["replay", "independent"])
def dra_wl(request):
    return generate(7, 2.0, observation_independent=request.param, dra=True)


def test_dra_workload_is_deterministic_and_a_valid_watch_stream(dra_wl):
    assert generate(7, 2.0, dra=True).truth == generate(7, 2.0, dra=True).truth
    test_events_are_a_valid_watch_stream(dra_wl)
    # without dra the stream is what it always was
    assert [e.line() for e in generate(3, 1.0).events] == [
        e.line() for e in generate(3, 1.0, dra=False).events
    ]


def test_dra_workload_covers_every_claim_case(dra_wl):
    kinds = {e.object["kind"] for e in dra_wl.events}
    assert {"ResourceClaim", "ResourceSlice", "DeviceClass"} <= kinds
    pods = {
        e.object["metadata"]["uid"]: e.object for e in dra_wl.events if e.object["kind"] == "Pod"
    }
    claims = [e.object for e in dra_wl.events if e.object["kind"] == "ResourceClaim"]
    # a template's generated claim, named in the pod's status
    assert any(p["status"].get("resourceClaimStatuses") for p in pods.values())
    # a claim shared by three pods, charged over the union of their intervals: two stretches
    # (the first two overlap; the third starts after a gap)
    shared = [iv for iv in dra_wl.truth.dra_intervals if iv.claim_name == "shared-gpu"]
    assert len(shared) == 2 and shared[0].end is not None and shared[1].start > shared[0].end
    users = {
        p["metadata"]["uid"]
        for p in pods.values()
        for rc in p["spec"].get("resourceClaims", [])
        if rc.get("resourceClaimName") == "shared-gpu"
    }
    assert len(users) == 3
    # MIG and a consumable-capacity share, with their physical fractions
    physical = {iv.claim_name: iv.physical for iv in dra_wl.truth.dra_intervals}
    assert physical["mig-big"] == Fraction(3, 7) and physical["gpu-share"] == Fraction(1, 4)
    # adminAccess, another driver, an extended-resource claim: objects, but no truth
    results = [
        r
        for c in claims
        for r in c["status"].get("allocation", {}).get("devices", {}).get("results", [])
    ]
    assert any(r.get("adminAccess") for r in results)
    assert any(r["driver"] == "fpga.example.com" for r in results)
    assert any(p["status"].get("extendedResourceClaimStatus") for p in pods.values())
    charged = {iv.claim_name for iv in dra_wl.truth.dra_intervals}
    assert not charged & {"monitor-gpus", "fpga-0"}
    assert not any(name.startswith("ext-0") for name in charged)
    # the extended-resource pod is device-plugin truth on the DRA node
    (ext,) = [iv for iv in dra_wl.truth.intervals if iv.pod_name == "ext-0"]
    assert (ext.resource, ext.node) == (workload.GPU, workload.DRA_NODE.name)
    # no empty stretch: a claim's truth opens and closes only when its holders change
    assert all(iv.end is None or iv.end > iv.start for iv in dra_wl.truth.dra_intervals)


@pytest.mark.parametrize("seed", [1, 7, 11])
def test_quota_admission_keeps_used_under_hard(seed):
    """Issue 18 (fails on 6c36c52, where team-a's quota showed used 53 of hard 24): the
    generator admits a pod only where every matching quota has room, as the real quota
    admission plugin does, so no ResourceQuota it writes has used above hard (hard is never
    lowered here), and what it turned away carries the real server's message."""
    wl = generate(seed, 8.0, pods_per_hour=60, dra=True)
    quotas = [e.object for e in wl.events if e.object["kind"] == "ResourceQuota"]
    assert quotas
    for quota in quotas:
        for key, hard in quota["status"]["hard"].items():
            used = int(quota["status"]["used"].get(key, "0"))
            assert used <= int(hard), (quota["metadata"]["namespace"], key, used, hard)
    assert wl.truth.refused, "a busy span meets its quotas"
    _t, ns, name, message = wl.truth.refused[0]
    assert message.startswith(f'pods "{name}" is forbidden: exceeded quota: gpu-quota, ')
    assert "requested: requests.nvidia.com/" in message and ", limited: " in message
    refused = {(n, name) for _t, n, name, _m in wl.truth.refused}
    created = {
        (e.object["metadata"]["namespace"], e.object["metadata"]["name"])
        for e in wl.events
        if e.object["kind"] == "Pod"
    }
    assert not refused & created  # a refused create leaves no object and no event
    # the truth's quota history is what the events say
    peaks = wl.truth.quota_peaks()
    for quota in quotas:
        ns = quota["metadata"]["namespace"]
        for key, used in quota["status"]["used"].items():
            if (ns, key) in peaks:
                assert int(used) <= peaks[(ns, key)][0]


def test_quota_refusal_rule():
    hard = {"requests.nvidia.com/gpu": "2", "requests.cpu": "10"}
    assert workload.quota_refusal("gpu", hard, {"requests.nvidia.com/gpu": "1"}, {}) is None
    fits = {"requests.nvidia.com/gpu": 1}
    assert workload.quota_refusal("gpu", hard, {"requests.nvidia.com/gpu": "1"}, fits) is None
    assert workload.quota_refusal("gpu", hard, {"requests.nvidia.com/gpu": "2"}, fits) == (
        "exceeded quota: gpu, requested: requests.nvidia.com/gpu=1, "
        "used: requests.nvidia.com/gpu=2, limited: requests.nvidia.com/gpu=2"
    )
    # a resource the quota does not limit is never refused
    assert workload.quota_refusal("gpu", hard, {}, {"requests.amd.com/gpu": 9}) is None
