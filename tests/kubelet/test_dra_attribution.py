"""DRA attribution: pod-resources ``dynamic_resources`` resolved to GPU and MIG UUIDs through
the node's ResourceSlices (kubelet stand-in over gRPC, API server stand-in over HTTP)."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import pytest

from gpuquota.exporter.enrich.admin_access import admin_devices, claim_path
from gpuquota.exporter.enrich.claimreader import AdminAccessClaims
from gpuquota.exporter.enrich.dra import DraAttribution
from gpuquota.exporter.enrich.podresources import PodResourcesWatcher
from gpuquota.exporter.enrich.slices import KINDS, SliceIndex, apply_message
from gpuquota.exporter.enrich.slicewatcher import SliceWatcher
from gpuquota.exporter.expose.render import Renderer, RenderOptions
from gpuquota.exporter.snapshot import DeviceSnapshot, MigInfo, NodeSnapshot, PodRef
from gpuquota.kube.client import Kube, load
from gpuquota.kube.messages import Event, Listed, Resync, Synced
from gpuquota.sim.apiserver import ApiServer
from gpuquota.sim.harness import poll, wait_for
from gpuquota.sim.kubelet.podresources import Assignment, ClaimAssignment, PodResourcesServer
from gpuquota.sim.nvml import spec
from gpuquota.sim.nvml.control import SimNode
from gpuquota.sim.nvml.resourceslices import DRIVER, device_uuids, resource_slices
from tests.exporter.scrape import parse
from tests.kubelet.exporter_proc import Exporter, pod_info, scrape

MIXED = spec.load("mixed")  # 2 x H100, an A100 with 3 MIG devices, an L4
NAMES = device_uuids(MIXED)  # DRA device name -> UUID
MIG_NAME = next(n for n in NAMES if "-mig-" in n)


def snapshot() -> NodeSnapshot:
    devices = []
    for g in MIXED.gpus:
        devices.append(DeviceSnapshot(index=g.index, uuid=g.uuid, gpu_utilization_ratio=0.5))
        for m in g.mig:
            devices.append(
                DeviceSnapshot(
                    index=m.gpu_instance_id,
                    uuid=m.uuid,
                    mig=MigInfo(g.uuid, g.index, m.gpu_instance_id, 0, m.profile.name),
                )
            )
    return NodeSnapshot("node-a", "550", "12.550", 12040, tuple(devices), 0.0, 0.01)


def claim(pod: str, name: str, *devices: str, driver: str = DRIVER) -> ClaimAssignment:
    return ClaimAssignment(
        "ml", pod, "main", name, "ml", tuple((driver, "node-a", d) for d in devices)
    )


def test_claims_resolve_to_uuids_like_device_plugin_ids(socket_path: Path, caplog) -> None:
    index = SliceIndex()
    index.replace_all(resource_slices(MIXED, "node-a"))
    dra = DraAttribution(index)
    index.on_problem = dra.count_problem
    kubelet = PodResourcesServer(
        socket_path, [Assignment("legacy", "old", "main", "nvidia.com/gpu", (NAMES["gpu-3"],))]
    )
    kubelet.assign_claim(claim("train", "two-gpus", "gpu-0", "gpu-1"))
    kubelet.assign_claim(claim("infer-a", "shared", "gpu-3"))  # one claim, two pods
    kubelet.assign_claim(claim("infer-b", "shared", "gpu-3"))
    kubelet.assign_claim(claim("notebook", "mig", MIG_NAME))
    kubelet.assign_claim(claim("net", "nic", "eth0", driver="nic.example.com"))
    kubelet.assign_claim(claim("ghost", "stale", "gpu-9"))
    with kubelet, caplog.at_level(logging.INFO):
        watcher = PodResourcesWatcher(socket_path, dra=dra)
        assert watcher.refresh()
        assert watcher.refresh()  # a second List logs and counts nothing new
        snap = watcher.enrich(snapshot())
    pods = {u: {r.pod for r in refs} for u, refs in snap.pods.items()}
    assert pods == {
        NAMES["gpu-0"]: {"train"},
        NAMES["gpu-1"]: {"train"},
        NAMES["gpu-3"]: {"infer-a", "infer-b", "old"},  # DRA beside a device-plugin holder
        NAMES[MIG_NAME]: {"notebook"},
    }
    assert snap.pods[NAMES["gpu-0"]] == (PodRef("ml", "train", "main"),)
    shared = snap.claims[NAMES["gpu-3"]]
    assert [(c.claim, c.pod, c.device) for c in shared] == [
        ("shared", "infer-a", "gpu-3"),
        ("shared", "infer-b", "gpu-3"),
    ]
    assert snap.dra is not None and snap.dra.devices == len(NAMES)
    assert snap.dra.problems_total == {"unknown_driver": 1, "unknown_device": 1, "bad_slice": 0}
    assert caplog.text.count("nic.example.com") == 1
    assert caplog.text.count("gpu.nvidia.com/node-a/gpu-9 is in no ResourceSlice") == 1

    samples = parse(Renderer().render(snap))
    claims = {
        (s["uuid"], s["claim"], s["pod"], s["device"]) for s, _ in samples["gpu_dra_claim_info"]
    }
    assert (NAMES[MIG_NAME], "mig", "notebook", MIG_NAME) in claims
    assert len(claims) == 5
    # --compat dcgm: dcgm-exporter's DRA labels on the holders of DRA-held devices
    dcgm = parse(Renderer(RenderOptions(compat=frozenset({"dcgm"}))).render(snap))
    util = [s for s, _ in dcgm["DCGM_FI_DEV_GPU_UTIL"] if s.get("pod") == "train"]
    assert util and all(
        (s["dra_claim_name"], s["dra_claim_namespace"], s["dra_driver_name"], s["dra_pool_name"])
        == ("two-gpus", "ml", DRIVER, "node-a")
        for s in util
    )
    old = [s for s, _ in dcgm["DCGM_FI_DEV_GPU_UTIL"] if s.get("pod") == "old"]
    assert old and "dra_claim_name" not in old[0]  # device-plugin holders: no dra_* labels
    problems = {s["reason"]: v for s, v in samples["gpuquota_exporter_dra_problems_total"]}
    assert problems == {"unknown_driver": 1.0, "unknown_device": 1.0, "bad_slice": 0.0}


def test_dynamically_created_mig_devices_resolve_through_the_snapshot(socket_path: Path) -> None:
    index = SliceIndex()
    problems: list[str] = []
    index.on_problem = lambda reason, _m: problems.append(reason)
    index.replace_all(resource_slices(MIXED, "node-a", dynamic_mig=True))
    assert problems == []  # a MIG partition without a UUID is not a bad slice
    migs = [n for n in NAMES if "-mig-" in n]
    with PodResourcesServer(socket_path) as kubelet:
        for i, name in enumerate(migs):
            kubelet.assign_claim(claim(f"nb-{i}", f"mig-{i}", name))
        watcher = PodResourcesWatcher(socket_path, dra=DraAttribution(index))
        assert watcher.refresh()
        snap = watcher.enrich(snapshot())
    # each profile exists once on the A100: the claim finds its MIG device's UUID
    assert {u: [r.pod for r in refs] for u, refs in snap.pods.items()} == {
        NAMES[name]: [f"nb-{i}"] for i, name in enumerate(migs)
    }
    assert {c.claim for refs in snap.claims.values() for c in refs} == {"mig-0", "mig-1", "mig-2"}

    # seven 1g.5gb devices per GPU: which one the driver made is unknown, the GPU is known
    a100 = spec.load("a100-mig")
    index.replace_all(resource_slices(a100, "node-a", dynamic_mig=True))
    first = device_uuids(a100)
    name = next(n for n in first if n.startswith("gpu-1-mig-"))
    with PodResourcesServer(socket_path) as kubelet:
        kubelet.assign_claim(claim("nb", "one-of-seven", name))
        watcher = PodResourcesWatcher(socket_path, dra=DraAttribution(index))
        assert watcher.refresh()
        devices = [DeviceSnapshot(index=g.index, uuid=g.uuid) for g in a100.gpus] + [
            DeviceSnapshot(
                index=m.gpu_instance_id,
                uuid=m.uuid,
                mig=MigInfo(g.uuid, g.index, m.gpu_instance_id, 0, m.profile.name),
            )
            for g in a100.gpus
            for m in g.mig
        ]
        snap = watcher.enrich(
            NodeSnapshot("node-a", "550", "12.550", 12040, tuple(devices), 0.0, 0.01)
        )
    assert {u: [r.pod for r in refs] for u, refs in snap.pods.items()} == {
        a100.gpus[1].uuid: ["nb"]
    }


def test_bad_slices_and_pool_generations() -> None:
    found: list[str] = []
    index = SliceIndex(on_problem=lambda reason, _m: found.append(reason))
    old, new = resource_slices(MIXED, "node-a"), resource_slices(MIXED, "node-a", generation=2)
    new[0]["metadata"]["name"] = "republished"
    del new[0]["spec"]["devices"][0]["attributes"]["uuid"]  # gpu-0 loses its uuid
    # driver-qualified attribute names count as well
    attrs = new[0]["spec"]["devices"][1]["attributes"]
    attrs[f"{DRIVER}/uuid"] = attrs.pop("uuid")
    index.replace_all([*old, *new])  # the older generation no longer counts
    assert index.lookup(DRIVER, "node-a", "gpu-0") is None
    assert index.lookup(DRIVER, "node-a", "gpu-1") is not None
    assert found == ["bad_slice"]
    index.replace_all([*old, *new])
    assert found == ["bad_slice"]  # logged and counted once
    index.apply("DELETED", new[0])
    assert index.lookup(DRIVER, "node-a", "gpu-0") is not None  # generation 1 counts again
    mig = index.lookup(DRIVER, "node-a", MIG_NAME)
    assert mig is not None and mig.type == "mig" and mig.profile and mig.parent_uuid


def test_the_watch_loops_typed_messages_drive_the_index() -> None:
    index = SliceIndex()
    first, second = resource_slices(MIXED, "node-a"), resource_slices(MIXED, "node-b")
    apply_message(index, Resync(KINDS[0], 1, first, "10"))
    assert index.lookup(DRIVER, "node-a", "gpu-0") is not None
    apply_message(index, Listed(KINDS[0], 2, second))  # facts only: node-a's slices stay
    assert index.lookup(DRIVER, "node-a", "gpu-0") is not None
    assert index.lookup(DRIVER, "node-b", "gpu-0") is not None
    apply_message(index, Synced())
    for obj in second:
        apply_message(index, Event(KINDS[0], 3, "DELETED", obj))
    assert index.lookup(DRIVER, "node-b", "gpu-0") is None
    apply_message(index, Resync(KINDS[0], 4, second, "11"))  # a relist: exactly these now
    assert index.lookup(DRIVER, "node-a", "gpu-0") is None
    assert index.lookup(DRIVER, "node-b", "gpu-0") is not None


def _kube(api: ApiServer, tmp_path: Path, node: str) -> Kube:
    client = load(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    return Kube(client, field_selectors=dict.fromkeys(KINDS, f"spec.nodeName={node}"))


def test_slice_watcher_follows_this_node_relists_and_survives_deletion(tmp_path: Path) -> None:
    with ApiServer() as api:
        for obj in resource_slices(spec.load("l4x2"), "node-b"):  # another node's slice
            api.apply("ADDED", obj)
        index = SliceIndex()
        watcher = SliceWatcher(_kube(api, tmp_path, "node-a"), index, "node-a")
        watcher.start()
        try:
            assert poll(lambda: watcher.up)
            assert index.devices() == []
            mine = resource_slices(MIXED, "node-a")
            api.apply("ADDED", mine[0])
            assert poll(lambda: len(index.devices()) == len(NAMES))
            assert {d.pool for d in index.devices()} == {"node-a"}
            api.force_gone()  # history compacted: the watch gets 410 and relists
            api.apply("DELETED", mine[0])
            assert poll(lambda: index.devices() == [])
            api.apply("ADDED", mine[0])
            assert poll(lambda: len(index.devices()) == len(NAMES))
            assert api.requests["GET resourceslices"] >= 4  # probe, list, relist, watches
        finally:
            watcher.stop()


def test_slices_stay_up_while_a_busy_server_queues_the_watch(tmp_path: Path) -> None:
    """Between the list and the server accepting the watch (queued by API Priority and
    Fairness on a busy server, or just slow on a loaded node) the slices are listed and
    current: dra_slices_up must not read 0 there (it did, once, on a loaded 2-core machine)."""
    with ApiServer() as api:
        api.apply("ADDED", resource_slices(MIXED, "node-a")[0])
        api.queue_watches()
        index = SliceIndex()
        watcher = SliceWatcher(_kube(api, tmp_path, "node-a"), index, "node-a")
        watcher.start()
        try:
            assert poll(lambda: watcher._loop is not None and watcher._loop.started.is_set())
            assert api.active_watches == 0  # the watch is still queued
            readings = {watcher.up for _ in range(20) if time.sleep(0.02) is None}
            assert readings == {True}
            api.queue_watches(False)
            assert poll(lambda: api.active_watches == 1)
            api.apply("DELETED", resource_slices(MIXED, "node-a")[0])
            assert poll(lambda: index.devices() == [])
            assert watcher.up
        finally:
            watcher.stop()


def test_without_rbac_dra_attribution_says_so_once(tmp_path: Path, caplog) -> None:
    with ApiServer() as api, caplog.at_level(logging.WARNING):
        api.forbid("resourceslices")
        watcher = SliceWatcher(_kube(api, tmp_path, "node-a"), SliceIndex(), "node-a", retry_s=0.1)
        watcher.start()
        try:
            assert poll(lambda: api.requests.get("GET resourceslices", 0) >= 3)
            assert watcher.available is False and not watcher.up
            assert caplog.text.count("DRA attribution is off") == 1
            assert "no RBAC access" in caplog.text
            api.forbid("resourceslices", False)  # RBAC granted later: it starts by itself
            assert poll(lambda: watcher.up)
        finally:
            watcher.stop()


@pytest.fixture
def mixed_node(socket_path: Path):
    with SimNode.create(socket_path.parent / "nvml.state", "mixed") as sim:
        yield sim


def test_gpu_exporter_attributes_dra_claims_end_to_end(
    mixed_node: SimNode, socket_path: Path, tmp_path: Path
) -> None:
    assert mixed_node.uuid(0) == NAMES["gpu-0"]  # the slices describe the simulated node
    with ApiServer() as api, PodResourcesServer(socket_path) as kubelet:
        for obj in resource_slices(MIXED, "node-a"):
            api.apply("ADDED", obj)
        kubelet.assign_claim(claim("train", "two-gpus", "gpu-0", "gpu-1"))
        kubelet.assign_claim(claim("notebook", "mig", MIG_NAME))
        exporter = Exporter(
            mixed_node,
            socket_path,
            "--dra=on",
            "--node-name=node-a",
            f"--kubeconfig={api.write_kubeconfig(tmp_path / 'kubeconfig')}",
        )
        try:
            expected = {
                (NAMES["gpu-0"], "ml", "train"),
                (NAMES["gpu-1"], "ml", "train"),
                (NAMES[MIG_NAME], "ml", "notebook"),
            }
            wait_for(lambda: pod_info(exporter.port) == expected)
            # up from the list on, the watch's request included (issue 30, item 8: it read 0
            # once on a loaded machine, in the window before the server accepted the watch)
            body = scrape(exporter.port)
            assert re.search(r"^gpuquota_exporter_dra_slices_up 1(\.0)?$", body, re.M), (
                exporter.output()[-3000:],
                api.unclean_watch_ends,
            )
            assert 'claim="mig"' in body and f'device="{MIG_NAME}"' in body
            # the slice disappears: the claims no longer resolve, counted, nothing crashes
            api.apply("DELETED", resource_slices(MIXED, "node-a")[0])
            wait_for(lambda: pod_info(exporter.port) == set())
            wait_for(
                lambda: (
                    'gpuquota_exporter_dra_problems_total{reason="unknown_device"} 3'
                    in scrape(exporter.port)
                )
            )
            assert "no longer resolve" in exporter.output()
            # no slice watch ended uncleanly on either side (bench/watch_endings.py)
            retried = [line for line in exporter.output().splitlines() if "retrying in" in line]
            assert retried == [], exporter.output()[-3000:]
            assert api.unclean_watch_ends == []
            # every call maps onto a verb deploy/components/dra grants (list/watch/get are GETs;
            # the claims are read by name)
            assert set(api.requests) == {"GET resourceslices", "GET resourceclaims"}
        finally:
            exporter.stop()


def test_without_rbac_under_dra_auto_it_is_only_information(tmp_path: Path, caplog) -> None:
    with ApiServer() as api, caplog.at_level(logging.INFO):
        api.forbid("resourceslices")
        kube = _kube(api, tmp_path, "node-a")
        watcher = SliceWatcher(kube, SliceIndex(), "node-a", retry_s=0.1, asked_for=False)
        watcher.start()
        try:
            assert poll(lambda: api.requests.get("GET resourceslices", 0) >= 2)
        finally:
            watcher.stop()
    said = [r for r in caplog.records if "DRA attribution is off" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.INFO]


def test_an_unreachable_api_server_is_said_once_then_followed(tmp_path: Path, caplog) -> None:
    with ApiServer() as api, caplog.at_level(logging.WARNING):
        api.apply("ADDED", resource_slices(MIXED, "node-a")[0])
        kube = _kube(api, tmp_path, "node-a")
        api.refuse_for(1.0)  # connections refused for a second
        index = SliceIndex()
        watcher = SliceWatcher(kube, index, "node-a", transient_retry_s=0.05)
        watcher.start()
        try:
            assert poll(lambda: watcher.up and len(index.devices()) == len(NAMES))
        finally:
            watcher.stop()
    assert caplog.text.count("cannot list ResourceSlices yet") == 1


def test_a_1_33_cluster_is_followed_through_v1beta2(tmp_path: Path) -> None:
    with ApiServer(resource_versions=("v1beta2",)) as api:
        api.apply("ADDED", resource_slices(MIXED, "node-a")[0])
        index = SliceIndex()
        watcher = SliceWatcher(_kube(api, tmp_path, "node-a"), index, "node-a")
        watcher.start()
        try:
            assert poll(lambda: watcher.up and len(index.devices()) == len(NAMES))
            assert watcher.kind == "ResourceSlice.v1beta2"
            api.apply("DELETED", resource_slices(MIXED, "node-a")[0])  # watched too
            assert poll(lambda: index.devices() == [])
        finally:
            watcher.stop()


def _admin_claim(name: str, *devices: str) -> dict:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ops"},
        "spec": {"devices": {"requests": [{"name": "all", "exactly": {"adminAccess": True}}]}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "all",
                            "driver": DRIVER,
                            "pool": "node-a",
                            "device": d,
                            "adminAccess": True,
                        }
                        for d in devices
                    ]
                }
            }
        },
    }


def test_the_admin_access_rule_reads_only_results_marked_admin_access() -> None:
    # the pure rule (exporter/enrich/admin_access.py) on claim objects already in hand
    claim = _admin_claim("monitor", "gpu-0", "gpu-1")
    assert admin_devices(claim) == {(DRIVER, "node-a", "gpu-0"), (DRIVER, "node-a", "gpu-1")}
    results = claim["status"]["allocation"]["devices"]["results"]
    results[1] = {**results[1], "adminAccess": False}
    results.append("not a result")
    assert admin_devices(claim) == {(DRIVER, "node-a", "gpu-0")}
    assert admin_devices({"metadata": {"name": "unallocated"}}) == frozenset()
    assert admin_devices({"status": {"allocation": None}}) == frozenset()
    path = claim_path("v1", "ops", "monitor")
    assert path == "/apis/resource.k8s.io/v1/namespaces/ops/resourceclaims/monitor"


def test_admin_access_claims_of_monitoring_agents_are_not_attributed(
    socket_path: Path, tmp_path: Path, caplog
) -> None:
    index = SliceIndex()
    index.replace_all(resource_slices(MIXED, "node-a"))
    with ApiServer() as api, PodResourcesServer(socket_path) as kubelet:
        api.apply("ADDED", _admin_claim("monitor", "gpu-0", "gpu-1"))
        admin = AdminAccessClaims(_kube(api, tmp_path, "node-a"))
        admin.start()
        try:
            dra = DraAttribution(index)
            dra.admin = admin
            kubelet.assign_claim(claim("train", "two-gpus", "gpu-0", "gpu-1"))
            kubelet.assign_claim(
                ClaimAssignment("ops", "dcgm", "exporter", "monitor", "ops",
                                tuple((DRIVER, "node-a", d) for d in ("gpu-0", "gpu-1")))
            )  # fmt: skip
            watcher = PodResourcesWatcher(socket_path, dra=dra)

            def holders() -> dict[str, set[str]]:
                assert watcher.refresh()
                snap = watcher.enrich(snapshot())
                return {u: {r.pod for r in refs} for u, refs in snap.pods.items()}

            # until the claim has been read it counts; then the monitoring pod drops out
            want = {NAMES["gpu-0"]: {"train"}, NAMES["gpu-1"]: {"train"}}
            assert poll(lambda: holders() == want)
            assert poll(lambda: api.requests["GET resourceclaims"] == 2)  # each claim once
            holders()
            assert api.requests["GET resourceclaims"] == 2  # then remembered
        finally:
            admin.stop()

        # without RBAC for claims: said once, every claim attributed
        api.forbid("resourceclaims")
        admin = AdminAccessClaims(_kube(api, tmp_path, "node-a"))
        admin.start()
        try:
            dra = DraAttribution(index)
            dra.admin = admin
            watcher = PodResourcesWatcher(socket_path, dra=dra)
            watcher.refresh()
            assert poll(lambda: not admin.enabled)
            assert watcher.refresh()
            snap = watcher.enrich(snapshot())
            assert {r.pod for r in snap.pods[NAMES["gpu-0"]]} == {"train", "dcgm"}
            assert caplog.text.count("cannot read ResourceClaims") == 1
        finally:
            admin.stop()
