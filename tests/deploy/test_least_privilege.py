"""Least privilege, proven: every grant in deploy/ is a call the code makes, and the admission
policies confine each exporter to its own Node and its own node's DeviceTaintRules.

The calls are recorded, not listed by hand: each component runs as its own process, with
the arguments of the built manifest, against the API server stand-in, through what it does in
production (a GPU turns unhealthy, then recovers; a lease is taken and renewed), and the
stand-in records (API group, resource, verb) of every request. A grant no recorded call
needs fails the test, and so does a call no grant allows.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuquota.kube.client import Kube
from gpuquota.quota.remediation.cli import DRY_RUN_LEASE_SUFFIX
from gpuquota.sim.apiserver import ApiServer
from gpuquota.sim.harness import stop_process, wait_for
from gpuquota.sim.kubelet.checkpoint import PodDeviceEntry
from gpuquota.sim.kubelet.checkpoint import write as write_checkpoint
from gpuquota.sim.kubelet.podresources import GPU_RESOURCE as GPU
from gpuquota.sim.kubelet.podresources import ClaimAssignment, PodResourcesServer
from gpuquota.sim.kubelet.registration import KubeletStandIn
from gpuquota.sim.nvml import spec
from gpuquota.sim.nvml.control import SimNode
from gpuquota.sim.nvml.resourceslices import DRIVER, resource_slices
from tests.deploy.manifests import DEPLOY, OVERLAYS, built, find, kustomize, needs_kubectl
from tests.kubelet.exporter_proc import Exporter, scrape

Grant = tuple[str, str, str]  # (API group, resource[/subresource], verb)
NODE = "node-a"
EXPORTER_SA = ("gpuquota", "gpu-exporter")
CONTROLLER_SA = ("gpuquota", "gpuquota-controller")
# the controller watches every kind it accounts: the stand-in serves resource.k8s.io, so DRA's
WATCHED = len(Kube.KINDS) + len(Kube.DRA_KINDS)


def grants(
    docs: list[dict[str, Any]],
    account: tuple[str, str],
    names: dict[Grant, set[str]] | None = None,
) -> set[Grant]:
    """Every (group, resource, verb) the roles bound to a ServiceAccount grant; a rule narrowed
    to some objects (resourceNames) only where ``names`` is given, which receives them."""
    namespace, name = account
    subject = {"kind": "ServiceAccount", "name": name, "namespace": namespace}
    out: set[Grant] = set()
    for binding in docs:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if subject not in binding.get("subjects", []):
            continue
        role = find(docs, binding["roleRef"]["kind"], binding["roleRef"]["name"])
        for rule in role["rules"]:
            assert "nonResourceURLs" not in rule
            assert names is not None or "resourceNames" not in rule, role
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        assert "*" not in (group, resource, verb), f"wildcard in {role}"
                        out.add((group, resource, verb))
                        if names is not None and "resourceNames" in rule:
                            names.setdefault((group, resource, verb), set()).update(
                                rule["resourceNames"]
                            )
    return out


def exporter_args(docs: list[dict[str, Any]]) -> list[str]:
    """The manifest's gpu-exporter arguments, less those the test harness sets itself."""
    pod = find(docs, "DaemonSet", "gpu-exporter")["spec"]["template"]["spec"]
    own = ("--listen", "--interval", "--pod-resources-socket", "--pod-resources-interval")
    return [a for a in pod["containers"][0]["args"] if not a.startswith(own)]


@pytest.fixture
def folder() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="lp-", dir="/tmp"))  # short: unix socket paths
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run_exporter_through_an_unhealthy_gpu(overlay: str, folder: Path) -> set[Grant]:
    """gpu-exporter with the overlay's arguments on a DRA node with a claimed GPU: GPU 0 gets
    XID 79 with a pending reboot (taints, rules, condition), then recovers. Its calls."""
    docs = built(f"components/{overlay}")
    plugin_dir = folder / "device-plugins"
    plugin_dir.mkdir()
    socket_path = folder / "kubelet.sock"
    claim = ClaimAssignment("ml", "train", "main", "one-gpu", "ml", ((DRIVER, NODE, "gpu-0"),))
    with (
        SimNode.create(folder / "nvml.state", "mixed") as node,
        ApiServer(bookmark_interval=0.2) as api,
        PodResourcesServer(socket_path) as kubelet,
    ):
        api.apply("ADDED", {"kind": "Node", "apiVersion": "v1",
                            "metadata": {"name": NODE, "uid": "uid-node-a"}, "spec": {},
                            "status": {"conditions": [{"type": "Ready", "status": "True"}]}})  # fmt: skip
        for obj in resource_slices(spec.load("mixed"), NODE):
            api.apply("ADDED", obj)
        kubelet.assign_claim(claim)
        exporter = Exporter(
            node,
            socket_path,
            *exporter_args(docs),
            f"--node-name={NODE}",
            f"--kubeconfig={api.write_kubeconfig(folder / 'kubeconfig')}",
            f"--device-plugin-dir={plugin_dir}",
            "--health-quiet-period=1s",
        )
        try:
            # one change at a time, each seen published before the next: the fence is made,
            # then changed (a second reason: an update), then lifted, whatever the timing
            node.set(0, recovery_action=2)  # the driver asks for a reboot: the verdict holds
            wait_for(lambda: _marked(api), timeout=15, what="the unhealthy GPU published")
            before = _fence_text(api)
            node.inject_xid(0, 79)
            wait_for(
                lambda: _fence_text(api) != before, timeout=15, what="the new reason published"
            )
            node.set(0, recovery_action=0)
            wait_for(lambda: not _marked(api), timeout=15, what="the recovery published")
            wait_for(lambda: _calls_settled(api), timeout=10, what="watches and reads")
            return set(api.calls)
        finally:
            exporter.stop()


def _marked(api: ApiServer) -> bool:
    taints = [t["key"] for t in ((api.get("nodes", NODE) or {}).get("spec") or {}).get("taints") or []]  # fmt: skip
    return bool(taints) or api.count("devicetaintrules") > 0


def _fence_text(api: ApiServer) -> str:
    """What the published fence says: the rules' annotations and the Node's conditions."""
    with api.state.lock:
        rules = sorted(repr(r.get("metadata", {}).get("annotations"))
                       for r in api.state.objects["devicetaintrules"].values())  # fmt: skip
    conditions = ((api.get("nodes", NODE) or {}).get("status") or {}).get("conditions")
    return repr((rules, conditions))


def _calls_settled(api: ApiServer) -> bool:
    calls = set(api.calls)
    dra = any(g == "resource.k8s.io" for g, _r, _v in calls)
    if not dra:
        return True
    return {("resource.k8s.io", "resourceslices", "watch"),
            ("resource.k8s.io", "resourceclaims", "get")} <= calls  # fmt: skip


@needs_kubectl
@pytest.mark.parametrize("overlay", ["device-plugin", "dra"])
def test_exporter_roles_grant_exactly_what_the_exporter_calls(overlay: str, folder: Path) -> None:
    docs = built(f"components/{overlay}")
    granted = grants(docs, EXPORTER_SA)
    called = run_exporter_through_an_unhealthy_gpu(overlay, folder)
    assert called, "the exporter made no API call: the run proves nothing"
    assert called <= granted, f"calls no role allows: {sorted(called - granted)}"
    assert granted <= called, (
        f"{overlay} grants what the code never calls: {sorted(granted - called)}"
    )


@needs_kubectl
@pytest.mark.parametrize(
    "folder_name",
    ["base", "components/restricted", "components/dcgm-compat", "components/grafana-dashboards",
     "components/pod-usage"],
)  # fmt: skip
def test_exporters_without_api_flags_have_no_token_and_no_grant(folder_name: str) -> None:
    docs = built(folder_name)
    assert grants(docs, EXPORTER_SA) == set()
    pod = find(docs, "DaemonSet", "gpu-exporter")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False


def controller_lease(docs: list[dict[str, Any]]) -> str:
    """The Lease the manifest's controller elects through (its ConfigMap's setting)."""
    return str(find(docs, "ConfigMap", "gpuquota-controller")["data"]["GPUQUOTA_LEASE_NAME"])


@needs_kubectl
def test_controller_roles_grant_exactly_what_the_controller_calls(folder: Path) -> None:
    """The controller, electing through the manifest's Lease, until it has taken and renewed
    it: get and update of that Lease alone (resourceNames), never remediate's or another's."""
    docs = kustomize(DEPLOY / "base")
    names: dict[Grant, set[str]] = {}
    granted = grants(docs, CONTROLLER_SA, names)
    lease = controller_lease(docs)
    assert names == {("coordination.k8s.io", "leases", verb): {lease} for verb in ("get", "update")}
    with ApiServer(bookmark_interval=0.2) as api:
        kubeconfig = api.write_kubeconfig(folder / "kubeconfig")
        log = (folder / "controller.log").open("w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuquota.quota.cli", "controller", "--kubeconfig", str(kubeconfig),
             "--db", f"sqlite:///{folder / 'gq.db'}", "--migrate", "--metrics-port", "0",
             "--lease-name", lease, "--lease-namespace", "gpuquota",
             "--identity", "ctl-a", "--lease-duration", "3", "--renew-deadline", "2",
             "--retry-period", "1", "--flush-interval", "0.3"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            wait_for(
                lambda: (
                    ("coordination.k8s.io", "leases", "update") in api.calls
                    and sum(1 for c in api.calls if c[2] == "watch") >= WATCHED
                ),
                timeout=30,
                what=f"a renewed lease and every watch ({(folder / 'controller.log').read_text()})",
            )
            called = set(api.calls)
            taken = api.get("leases", lease, "gpuquota")
        finally:
            stop_process(proc)
            log.close()
    assert taken is not None and taken["spec"]["holderIdentity"] == "ctl-a"
    assert called <= granted, f"calls no role allows: {sorted(called - granted)}"
    assert granted <= called, f"grants the code never calls: {sorted(granted - called)}"


# --- the admission policies: tests/deploy/test_admission_policies.py decides them field by field


@needs_kubectl
@pytest.mark.parametrize(
    ("overlay", "kinds"),
    [("device-plugin", {"nodes", "nodes/status"}), ("dra", {"devicetaintrules"})],
)
def test_every_resource_the_exporter_may_change_is_under_a_policy(
    overlay: str, kinds: set[str]
) -> None:
    docs = built(f"components/{overlay}")
    writes = {r for _g, r, v in grants(docs, EXPORTER_SA) if v not in ("get", "list", "watch")}
    assert writes == kinds
    policies = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    covered = {
        r for p in policies for rule in p["spec"]["matchConstraints"]["resourceRules"]
        for r in rule["resources"]
    }  # fmt: skip
    assert writes <= covered
    bound = {
        d["spec"]["policyName"] for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"
    }
    assert {p["metadata"]["name"] for p in policies} <= bound


POD_READS = {("", "pods", verb) for verb in ("get", "list", "watch")}


@needs_kubectl
@pytest.mark.parametrize("build", OVERLAYS)
def test_the_agent_may_read_no_pod_in_any_build(build: str) -> None:
    """Issue 35: RBAC cannot confine a pod read to one node (a field selector is the client's
    choice), and pod specs carry credentials: no build of deploy/ lets the node agent read
    pods, whatever it composes."""
    granted = grants(built(build), EXPORTER_SA)
    assert not granted & POD_READS, f"{build}: the agent may read pods: {granted & POD_READS}"
    assert not {g for g in granted if g[1].startswith("pods")}, granted


@needs_kubectl
def test_pod_usage_calls_no_api_and_names_pods_from_the_node(folder: Path) -> None:
    """components/pod-usage with its manifest's arguments, on the kubelet stand-in, and an
    API server that would refuse pods: not one request, and the GPU's pod named."""
    docs = built("components/pod-usage")
    assert grants(docs, EXPORTER_SA) == set()
    kubelet = KubeletStandIn(folder / "dp", root_dir=folder / "root")
    (folder / "dp").mkdir()
    kubelet.start()
    uid = "6f1b3a8e-2c4d-4e5f-9a0b-1c2d3e4f5a6b"
    proc = folder / "proc" / "4242"
    proc.mkdir(parents=True)
    proc.joinpath("cgroup").write_text(f"0::/kubepods/pod{uid}/{'c' * 64}\n")
    args = [a for a in exporter_args(docs) if not a.startswith("--device-checkpoint")]
    with (
        SimNode.create(folder / "nvml.state", "h100x8") as node,
        ApiServer(bookmark_interval=0.2) as api,
    ):
        api.forbid("pods")
        gpu = node.uuid(3)
        # what the kubelet's device manager keeps after admitting the pod with GPU 3
        write_checkpoint(kubelet.checkpoint_path, [PodDeviceEntry(uid, "main", GPU, (gpu,), b"")],
                         {GPU: [gpu]})  # fmt: skip
        kubelet.stop()
        kubelet.start()  # reads the checkpoint back, as after a kubelet restart
        kubelet.admit("team-a", "trainer", {"main": {}}, uid=uid)  # known pod, no new Allocate
        node.add_process(3, 4242, 2**30)
        assert kubelet.pod_resources_socket is not None
        exporter = Exporter(
            node,
            kubelet.pod_resources_socket,
            *args,
            f"--device-checkpoint={kubelet.checkpoint_path}",
            f"--proc-root={folder / 'proc'}",
            f"--node-name={NODE}",
            f"--kubeconfig={api.write_kubeconfig(folder / 'kubeconfig')}",
        )
        try:
            wait_for(lambda: _named(exporter, "trainer", uid), timeout=20,
                     what=f"the pod named from the node ({exporter.output()})")  # fmt: skip
            called = set(api.calls)
        finally:
            exporter.stop()
            kubelet.stop()
    assert called == set(), f"pod-usage called the API server: {sorted(called)}"


def _named(exporter: Exporter, pod: str, uid: str) -> bool:
    return any(
        line.startswith("gpu_pod_memory_used_bytes{") and f'pod="{pod}"' in line
        and f'pod_uid="{uid}"' in line
        for line in scrape(exporter.port).splitlines()
    )  # fmt: skip


# --- the central remediation (deploy/components/remediation) ------------------------------------

REMEDIATE_SA = ("gpuquota", "gpuquota-remediate")


def remediate_args(docs: list[dict[str, Any]]) -> list[str]:
    """The manifest's `gpuquota remediate` arguments, less the metrics port the test sets."""
    pod = find(docs, "Deployment", "gpuquota-remediate")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["command"] == ["gpuquota", "remediate"]
    return [a for a in container["args"] if not a.startswith("--metrics-port")]


@needs_kubectl
def test_remediate_roles_grant_exactly_what_it_calls_and_its_policies_admit_it(
    folder: Path,
) -> None:
    """`gpuquota remediate` with the manifest's arguments and --evict (the documented opt-in),
    through a fenced GPU on a device-plugin node and one on a DRA node, as its ServiceAccount
    under the component's admission policies, until it has taken and renewed its Lease (the
    replicas' election: get and update of that Lease alone)."""
    from tests.remediation.cluster import make_cluster, uuid_of

    docs = built("components/remediation")
    names: dict[Grant, set[str]] = {}
    granted = grants(docs, REMEDIATE_SA, names)
    lease = next(a.split("=", 1)[1] for a in remediate_args(docs) if a.startswith("--lease-name="))
    # its own Lease, and the one the same Deployment elects through with --dry-run added
    own = {lease, lease + DRY_RUN_LEASE_SUFFIX}
    assert names == {("coordination.k8s.io", "leases", verb): own for verb in ("get", "update")}
    policies = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    assert {p["metadata"]["name"] for p in policies} == {
        "gpuquota-remediate-pod-status", "gpuquota-remediate-evictions"}  # fmt: skip
    with ApiServer() as api:
        cluster = make_cluster(api, folder)
        try:
            for i in range(8):  # healthy GPU nodes: two fenced of ten keep the breaker closed
                cluster.add_node(f"node-{i}")
            cluster.add_node("node-a")
            cluster.add_pod("ml", "train", "node-a", {uuid_of("node-a", 0): "Unhealthy"})
            cluster.agents["node-a"].xid(0, 79)
            # a DRA node: the agent's DeviceTaintRule and a pod's claim on the fenced device
            dra = {"driver": "gpu.nvidia.com", "pool": "node-d", "device": "gpu-0"}
            api.apply("ADDED", {"kind": "DeviceTaintRule", "apiVersion": "resource.k8s.io/v1",
                                "metadata": {"name": "gpuquota-node-d-gpu-0", "uid": "r1",
                                             "labels": {"app.kubernetes.io/managed-by": "gpuquota-exporter",
                                                        "gpuquota.io/node": "node-d"},
                                             "annotations": {"gpuquota.io/device-uuid": "GPU-d0",
                                                             "gpuquota.io/reasons": "xid_79",
                                                             "gpuquota.io/action": "reboot_node"}},
                                "spec": {"deviceSelector": dra,
                                         "taint": {"key": "gpuquota.io/gpu-unhealthy",
                                                   "value": "reboot_node", "effect": "NoSchedule"}}})  # fmt: skip
            pod = cluster.add_pod("ml", "dra-job", "node-d", {}, uid="uid-dra")
            pod["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": "c"}]
            api.apply("MODIFIED", pod)
            api.apply("ADDED", {"kind": "ResourceClaim", "apiVersion": "resource.k8s.io/v1",
                                "metadata": {"name": "c", "namespace": "ml", "uid": "uid-c"},
                                "spec": {}, "status": {
                                    "reservedFor": [{"resource": "pods", "name": "dra-job",
                                                     "uid": "uid-dra"}],
                                    "allocation": {"devices": {"results": [
                                        {"request": "gpu", **dra}]}}}})  # fmt: skip
            api.calls.clear()
            api.admit(policies, {"username": "system:serviceaccount:gpuquota:gpuquota-remediate"})
            log = folder / "remediate.log"
            with log.open("w") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "gpuquota.quota.cli", "remediate",
                     *remediate_args(docs), "--evict", "--evict-max=5", "--evict-after=100ms",
                     f"--kubeconfig={folder / 'kubeconfig'}", f"--db={cluster.db_url}",
                     "--metrics-port=0", "--retry-period=1s", "--renew-deadline=2s"],
                    stdout=out, stderr=subprocess.STDOUT,
                    env={**os.environ, "POD_NAMESPACE": "gpuquota"},  # as the manifest sets it
                )  # fmt: skip
                try:
                    wait_for(
                        lambda: (
                            api.get("pods", "train", "ml") is None
                            and api.get("pods", "dra-job", "ml") is None
                            and ("coordination.k8s.io", "leases", "update") in api.calls
                        ),
                        timeout=60,
                        what="both pods evicted and the Lease renewed",
                    )
                    called = set(api.calls)
                finally:
                    stop_process(proc)
            assert "forbidden" not in log.read_text().lower(), log.read_text()
            assert api.get("leases", lease, "gpuquota") is not None
        finally:
            cluster.close()
    assert called <= granted, f"calls no role allows: {sorted(called - granted)}"
    assert granted <= called, f"grants the code never calls: {sorted(granted - called)}"
    writes = {r for _g, r, v in granted if v not in ("get", "list", "watch")}
    assert writes == {"pods/status", "pods/eviction", "events", "leases"}  # leases: its own
