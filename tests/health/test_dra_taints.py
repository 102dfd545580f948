"""The health verdict as DeviceTaintRules, through the API server stand-in and the real client."""

from __future__ import annotations

import copy
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from gpuquota.exporter.dra.taintrules import (
    MANAGED_BY,
    MANAGER,
    NODE_LABEL,
    rule_name,
    wanted_rules,
)
from gpuquota.exporter.dra.taints import DeviceTaintPublisher
from gpuquota.exporter.enrich.slices import SliceIndex
from gpuquota.exporter.health.config import parse_config
from gpuquota.exporter.health.engine import DeviceTracker
from gpuquota.exporter.health.verdict import Action, State
from gpuquota.exporter.nodestatus.status import TAINT_KEY
from gpuquota.exporter.snapshot import DeviceSnapshot, DeviceState, MigInfo, NodeSnapshot
from gpuquota.kube.client import Kube, load
from gpuquota.sim.apiserver import ApiServer
from gpuquota.sim.harness import poll, wait_for
from gpuquota.sim.nvml import spec
from gpuquota.sim.nvml.control import SimNode
from gpuquota.sim.nvml.resourceslices import DRIVER, device_uuids, resource_slices
from tests.kubelet.exporter_proc import Exporter, scrape

MIXED = spec.load("mixed")  # 2 x H100, an A100 with 3 MIG devices, an L4
NAMES = device_uuids(MIXED)
A100 = MIXED.gpus[2]


def snapshot() -> NodeSnapshot:
    devices = []
    for g in MIXED.gpus:
        devices.append(DeviceSnapshot(index=g.index, uuid=g.uuid, minor_number=g.index))
        devices.extend(
            DeviceSnapshot(
                index=m.gpu_instance_id,
                uuid=m.uuid,
                mig=MigInfo(g.uuid, g.index, m.gpu_instance_id, 0, m.profile.name),
            )
            for m in g.mig
        )
    return NodeSnapshot("node-a", "550", "12.550", 12040, tuple(devices), 0.0, 0.01)


def index() -> SliceIndex:
    idx = SliceIndex()
    idx.replace_all(resource_slices(MIXED, "node-a"))
    return idx


def test_wanted_rules_select_each_unhealthy_dra_device() -> None:
    t = DeviceTracker(parse_config(None, quiet_period_s=10))
    healthy = t.observe_snapshot(snapshot(), now=0)
    devices = index().devices()
    assert wanted_rules(healthy, devices, "node-a") == {}
    t.observe_xid(MIXED.gpus[3].uuid, 13, at=1)  # degraded only: schedulable, no rule
    sick = t.observe_xid(MIXED.gpus[0].uuid, 79, at=2)
    rules = wanted_rules(sick, devices, "node-a")
    assert list(rules) == [rule_name("node-a", "gpu-0")] == ["gpuquota-node-a-gpu-0"]
    rule = rules["gpuquota-node-a-gpu-0"]
    assert rule["spec"] == {
        "deviceSelector": {"driver": DRIVER, "pool": "node-a", "device": "gpu-0"},
        "taint": {"key": TAINT_KEY, "value": "reboot_node", "effect": "NoSchedule"},
    }
    assert rule["metadata"]["labels"] == {MANAGED_BY: MANAGER, NODE_LABEL: "node-a"}
    assert rule["metadata"]["annotations"]["gpuquota.io/reasons"] == "xid_79"
    # an XID on a MIG-partitioned GPU fences every MIG device it holds
    sick = t.observe_xid(A100.uuid, 48, at=3)
    rules = wanted_rules(sick, devices, "node-a", effect="NoExecute")
    mig_rules = [r for r in rules.values() if "-mig-" in r["spec"]["deviceSelector"]["device"]]
    assert len(mig_rules) == len(A100.mig) == 3
    assert {r["spec"]["taint"]["effect"] for r in rules.values()} == {"NoExecute"}
    with pytest.raises(ValueError, match="PreferNoSchedule"):
        wanted_rules(sick, devices, "node-a", effect="PreferNoSchedule")
    assert len(rule_name("n" * 250, "gpu-0")) == 253


def _rules(api: ApiServer) -> dict[str, dict]:
    """Copies of the stored rules: a test changing what it reads must not change the server."""
    with api.state.lock:
        return {n: copy.deepcopy(o) for (_, n), o in api.state.objects["devicetaintrules"].items()}


def _annotation(api: ApiServer, key: str) -> str | None:
    rule = _rules(api).get("gpuquota-node-a-gpu-0")
    return None if rule is None else rule["metadata"]["annotations"].get(key)


FOREIGN = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceTaintRule",
    "metadata": {"name": "gpuquota-node-a-gpu-0"},  # our name, not ours: never touched
    "spec": {
        "deviceSelector": {"driver": DRIVER, "pool": "node-a", "device": "gpu-0"},
        "taint": {"key": "admin.example.com/maintenance", "effect": "NoSchedule"},
    },
}


def test_publisher_creates_updates_and_removes_only_its_own_rules(tmp_path: Path) -> None:
    # a cluster serving DeviceTaintRules only as v1alpha3 (the gate on a 1.34/1.35 cluster)
    with ApiServer(device_taint_rule_versions=("v1alpha3",)) as api:
        leftover = wanted_rules(_sick_gpu1(), index().devices(), "node-a")
        for body in leftover.values():  # an earlier run's rule whose device recovered since
            api.apply("ADDED", {"apiVersion": "resource.k8s.io/v1", **body})
        other_node = {**FOREIGN, "metadata": {"name": "x", "labels": {MANAGED_BY: MANAGER,
                      NODE_LABEL: "node-b"}}}  # fmt: skip
        api.apply("ADDED", other_node)
        api.apply("ADDED", {**FOREIGN, "metadata": {"name": "admin-rule"}})
        kube = Kube(load(str(api.write_kubeconfig(tmp_path / "kubeconfig"))))
        publisher = DeviceTaintPublisher(kube, index(), "node-a", max_backoff_s=0.2)
        publisher.start()
        try:
            t = DeviceTracker(parse_config(None, quiet_period_s=10))
            healthy = t.observe_snapshot(snapshot(), now=0)
            publisher(healthy, healthy)
            assert poll(lambda: set(_rules(api)) == {"x", "admin-rule"})  # leftover cleaned
            assert publisher.version == "v1alpha3"

            sick = t.observe_xid(MIXED.gpus[0].uuid, 79, at=1)
            publisher(healthy, sick)
            assert poll(lambda: "gpuquota-node-a-gpu-0" in _rules(api))
            rule = _rules(api)["gpuquota-node-a-gpu-0"]
            assert rule["spec"]["deviceSelector"]["device"] == "gpu-0"
            assert rule["spec"]["taint"]["effect"] == "NoSchedule"

            # the API server goes away; recovery is applied once it is back
            api.refuse_for(0.5)
            publisher(sick, t.expire(100))
            assert poll(lambda: set(_rules(api)) == {"x", "admin-rule"})
            assert publisher.errors_total >= 1
        finally:
            publisher.stop()


def test_the_drivers_recovery_action_holds_the_verdict_until_it_reads_none() -> None:
    t = DeviceTracker(parse_config(None, quiet_period_s=10))
    base = snapshot()
    h = t.observe_snapshot(base, now=0)
    t.observe_xid(MIXED.gpus[0].uuid, 79, at=1)
    asking = replace(base, devices=(replace(base.devices[0], recovery_action=2), *base.devices[1:]))
    h = t.observe_snapshot(asking, now=2)
    h = t.observe_snapshot(asking, now=100)  # the XID expired; the driver still asks
    gpu0 = h.get(MIXED.gpus[0].uuid)
    assert gpu0 is not None and gpu0.state is State.UNHEALTHY
    assert [r.code for r in gpu0.reasons] == ["recovery_reboot"]
    assert gpu0.action is Action.REBOOT_NODE
    drain = replace(base, devices=(replace(base.devices[0], recovery_action=3), *base.devices[1:]))
    gpu0 = t.observe_snapshot(drain, now=101).get(MIXED.gpus[0].uuid)
    assert gpu0 is not None and [r.code for r in gpu0.reasons] == ["recovery_drain"]
    gpu0 = t.observe_snapshot(_gpu0(base, recovery_action=0), now=102).get(MIXED.gpus[0].uuid)
    assert gpu0 is not None and gpu0.state is State.HEALTHY


def _gpu0(base: NodeSnapshot, **values: object) -> NodeSnapshot:
    return replace(base, devices=(replace(base.devices[0], **values), *base.devices[1:]))


def test_a_missing_or_late_recovery_action_reading_keeps_the_rule_as_it_is() -> None:
    # the end-to-end test below, without its timing: XID 79, the driver asks for a reboot and
    # the XID's quiet period ends. Then a round whose field read failed (recovery_action None)
    # and one where GPU 0's reader did not answer in time (the collector's ERROR device, no
    # values): neither is "recovery action NONE", so the rule must not go away and come back
    t = DeviceTracker(parse_config(None, quiet_period_s=10))
    base, devices, uuid = snapshot(), index().devices(), MIXED.gpus[0].uuid
    t.observe_snapshot(_gpu0(base, recovery_action=0), now=0)
    t.observe_xid(uuid, 79, at=1)
    t.observe_snapshot(_gpu0(base, recovery_action=2), now=2)
    asking = t.observe_snapshot(_gpu0(base, recovery_action=2), now=100)
    rules = wanted_rules(asking, devices, "node-a", effect="NoExecute")
    assert rules["gpuquota-node-a-gpu-0"]["metadata"]["annotations"]["gpuquota.io/reasons"] == (
        "recovery_reboot"
    )
    failed_read = _gpu0(
        base, recovery_action=None, errors=(("nvmlDeviceGetFieldValues", "Unknown Error"),)
    )
    after = t.observe_snapshot(failed_read, now=101)
    assert after.generation == asking.generation  # nothing changed, nothing to publish
    not_answering = replace(
        DeviceSnapshot(index=0, uuid=uuid, minor_number=0),
        state=DeviceState.ERROR,
        errors=(("collector", "NVML has not answered for 4 s"),),
    )
    after = t.observe_snapshot(replace(base, devices=(not_answering, *base.devices[1:])), 102)
    gpu0 = after.get(uuid)
    assert gpu0 is not None and (gpu0.state, gpu0.action) == (State.UNHEALTHY, Action.REBOOT_NODE)
    assert {r.code for r in gpu0.reasons} == {"recovery_reboot", "nvml_error"}
    assert gpu0.since == asking.get(uuid).since  # type: ignore[union-attr]
    assert wanted_rules(after, devices, "node-a", effect="NoExecute") == rules
    # a reading of NONE (0) is what clears it
    healed = t.observe_snapshot(_gpu0(base, recovery_action=0), now=103)
    assert wanted_rules(healed, devices, "node-a", effect="NoExecute") == {}


def _sick_gpu1():
    t = DeviceTracker(parse_config(None, quiet_period_s=10))
    t.observe_snapshot(snapshot(), now=0)
    return t.observe_xid(MIXED.gpus[1].uuid, 79, at=0)


def test_a_foreign_rule_with_our_name_is_left_alone(tmp_path: Path, caplog) -> None:
    with ApiServer() as api:
        api.apply("ADDED", FOREIGN)
        kube = Kube(load(str(api.write_kubeconfig(tmp_path / "kubeconfig"))))
        publisher = DeviceTaintPublisher(kube, index(), "node-a")
        t = DeviceTracker(parse_config(None, quiet_period_s=10))
        t.observe_snapshot(snapshot(), now=0)
        sick = t.observe_xid(MIXED.gpus[0].uuid, 79, at=1)
        publisher.reconcile(wanted_rules(sick, index().devices(), "node-a"))
        publisher.reconcile(wanted_rules(t.expire(100), index().devices(), "node-a"))
        assert _rules(api)["gpuquota-node-a-gpu-0"]["spec"] == FOREIGN["spec"]
        assert caplog.text.count("is not ours") == 1


def test_gpu_exporter_taints_a_dra_device_on_xid_79_and_clears_it(tmp_path: Path) -> None:
    # no kubelet here: the health verdict alone drives the rules
    socket_path = Path(tempfile.mkdtemp(prefix="dtr-", dir="/tmp")) / "kubelet.sock"
    with (
        SimNode.create(socket_path.parent / "nvml.state", "mixed") as node,
        ApiServer(bookmark_interval=0.2) as api,
    ):
        for obj in resource_slices(MIXED, "node-a"):
            api.apply("ADDED", obj)
        exporter = Exporter(
            node,
            socket_path,
            "--dra-device-taints",
            "--dra-taint-effect=NoExecute",
            "--node-name=node-a",
            "--health-quiet-period=2s",
            f"--kubeconfig={api.write_kubeconfig(tmp_path / 'kubeconfig')}",
        )
        try:
            wait_for(lambda: api.requests.get("GET devicetaintrules", 0) >= 1)
            assert _rules(api) == {}
            node.inject_xid(0, 79)
            node.set(0, recovery_action=2)  # the driver asks for a node reboot (field 230)
            wait_for(lambda: "gpuquota-node-a-gpu-0" in _rules(api))
            rule = _rules(api)["gpuquota-node-a-gpu-0"]
            added = rule["spec"]["taint"].pop("timeAdded")  # set by the API server
            uid = rule["metadata"]["uid"]
            assert rule["spec"]["taint"] == {
                "key": TAINT_KEY,
                "value": "reboot_node",
                "effect": "NoExecute",
            }
            assert rule["metadata"]["annotations"]["gpuquota.io/device-uuid"] == node.uuid(0)
            wait_for(lambda: "gpuquota_exporter_dra_taint_rules 1" in scrape(exporter.port))
            # the XID's quiet period ends, but the driver still asks for a reboot: kept
            wait_for(
                lambda: _annotation(api, "gpuquota.io/reasons") == "recovery_reboot", timeout=15
            )
            # updated in place, never deleted and made again: the taint keeps the time it was
            # added (NoExecute tolerations count from it) and the rule its uid
            rule = _rules(api)["gpuquota-node-a-gpu-0"]
            assert (rule["metadata"]["uid"], rule["spec"]["taint"]["timeAdded"]) == (uid, added)
            assert "DeviceTaintRule gpuquota-node-a-gpu-0 deleted" not in exporter.output()
            node.set(0, recovery_action=0)  # rebooted: the driver asks for nothing any more
            wait_for(lambda: _rules(api) == {}, timeout=15)
            wait_for(lambda: "gpuquota_exporter_dra_taint_rules 0" in scrape(exporter.port))
            assert "gpuquota_exporter_dra_taint_errors_total 0" in scrape(exporter.port)
            wait_for(lambda: "DeviceTaintRule gpuquota-node-a-gpu-0 deleted" in exporter.output())
            # every call maps onto a verb deploy/components/dra grants (list/watch are GETs)
            assert set(api.requests) == {
                "GET resourceslices",
                "GET devicetaintrules",
                "POST devicetaintrules",
                "PUT devicetaintrules",
                "DELETE devicetaintrules",
            }
        finally:
            exporter.stop()
            shutil.rmtree(socket_path.parent, ignore_errors=True)


@pytest.mark.parametrize(
    ("release", "version"), [("1.37", "v1"), ("1.36", "v1beta2"), ("1.35", "v1alpha3")]
)
def test_the_publisher_writes_the_newest_version_the_cluster_serves(
    tmp_path: Path, release: str, version: str
) -> None:
    """v1 where served (1.37), else v1beta2 (1.36 serves v1beta2 and v1alpha3), else v1alpha3;
    the server sets timeAdded and the EvictionInProgress condition, which updates keep."""
    from gpuquota.sim.apiserver import DEVICE_TAINT_RULE_RELEASES

    with ApiServer(device_taint_rule_versions=DEVICE_TAINT_RULE_RELEASES[release]) as api:
        kube = Kube(load(str(api.write_kubeconfig(tmp_path / "kubeconfig"))))
        publisher = DeviceTaintPublisher(kube, index(), "node-a")
        t = DeviceTracker(parse_config(None, quiet_period_s=10))
        t.observe_snapshot(snapshot(), now=0)
        publisher.reconcile(
            wanted_rules(t.observe_xid(MIXED.gpus[0].uuid, 79, at=1), index().devices(), "node-a")
        )
        assert publisher.version == version
        assert api.requests.get("POST devicetaintrules") == 1
        rule = _rules(api)["gpuquota-node-a-gpu-0"]
        added = rule["spec"]["taint"]["timeAdded"]
        [condition] = rule["status"]["conditions"]
        assert (condition["type"], condition["status"]) == ("EvictionInProgress", "False")
        assert condition["message"] == "Eviction only happens for the NoExecute effect."
        # a changed verdict: updated in place, the server's timeAdded and status kept
        t.observe_snapshot(_gpu0(snapshot(), recovery_action=2), now=2)
        publisher.reconcile(wanted_rules(t.expire(100), index().devices(), "node-a"))
        rule = _rules(api)["gpuquota-node-a-gpu-0"]
        assert api.requests.get("PUT devicetaintrules") == 1
        assert rule["metadata"]["annotations"]["gpuquota.io/reasons"] == "recovery_reboot"
        assert rule["spec"]["taint"]["timeAdded"] == added
        assert rule["status"]["conditions"] == [condition]


def test_a_rule_changed_between_list_and_update_is_listed_again(tmp_path: Path) -> None:
    """Optimistic concurrency: the PUT carries the listed resourceVersion; a 409 lists again."""

    class Racing(Kube):
        puts = 0

        def call(self, method: str, path: str, *args, **kwargs):  # type: ignore[no-untyped-def]
            if method == "PUT":
                Racing.puts += 1
                if Racing.puts == 1:  # someone touches the rule just before our first write
                    rule = api.get("devicetaintrules", "gpuquota-node-a-gpu-0")
                    assert rule is not None
                    rule["metadata"]["annotations"]["other.io/seen"] = "yes"
                    api.apply("MODIFIED", rule)
            return super().call(method, path, *args, **kwargs)

    with ApiServer() as api:
        kube = Racing(load(str(api.write_kubeconfig(tmp_path / "kubeconfig"))))
        publisher = DeviceTaintPublisher(kube, index(), "node-a")
        t = DeviceTracker(parse_config(None, quiet_period_s=10))
        t.observe_snapshot(snapshot(), now=0)
        publisher.reconcile(
            wanted_rules(t.observe_xid(MIXED.gpus[0].uuid, 79, at=1), index().devices(), "node-a")
        )
        t.observe_snapshot(_gpu0(snapshot(), recovery_action=2), now=2)
        publisher._reconcile_retrying(wanted_rules(t.expire(100), index().devices(), "node-a"))
        assert Racing.puts == 2  # a 409, then the write on what was listed again
        rule = _rules(api)["gpuquota-node-a-gpu-0"]
        assert rule["metadata"]["annotations"]["gpuquota.io/reasons"] == "recovery_reboot"
