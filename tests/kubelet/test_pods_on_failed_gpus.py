"""Pods on a GPU that needs a reset or a reboot: the kubelet evicts nothing, so the agent offers
(opt-in) a pod condition and a rate-limited eviction through the Eviction API.

The rules are pure (exporter/remediation/rules.py) and tested without I/O; the remediator talks
to the apiserver stand-in through the real client; one test runs the whole path: gpu-exporter
(the CLI) on the NVML stand-in, pods admitted by the kubelet stand-in, an XID, the condition and
the eviction in the API.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuquota.exporter.health.board import VerdictBoard
from gpuquota.exporter.health.config import parse_config
from gpuquota.exporter.health.engine import DeviceTracker
from gpuquota.exporter.remediation.remediator import PodRemediator, RemediationConfig
from gpuquota.exporter.remediation.rules import (
    EvictionBudget,
    due_for_eviction,
    eviction_refusal,
    pod_condition,
    pods_in_trouble,
)
from gpuquota.exporter.snapshot import PodRef
from gpuquota.kube.client import Kube, load
from gpuquota.sim.apiserver import ApiServer
from gpuquota.sim.harness import poll
from gpuquota.sim.kubelet.registration import KubeletStandIn
from gpuquota.sim.nvml.control import SimNode
from tests.health.factory import gpu, gpus, mig, node
from tests.kubelet.exporter_proc import Exporter

UUIDS = [f"GPU-{i:08d}" for i in range(4)]


class Health:
    """Tracker + board on a fake clock (seconds since 1000)."""

    def __init__(self, *devices: Any) -> None:
        self.tracker = DeviceTracker(parse_config(None, quiet_period_s=1000))
        self.board = VerdictBoard()
        self.now = 1000.0
        self.board.publish(self.tracker.observe_snapshot(node(*(devices or gpus(4))), self.now))

    def xid(self, uuid: str, xid: int, **kw: Any) -> None:
        self.now += 1
        self.board.publish(self.tracker.observe_xid(uuid, xid, at=self.now, **kw))

    def expire(self) -> None:
        self.now += 10_000
        self.board.publish(self.tracker.expire(self.now))


def ref(namespace: str, pod: str) -> PodRef:
    return PodRef(namespace, pod, "main")


# -- the rules ------------------------------------------------------------------------------


def test_only_gpus_needing_a_reset_or_reboot_put_their_pods_in_trouble() -> None:
    health = Health()
    holders = {
        UUIDS[0]: (ref("a", "train"),),
        UUIDS[1]: (ref("a", "infer-0"), ref("a", "infer-1")),  # time-sliced: two pods
        UUIDS[2]: (ref("b", "app"),),
        UUIDS[3]: (ref("b", "fine"),),
    }
    health.xid(UUIDS[0], 79)  # fell off the bus: reboot
    health.xid(UUIDS[1], 48)  # double-bit ECC: reset
    health.xid(UUIDS[2], 13)  # the application's own error: restart it, the GPU is fine
    troubles = pods_in_trouble(health.board.current(), holders)
    assert sorted(troubles) == [("a", "infer-0"), ("a", "infer-1"), ("a", "train")]
    train = troubles[("a", "train")]
    assert train.action.label == "reboot_node"
    assert train.message() == f"{UUIDS[0]} (xid_79; action reboot_node)"
    assert troubles[("a", "infer-1")].message() == f"{UUIDS[1]} (xid_48; action reset_gpu)"


def test_a_mig_instance_in_trouble_is_its_pods_trouble_only() -> None:
    health = Health(gpu(0, mig_mode_enabled=True), mig(0, 1), mig(0, 2), gpu(1))
    holders = {"MIG-00-01-00": (ref("a", "one"),), "MIG-00-02-00": (ref("a", "two"),)}
    health.xid(UUIDS[0], 94, gpu_instance_id=1, compute_instance_id=0)  # contained: restart app
    assert pods_in_trouble(health.board.current(), holders) == {}
    health.xid(UUIDS[0], 95, gpu_instance_id=2, compute_instance_id=0)  # uncontained: reset
    assert sorted(pods_in_trouble(health.board.current(), holders)) == [("a", "one"), ("a", "two")]


def test_condition_is_written_on_change_only() -> None:
    health = Health()
    health.xid(UUIDS[0], 79)
    [trouble] = pods_in_trouble(health.board.current(), {UUIDS[0]: (ref("a", "p"),)}).values()
    assert pod_condition(None, None, "t0") is None  # never marked, nothing wrong: no write
    first = pod_condition(trouble, None, "t1")
    assert first is not None and (first["status"], first["reason"]) == ("True", "GPUNeedsReboot")
    assert first["lastTransitionTime"] == "t1"
    assert pod_condition(trouble, first, "t2") is None  # already says so
    cleared = pod_condition(None, first, "t3")
    assert cleared is not None and (cleared["status"], cleared["lastTransitionTime"]) == (
        "False",
        "t3",
    )
    assert pod_condition(None, cleared, "t4") is None


def test_eviction_budget_is_a_sliding_window() -> None:
    budget = EvictionBudget(2, 60.0)
    assert budget.left(0) == 2
    budget.spend(0)
    budget.spend(10)
    assert budget.left(59) == 0
    assert budget.left(60) == 1  # the first one left the window
    assert budget.left(70) == 2
    with pytest.raises(ValueError, match=">= 1"):
        EvictionBudget(0, 60)


def test_pods_that_must_not_be_evicted() -> None:
    def pod(**meta: Any) -> dict[str, Any]:
        phase = meta.pop("phase", "Running")
        return {"metadata": {"name": "p", **meta}, "status": {"phase": phase}}

    assert eviction_refusal(pod()) is None
    static = pod(annotations={"kubernetes.io/config.mirror": "abc"})
    assert "static pod" in (eviction_refusal(static) or "")
    assert "terminating" in (eviction_refusal(pod(deletionTimestamp="2026-01-01T00:00:00Z")) or "")
    assert "finished" in (eviction_refusal(pod(phase="Succeeded")) or "")
    opted_out = pod(annotations={"gpuquota.io/evict-on-gpu-failure": "false"})
    assert "opted out" in (eviction_refusal(opted_out) or "")


def test_due_for_eviction_waits_and_goes_oldest_first() -> None:
    health = Health()
    health.xid(UUIDS[1], 79)
    health.xid(UUIDS[0], 79)
    holders = {UUIDS[0]: (ref("a", "late"),), UUIDS[1]: (ref("a", "early"),)}
    troubles = pods_in_trouble(health.board.current(), holders).values()
    assert due_for_eviction(troubles, health.now, 30.0, set()) == []  # too fresh
    due = due_for_eviction(troubles, health.now + 30, 30.0, set())
    assert [t.pod for t in due] == ["early", "late"]
    assert [t.pod for t in due_for_eviction(troubles, health.now + 30, 30.0, {("a", "early")})] == [
        "late"
    ]


# -- the remediator against the apiserver stand-in -----------------------------------------


def running_pod(namespace: str, name: str, **labels: str) -> dict[str, Any]:
    return {"kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                         "labels": labels},
            "spec": {"nodeName": "node-a", "containers": [{"name": "main"}]},
            "status": {"phase": "Running",
                       "conditions": [{"type": "Ready", "status": "True"}]}}  # fmt: skip


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[ApiServer, Kube]]:
    with ApiServer() as server:
        yield server, Kube(load(str(server.write_kubeconfig(tmp_path / "kubeconfig"))))


def remediator(
    kube: Kube, health: Health, holders: dict[str, tuple[PodRef, ...]], **config: Any
) -> PodRemediator:
    return PodRemediator(
        kube, lambda: holders, health.board.verdict, RemediationConfig(**config),
        clock=lambda: health.now,
    )  # fmt: skip


def conditions(server: ApiServer, namespace: str, name: str) -> dict[str, str]:
    pod = server.get("pods", name, namespace) or {}
    return {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions", [])}


def test_condition_marks_and_clears_beside_the_kubelets_own(api) -> None:
    server, kube = api
    for name in ("train", "other"):
        server.apply("ADDED", running_pod("a", name))
    health = Health()
    holders = {UUIDS[0]: (ref("a", "train"),), UUIDS[1]: (ref("a", "other"),)}
    fix = remediator(kube, health, holders, condition=True)
    theirs = conditions(server, "a", "train")  # the kubelet's own (Ready, PodScheduled...)
    assert theirs["Ready"] == "True" and "GPUUnhealthy" not in theirs
    fix.round()
    assert conditions(server, "a", "train") == theirs  # nothing wrong: no write
    health.xid(UUIDS[0], 48)
    fix.round()
    assert conditions(server, "a", "train") == {**theirs, "GPUUnhealthy": "True"}
    assert conditions(server, "a", "other") == theirs
    writes = server.requests.get("PATCH pods", 0)
    fix.round()
    assert server.requests.get("PATCH pods", 0) == writes  # nothing changed: nothing written
    health.expire()
    fix.round()
    assert conditions(server, "a", "train") == {**theirs, "GPUUnhealthy": "False"}
    assert ("", "pods/status", "patch") in server.calls
    # a restarted agent clears a condition a previous run left up
    health.xid(UUIDS[1], 79)
    remediator(kube, health, holders, condition=True).round()
    health.expire()
    remediator(kube, health, holders, condition=True).round()
    assert conditions(server, "a", "other")["GPUUnhealthy"] == "False"


def test_eviction_honours_budgets_rate_limit_and_waits(api) -> None:
    server, kube = api
    server.apply("ADDED", running_pod("a", "guarded", app="db"))
    server.apply("ADDED", running_pod("a", "first"))
    server.apply("ADDED", running_pod("a", "second"))
    server.apply("ADDED", {"kind": "PodDisruptionBudget", "apiVersion": "policy/v1",
                           "metadata": {"name": "db", "namespace": "a", "uid": "uid-pdb"},
                           "spec": {"selector": {"matchLabels": {"app": "db"}}},
                           "status": {"disruptionsAllowed": 0}})  # fmt: skip
    health = Health()
    holders = {
        UUIDS[0]: (ref("a", "guarded"),),
        UUIDS[1]: (ref("a", "first"),),
        UUIDS[2]: (ref("a", "second"),),
    }
    fix = remediator(kube, health, holders, evict=True, max_evictions=1, window_s=600, after_s=60)
    health.xid(UUIDS[0], 79)
    health.xid(UUIDS[1], 79)
    health.xid(UUIDS[2], 48)
    fix.round()
    assert fix.evictions["evicted"] == 0  # the verdict is seconds old: wait
    health.now += 60
    fix.round()
    # the oldest trouble first: "guarded" is refused by its budget (429, not counted against
    # the rate limit), "first" goes, "second" waits for the window
    assert server.get("pods", "guarded", "a") is not None
    assert server.get("pods", "first", "a") is None
    assert server.get("pods", "second", "a") is not None
    assert (fix.evictions["blocked_by_budget"], fix.evictions["evicted"]) == (1, 1)
    assert ("", "pods/eviction", "create") in server.calls
    health.now += 599
    fix.round()
    assert server.get("pods", "second", "a") is not None
    health.now += 1
    fix.round()
    assert server.get("pods", "second", "a") is None
    assert fix.evictions["evicted"] == 2
    assert server.get("pods", "guarded", "a") is not None  # the budget still says no


def test_dry_run_and_refusals_evict_nothing(api) -> None:
    server, kube = api
    server.apply("ADDED", running_pod("a", "job"))
    static = running_pod("kube-system", "static")
    static["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "x"}
    server.apply("ADDED", static)
    health = Health()
    holders = {UUIDS[0]: (ref("a", "job"),), UUIDS[1]: (ref("kube-system", "static"),)}
    fix = remediator(kube, health, holders, evict=True, dry_run=True, max_evictions=5,
                     after_s=1)  # fmt: skip
    health.xid(UUIDS[0], 79)
    health.xid(UUIDS[1], 79)
    health.now += 1
    fix.round()
    fix.round()  # said once, not every round
    assert (fix.evictions["dry_run"], fix.evictions["refused"]) == (1, 1)
    assert server.get("pods", "job", "a") is not None
    assert server.get("pods", "static", "kube-system") is not None
    assert not any(call[1] == "pods/eviction" for call in server.calls)


def test_remediation_flags_are_checked() -> None:
    from gpuquota.exporter.app import UsageError, build_remediation
    from gpuquota.exporter.cli import build_parser

    with pytest.raises(UsageError, match="--evict-dry-run only makes sense with --evict-pods"):
        build_remediation(build_parser().parse_args(["--evict-dry-run"]), None, None)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="need pod attribution"):
        build_remediation(build_parser().parse_args(["--evict-pods"]), None, None)  # type: ignore[arg-type]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--evict-max", "0"])


# -- the whole path -------------------------------------------------------------------------


def test_exporter_marks_and_evicts_the_pod_on_a_failed_gpu(
    dirs: tuple[Path, Path], make_kubelet: Callable[..., KubeletStandIn]
) -> None:
    plugin_dir, root_dir = dirs
    with ApiServer() as server, SimNode.create(plugin_dir.parent / "nvml.state", "l4x2") as sim:
        for name in ("train", "infer"):
            server.apply("ADDED", running_pod("ml", name))
        kubeconfig = server.write_kubeconfig(plugin_dir.parent / "kubeconfig")
        kubelet = make_kubelet(api=server)
        exporter = Exporter(
            sim, root_dir / "pod-resources" / "kubelet.sock",
            "--device-plugin", f"--device-plugin-dir={plugin_dir}", f"--kubeconfig={kubeconfig}",
            "--pod-condition", "--evict-pods", "--evict-after=200ms",
        )  # fmt: skip
        try:
            plugin = kubelet.wait_for_plugin("nvidia.com/gpu", timeout=10)
            assert plugin is not None and plugin.wait_for(lambda d: len(d) == 2, timeout=10)
            kubelet.admit("ml", "train", {"main": {"nvidia.com/gpu": 1}})
            kubelet.admit("ml", "infer", {"main": {"nvidia.com/gpu": 1}})
            [bad] = kubelet.allocated("ml", "train")["main"]["nvidia.com/gpu"]
            sim.inject_xid([sim.uuid(i) for i in range(2)].index(bad), 79)
            # the kubelet reports it and does nothing more; the agent marks, then evicts
            assert poll(lambda: conditions(server, "ml", "train").get("GPUUnhealthy") == "True", 10)
            assert poll(lambda: server.get("pods", "train", "ml") is None, 10), exporter.output()
            assert server.get("pods", "infer", "ml") is not None
            assert "GPUUnhealthy" not in conditions(server, "ml", "infer")
            assert poll(lambda: "evicted ml/train" in exporter.output(), 5)
            # exactly the RBAC docs/health.md asks for
            assert server.calls == {
                ("", "pods", "get"),
                ("", "pods/status", "patch"),
                ("", "pods/eviction", "create"),
            }
        finally:
            exporter.stop()
