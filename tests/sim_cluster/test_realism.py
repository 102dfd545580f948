"""Real-size pods (gpuquota.sim.realism): the shape and size a real 1.36 server returns, and
the accounting answering the same with and without them."""

from __future__ import annotations

import copy
import json
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.pool import StaticPool

from gpuquota.kube.client import stub_event
from gpuquota.quota import accounting as acc
from gpuquota.quota.accounting.accountant import Accountant
from gpuquota.quota.accounting.rules.claims import pod_claims
from gpuquota.quota.store.db import Store
from gpuquota.quota.store.models import Base
from gpuquota.sim.apiserver import ApiServer
from gpuquota.sim.realism import SA_MOUNT, dress
from gpuquota.sim.workload import Workload, generate
from tests.store import rows

WL = generate(3, 2.0, dra=True)


def compact(obj: dict[str, Any]) -> int:
    item = {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}
    return len(json.dumps(item, separators=(",", ":")))


def pods(wl: Workload) -> list[dict[str, Any]]:
    return [e.object for e in wl.events if e.object["kind"] == "Pod"]


def test_dressed_pods_have_what_a_real_server_adds() -> None:
    running = next(p for p in pods(WL) if p["status"].get("phase") == "Running")
    d = dress(running)
    meta, spec, status = d["metadata"], d["spec"], d["status"]
    assert list(d)[:3] == ["kind", "apiVersion", "metadata"]
    assert list(meta)[:4] == ["name", "namespace", "uid", "resourceVersion"]
    managers = [(e["manager"], e.get("subresource")) for e in meta["managedFields"]]
    assert ("kubelet", "status") in managers and ("kube-scheduler", "status") in managers
    assert all(e["fieldsType"] == "FieldsV1" and e["fieldsV1"] for e in meta["managedFields"])
    volume = next(v for v in spec["volumes"] if v["name"].startswith("kube-api-access-"))
    sources = [next(iter(s)) for s in volume["projected"]["sources"]]
    assert sources == ["serviceAccountToken", "configMap", "downwardAPI"]
    for c in spec["containers"]:
        assert {"name": volume["name"], "readOnly": True, "mountPath": SA_MOUNT} in c[
            "volumeMounts"
        ]
        assert c["terminationMessagePath"] == "/dev/termination-log"
    assert spec["dnsPolicy"] == "ClusterFirst" and spec["securityContext"] == {}
    assert spec["enableServiceLinks"] is True and spec["preemptionPolicy"]
    assert {t["key"] for t in spec["tolerations"]} >= {
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    }
    assert {c["type"] for c in status["conditions"]} == {
        "PodScheduled",
        "Initialized",
        "ContainersReady",
        "Ready",
        "PodReadyToStartContainers",
    }
    assert status["hostIPs"] == [{"ip": status["hostIP"]}] and status["podIP"]
    assert all(
        cs["containerID"].startswith("containerd://") and "@sha256:" in cs["imageID"]
        for cs in status["containerStatuses"]
        if "running" in cs["state"] or "terminated" in cs["state"]
    )
    assert status["qosClass"] == running["status"]["qosClass"]
    # dressing is idempotent (the stand-in dresses on every write) and leaves its input alone
    assert dress(d) == d
    assert dress(running) == d and "managedFields" not in running["metadata"]


def test_mean_size_is_a_real_servers() -> None:
    # a real 1.36.2 server returned 4.66 kB per running pod, 1.7 kB of it managedFields
    # (../shared/kube-apiserver.md); pending pods are smaller there too
    objs = pods(WL)
    running = [p for p in objs if p["status"].get("phase") == "Running"]
    mean = sum(compact(dress(p)) for p in running) / len(running)
    assert 4300 <= mean <= 5400, mean
    fields = [compact({"f": dress(p)["metadata"]["managedFields"]}) for p in running]
    assert 1400 <= sum(fields) / len(fields) <= 2300
    plain = sum(map(compact, objs)) / len(objs)
    assert sum(compact(dress(p)) for p in objs) / len(objs) > 2 * plain


def test_accounting_reads_the_same_facts_from_dressed_pods() -> None:
    config = acc.AccountingConfig()
    for obj in pods(WL):
        d = dress(obj)
        assert acc.pod_facts(d, config) == acc.pod_facts(obj, config)
        assert pod_claims(d) == pod_claims(obj)


def _replay(wl: Workload, dressed: bool) -> dict[str, Any]:
    engine = create_engine(
        "sqlite://", poolclass=StaticPool, connect_args={"check_same_thread": False}
    )
    Base.metadata.create_all(engine)
    store = Store("sqlite://", engine)
    accountant = Accountant(store, "c", dra_drivers=("gpu.nvidia.com",))
    for i, e in enumerate(wl.events):
        obj = copy.deepcopy(e.object)
        if dressed and obj["kind"] == "Pod":
            obj = dress(obj)
        accountant.apply(e.type, obj, e.at)
        if i % 200 == 0:
            accountant.flush()
    accountant.flush()
    return rows.everything(store, "c", without_updated_at=True)


def test_accounting_answers_the_same_with_and_without_dressing() -> None:
    plain = _replay(WL, dressed=False)
    assert plain["allocations"] and plain["claims"]
    assert _replay(WL, dressed=True) == plain


def test_the_stand_in_serves_dressed_pods_in_the_real_servers_encoding() -> None:
    obj = next(p for p in pods(WL) if p["status"].get("phase") == "Running")
    # the first version pinned: a stand-in starts each run at a random epoch, as versions are
    # opaque and not comparable across servers
    with ApiServer(realistic=False, first_version=100) as plain_api, ApiServer() as real_api:
        as_written = plain_api.apply("ADDED", obj)
        assert as_written == {**obj, "metadata": {**obj["metadata"], "resourceVersion": "101"}}
        stored = real_api.apply("ADDED", obj)
        want = dress(obj)
        want["metadata"]["resourceVersion"] = stored["metadata"]["resourceVersion"]
        assert stored == want
        line = real_api.state.history[-1][3]
    # the watch line starts as Go encodes it, so the client can read a stub without decoding
    stub = stub_event(line)
    assert stub is not None
    assert stub["object"]["metadata"] == {
        k: stored["metadata"][k] for k in ("name", "namespace", "uid", "resourceVersion")
    }
