"""`gpuquota report` with DRA claims beside device-plugin pods: a generated workload (its own
truth, sim/workload.py dra=True) replayed into SQLite and PostgreSQL, reported in every view
with the allocation path as a key, and device-class quota like requests.nvidia.com/gpu."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import UTC
from fractions import Fraction
from typing import Any

import pytest

from gpuquota.quota import accounting as acc
from gpuquota.quota.accounting.accountant import Accountant
from gpuquota.quota.report import build, compute, period
from gpuquota.quota.store import db
from gpuquota.sim.workload import DRA_MODEL, DRA_NAMESPACE, DRA_NODE, Workload, generate, rfc3339
from tests.report.conftest import Store

WL = generate(3, 2.0, dra=True)


def load(store: Store, workload: Workload) -> None:
    with db.open_store(store.url) as opened:
        # the generator names node pools with `node-pool`
        config = acc.AccountingConfig(node_pool_labels=("node-pool",))
        accountant = Accountant(opened, "c1", config)
        for event in workload.events:
            accountant.apply(event.type, event.object, event.at)
        accountant.heartbeat(workload.end)
        accountant.flush()


def run(report: Any, store: Store, *argv: str) -> dict[str, Any]:
    window = ("--from", rfc3339(WL.start), "--to", rfc3339(WL.end), "--now", rfc3339(WL.end))
    result = report(*window, *argv, "--format", "json", db=store)
    assert result.rc == 0, result.err
    doc: dict[str, Any] = json.loads(result.out)
    return doc


def groups(doc: dict[str, Any]) -> dict[tuple[Any, ...], dict[str, Any]]:
    return {tuple(r["group"].values()): r for r in doc["rows"]}


def test_dra_usage_beside_device_plugin_usage_in_every_view(store: Store, report: Any) -> None:
    load(store, WL)
    dra_raw: dict[str, int] = defaultdict(int)
    dra_phys: dict[str, Fraction] = defaultdict(Fraction)
    for (ns, _class), raw in WL.truth.dra_gpu_seconds().items():
        dra_raw[ns] += raw
    for (ns, _class), phys in WL.truth.dra_physical_seconds_exact().items():
        dra_phys[ns] += phys
    plugin_raw: dict[str, int] = defaultdict(int)
    for (ns, _resource), raw in WL.truth.gpu_seconds().items():
        plugin_raw[ns] += raw

    by_path = groups(run(report, store, "--by", "namespace,path"))
    assert by_path[(DRA_NAMESPACE, "dra")]["gpu_seconds_raw"] == dra_raw[DRA_NAMESPACE]
    assert by_path[(DRA_NAMESPACE, "dra")]["gpu_hours_physical"] == pytest.approx(
        float(dra_phys[DRA_NAMESPACE]) / 3600, abs=0.01
    )
    # the extended-resource pod: device-plugin usage of the DRA team, charged once
    assert by_path[(DRA_NAMESPACE, "device-plugin")]["gpu_seconds_raw"] == plugin_raw[DRA_NAMESPACE]
    assert by_path[("team-a", "device-plugin")]["gpu_seconds_raw"] == plugin_raw["team-a"]
    assert not any(path == "dra" and ns != DRA_NAMESPACE for ns, path in by_path)

    # the plain namespace view adds both paths
    by_ns = groups(run(report, store))
    assert (
        by_ns[(DRA_NAMESPACE,)]["gpu_seconds_raw"]
        == dra_raw[DRA_NAMESPACE] + plugin_raw[DRA_NAMESPACE]
    )
    # by resource: the device classes, as the truth has them
    by_resource = groups(run(report, store, "--by", "resource,path"))
    for (_ns, device_class), raw in WL.truth.dra_gpu_seconds().items():
        assert by_resource[(device_class, "dra")]["gpu_seconds_raw"] == raw
    # by model: the slice's productName as the node label writes it
    by_model = groups(run(report, store, "--by", "model,path"))
    assert by_model[(DRA_MODEL, "dra")]["gpu_seconds_raw"] == dra_raw[DRA_NAMESPACE]
    # by namespace label (team), split where labels changed
    by_team = groups(run(report, store, "--by", "label:team,path"))
    assert by_team[("gamma", "dra")]["gpu_seconds_raw"] == dra_raw[DRA_NAMESPACE]
    # by owner: a shared claim's time split among the pods using it (one Deployment here)
    by_owner = groups(run(report, store, "--by", "owner,path"))
    assert (f"{DRA_NAMESPACE}/Deployment/infer", "dra") in by_owner
    # by pod: each pod's equal share of the shared claim's time at each instant
    by_pod = groups(run(report, store, "--by", "pod,path"))
    assert (f"{DRA_NAMESPACE}/infer-7c9d8f-a1b2c", "dra") in by_pod
    assert sum(
        r["gpu_seconds_raw"] for (_p, path), r in by_pod.items() if path == "dra"
    ) == pytest.approx(dra_raw[DRA_NAMESPACE], abs=0.001)


def exact(store: Store, *keys: str) -> dict[tuple[str | None, ...], compute.Group]:
    """The computed report's groups, exact (Fractions), for the generated span."""
    request = build.ReportRequest(period.Period(WL.start, WL.end, UTC), WL.end, keys)
    with store.engine.connect() as conn:
        return {g.keys: g for g in build.build_report(conn, request).groups}


SHARED_PODS = ("infer-7c9d8f-a1b2c", "infer-7c9d8f-d3e4f", "shared-late-0")


def test_shared_claim_split_equally_among_its_pods_by_pod_level_keys(store: Store) -> None:
    """Grouped by pod or owner, a shared claim's time at each instant is split equally among
    the pods using it then (accounting.md): exactly the generator's own split, raw and
    physical; namespace, namespace-label and path totals are the claim's whole time."""
    load(store, WL)
    truth = WL.truth
    # the generator's shared claim: two of its three pods overlap, so some time is split
    shared = [s for s in truth.dra_pod_shares if s.claim_name == "shared-gpu"]
    assert {s.pod_name for s in shared} == set(SHARED_PODS)
    assert {s.sharers for s in shared} == {1, 2}

    by_pod = exact(store, "pod", "path")
    per_pod = truth.dra_split_seconds(lambda s: f"{s.namespace}/{s.pod_name}")
    dra_pods = {k[0]: g for k, g in by_pod.items() if k[1] == "dra"}
    assert set(dra_pods) == set(per_pod)
    for pod, (raw, phys) in per_pod.items():
        assert (dra_pods[pod].raw_seconds, dra_pods[pod].physical_seconds) == (raw, phys), pod
    # the overlapping pods' halves are not whole seconds here: the split is really fractional
    assert any(g.raw_seconds.denominator > 1 for g in dra_pods.values())

    by_owner = exact(store, "owner", "path")
    per_owner = truth.dra_split_seconds(lambda s: f"{s.namespace}/{s.owner}")  # within its ns
    dra_owners = {k[0]: g for k, g in by_owner.items() if k[1] == "dra"}
    assert set(dra_owners) == set(per_owner)
    for owner, (raw, phys) in per_owner.items():
        assert (dra_owners[owner].raw_seconds, dra_owners[owner].physical_seconds) == (
            raw,
            phys,
        ), owner

    # a pod-level key beside a claim-level one: the pod's share per namespace label
    by_team_pod = exact(store, "label:team", "pod", "path")
    for pod, (raw, _phys) in per_pod.items():
        assert by_team_pod[("gamma", pod, "dra")].raw_seconds == raw

    # claim-level keys keep the claim's whole time: the namespace total is the truth's union
    dra_raw = sum(v for (ns, _c), v in truth.dra_gpu_seconds().items() if ns == DRA_NAMESPACE)
    dra_phys = sum(
        v for (ns, _c), v in truth.dra_physical_seconds_exact().items() if ns == DRA_NAMESPACE
    )
    for keys in (("namespace", "path"), ("label:team", "path")):
        dra = [g for k, g in exact(store, *keys).items() if k[-1] == "dra"]
        assert sum(g.raw_seconds for g in dra) == dra_raw
        assert sum(g.physical_seconds for g in dra) == dra_phys
        assert all(g.raw_seconds.denominator == 1 for g in dra)
    # and the split adds up to the same totals
    assert sum(g.raw_seconds for g in dra_pods.values()) == dra_raw
    assert sum(g.physical_seconds for g in dra_owners.values()) == dra_phys


def test_split_raw_seconds_rows_add_up_to_the_total(store: Store, report: Any) -> None:
    """gpu_seconds_raw with a split claim is rounded like every column: rows sum to the total."""
    load(store, WL)
    doc = run(report, store, "--by", "pod")
    shown = [r["gpu_seconds_raw"] for r in doc["rows"]]
    assert any(v != int(v) for v in shown)
    assert round(sum(shown) * 1000) == round(doc["total"]["gpu_seconds_raw"] * 1000)
    total_raw = sum(WL.truth.dra_gpu_seconds().values()) + sum(WL.truth.gpu_seconds().values())
    assert doc["total"]["gpu_seconds_raw"] == total_raw


def test_device_class_quota_is_reported_like_gpu_quota(store: Store, report: Any) -> None:
    load(store, WL)
    doc = run(report, store, "--by", "namespace")
    rows = {
        (r["group"]["namespace"], r["resource"]): r
        for r in doc["quota"]["rows"]
        if r["group"]["namespace"] == DRA_NAMESPACE
    }
    gpu_class = (DRA_NAMESPACE, "gpu.nvidia.com.deviceclass.resource.k8s.io/devices")
    mig_class = (DRA_NAMESPACE, "mig.nvidia.com.deviceclass.resource.k8s.io/devices")
    assert gpu_class in rows and mig_class in rows
    assert rows[gpu_class]["quota_peak_hard"] == 6
    assert rows[mig_class]["quota_peak_hard"] == 4
    assert 0 < rows[gpu_class]["quota_avg_used"] < rows[gpu_class]["quota_peak_used"] <= 6
    assert (DRA_NAMESPACE, "nvidia.com/gpu") in rows  # the extended-resource quota beside it


def test_idle_counts_dra_devices_as_capacity(store: Store, report: Any) -> None:
    load(store, WL)
    doc = run(report, store, "--by", "model", "--idle")
    # no pod of another path runs in the DRA pool but the DRA team's extended-resource pod
    idle = {(r["model"], r["node_pool"]): r for r in doc["idle"]["rows"]}
    # the DRA node's slice: 5 whole H100s and a MIG-partitioned one (3 x 1/7 + 3/7)
    span_hours = (WL.end - WL.start) / 3600
    dra_row = idle[(DRA_MODEL, DRA_NODE.pool)]
    assert dra_row["allocatable_gpu_hours"] == pytest.approx((5 + 6 / 7) * span_hours, abs=0.01)
    dra_phys = sum(WL.truth.dra_physical_seconds_exact().values())
    plugin_phys = sum(
        v for (ns, _r), v in WL.truth.physical_seconds_exact().items() if ns == DRA_NAMESPACE
    )
    assert dra_row["allocated_gpu_hours"] == pytest.approx(
        float(dra_phys + plugin_phys) / 3600, abs=0.01
    )
