"""`gpuquota controller` with DRA: ResourceClaims, ResourceSlices and DeviceClasses watched
with the pods' list/watch discipline, checked against the generator's own record of which
claims held GPUs when, to the second, through cut, stalled and expired watches and SIGKILLs."""

from __future__ import annotations

import random
import time

from gpuquota.sim.apiserver import ApiServer, Driver
from gpuquota.sim.harness import wait_for
from gpuquota.sim.workload import DRA_NAMESPACE, MIG_CLASS, generate
from tests.controller.conftest import (
    assert_dra_exact,
    assert_exact,
    caught_up,
    drive_through_cut_and_stall,
    kind_caught_up,
    metric,
    ready,
    start,
)

# everything the stand-in serves in resource.k8s.io
DRA_RESOURCES = {
    "resourceclaims",
    "resourceslices",
    "deviceclasses",
    "resourceclaimtemplates",
    "devicetaintrules",
}
WL = generate(23, 1.0, pods_per_hour=20, observation_independent=True, dra=True)


def test_dra_claims_exact_through_watch_trouble_and_restarts(apiserver, store, controllers):
    rng = random.Random(store.cluster)
    ctl = start(apiserver, store, controllers)
    ready(store)
    driver, marks = drive_through_cut_and_stall(apiserver, store, WL)
    apiserver.force_gone()  # 410 on every kind: relist claims, slices and classes too
    wait_for(
        lambda: all(
            f'gpuquota_controller_relists_total{{kind="{kind}"}}' in ctl.metrics()
            for kind in ("Pod", "ResourceClaim", "ResourceSlice", "DeviceClass")
        ),
        20,
        "the relists",
    )
    driver.run(until=marks[3])
    wait_for(lambda: caught_up(store, apiserver), 20, "catch-up after 410")
    text = ctl.metrics()
    assert metric(text, "gpuquota_controller_relists_total", kind="ResourceClaim") >= 1
    assert metric(text, "gpuquota_controller_watch_restarts_total", kind="ResourceClaim") >= 1
    assert metric(text, "gpuquota_controller_dra_watched") == 1
    # killed wherever it is, while the cluster moves on; then it resumes from the store
    driver.start(until=marks[4])
    time.sleep(rng.uniform(0.05, 0.4))
    ctl.kill()
    driver.wait()
    ctl = start(apiserver, store, controllers)
    driver.run()
    wait_for(lambda: caught_up(store, apiserver), 30, "catch-up at the end")
    text = ctl.metrics()
    # what the claims still running hold now, per device class
    open_now: dict[str, int] = {}
    for iv in WL.truth.dra_intervals:
        if iv.end is None:
            open_now[iv.device_class] = open_now.get(iv.device_class, 0) + iv.units
    assert open_now.get(MIG_CLASS)
    for device_class, units in open_now.items():
        assert (
            metric(
                text,
                "gpuquota_namespace_dra_gpus_allocated",
                namespace=DRA_NAMESPACE,
                device_class=device_class,
                kind="raw",
            )
            == units
        )
    # the claim of another driver is a problem worth a count, not a crash
    assert metric(text, "gpuquota_controller_dra_problems_total", reason="driver") >= 1
    # every DRA call maps onto a verb deploy/base/controller-rbac.yaml grants: list and watch
    # (both GETs of the collection; the controller never reads one object by name)
    dra_calls = {k for k in apiserver.requests if k.split()[1] in DRA_RESOURCES}
    assert dra_calls == {"GET resourceclaims", "GET resourceslices", "GET deviceclasses"}
    assert ctl.terminate() == 0
    assert "resuming the watch from stored version" in ctl.log()
    assert_exact(store, WL)
    assert_dra_exact(store, WL)


def test_without_dra_the_controller_says_so_and_accounts_pods(store, controllers):
    wl = generate(23, 1.0, pods_per_hour=20, observation_independent=True)
    with ApiServer() as api:
        api.forbid("resourceclaims")  # RBAC without the DRA verbs
        ctl = start(api, store, controllers)
        ready(store)
        Driver(api, wl).run()
        wait_for(
            lambda: kind_caught_up(store, api, "Pod"),
            20,
            "catch-up",
        )
        assert metric(ctl.metrics(), "gpuquota_controller_dra_watched") == 0
        assert ctl.terminate() == 0
    assert "DRA ResourceClaims are not accounted: listing" in ctl.log()
    assert "grant list, watch on resourceclaims" in ctl.log()
    assert_exact(store, wl)


def test_kubernetes_1_33_serves_dra_at_v1beta2_only(store, controllers):
    with ApiServer(resource_versions=("v1beta2",)) as api:
        ctl = start(api, store, controllers)
        ready(store)
        Driver(api, WL).run()
        wait_for(lambda: caught_up(store, api), 20, "catch-up")
        assert metric(ctl.metrics(), "gpuquota_controller_dra_watched") == 1
        assert ctl.terminate() == 0
        assert any("resourceclaims" in k for k in api.requests)
    assert_exact(store, WL)
    assert_dra_exact(store, WL)
