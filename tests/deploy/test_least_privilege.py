"""Least privilege, proven: every grant in deploy/ is a call the code makes, and the admission
policies confine each exporter to its own Node and its own node's DeviceTaintRules.

The calls are recorded, not listed by hand: each component runs as its own process, with
the arguments of the built manifest, against the API server stand-in, through what it does in
production (a GPU turns unhealthy, then recovers; a lease is taken and renewed), and the
stand-in records (API group, resource, verb) of every request. A grant no recorded call
needs fails the test, and so does a call no grant allows.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuquota.kube.client import Kube
from gpuquota.sim.apiserver import ApiServer
from gpuquota.sim.harness import stop_process, wait_for
from gpuquota.sim.kubelet.podresources import ClaimAssignment, PodResourcesServer
from gpuquota.sim.nvml import spec
from gpuquota.sim.nvml.control import SimNode
from gpuquota.sim.nvml.resourceslices import DRIVER, resource_slices
from tests.deploy.manifests import DEPLOY, built, find, kustomize, needs_kubectl
from tests.kubelet.exporter_proc import Exporter

Grant = tuple[str, str, str]  # (API group, resource[/subresource], verb)
NODE = "node-a"
EXPORTER_SA = ("gpuquota", "gpu-exporter")
CONTROLLER_SA = ("gpuquota", "gpuquota-controller")
# the controller watches every kind it accounts: the stand-in serves resource.k8s.io, so DRA's
WATCHED = len(Kube.KINDS) + len(Kube.DRA_KINDS)


def grants(docs: list[dict[str, Any]], account: tuple[str, str]) -> set[Grant]:
    """Every (group, resource, verb) the roles bound to a ServiceAccount grant."""
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
            assert "resourceNames" not in rule and "nonResourceURLs" not in rule
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        assert "*" not in (group, resource, verb), f"wildcard in {role}"
                        out.add((group, resource, verb))
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
            node.inject_xid(0, 79)
            node.set(0, recovery_action=2)  # the driver asks for a reboot: the verdict holds
            wait_for(lambda: _marked(api), timeout=15, what="the unhealthy GPU published")
            node.set(0, recovery_action=0)
            wait_for(lambda: not _marked(api), timeout=15, what="the recovery published")
            wait_for(lambda: _calls_settled(api), timeout=10, what="watches and reads")
            return set(api.calls)
        finally:
            exporter.stop()


def _marked(api: ApiServer) -> bool:
    taints = [t["key"] for t in ((api.get("nodes", NODE) or {}).get("spec") or {}).get("taints") or []]  # fmt: skip
    return bool(taints) or api.count("devicetaintrules") > 0


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
    ["base", "components/restricted", "components/dcgm-compat", "components/grafana-dashboards"],
)
def test_exporters_without_api_flags_have_no_token_and_no_grant(folder_name: str) -> None:
    docs = built(folder_name)
    assert grants(docs, EXPORTER_SA) == set()
    pod = find(docs, "DaemonSet", "gpu-exporter")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False


@needs_kubectl
def test_controller_roles_grant_exactly_what_the_controller_calls(folder: Path) -> None:
    docs = kustomize(DEPLOY / "base")
    granted = grants(docs, CONTROLLER_SA)
    with ApiServer(bookmark_interval=0.2) as api:
        kubeconfig = api.write_kubeconfig(folder / "kubeconfig")
        log = (folder / "controller.log").open("w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuquota.quota.cli", "controller", "--kubeconfig", str(kubeconfig),
             "--db", f"sqlite:///{folder / 'gq.db'}", "--migrate", "--metrics-port", "0",
             "--lease-name", "gpuquota-controller", "--lease-namespace", "gpuquota",
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
        finally:
            stop_process(proc)
            log.close()
    assert called <= granted, f"calls no role allows: {sorted(called - granted)}"
    assert granted <= called, f"grants the code never calls: {sorted(granted - called)}"


# --- the admission policies, evaluated with a CEL implementation -------------------------------


def _policy(overlay: str, name: str) -> dict[str, Any]:
    docs = [
        d for d in yaml.safe_load_all((DEPLOY / "components" / overlay / name).read_text()) if d
    ]
    policy = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicy")
    binding = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    return policy


def admitted(policy: dict[str, Any], request: dict[str, Any], obj: Any, old: Any) -> bool:
    """Whether ``policy`` lets the request through (matchConditions, variables, validations)."""
    import celpy

    env = celpy.Environment()
    activation: dict[str, Any] = {
        "request": celpy.json_to_cel(request),
        "object": celpy.json_to_cel(obj),
        "oldObject": celpy.json_to_cel(old),
    }

    def evaluate(expression: str) -> Any:
        return env.program(env.compile(expression)).evaluate(activation)

    def holds(expression: str) -> bool | None:
        """True or False; None when evaluating fails (a missing field, a type error)."""
        value = evaluate(expression)
        return bool(value) if isinstance(value, celpy.celtypes.BoolType) else None

    for condition in policy["spec"].get("matchConditions", []):
        if holds(condition["expression"]) is False:
            return True  # not the exporter: the policy does not apply
    variables: dict[Any, Any] = {}
    for variable in policy["spec"].get("variables", []):
        variables[celpy.celtypes.StringType(variable["name"])] = evaluate(variable["expression"])
        activation["variables"] = celpy.celtypes.MapType(variables)
    # with failurePolicy Fail an error refuses the request, as a false validation does
    return all(holds(v["expression"]) is True for v in policy["spec"]["validations"])


def _request(operation: str, *, node: str | None = NODE, sub: str = "",
             user: str = "system:serviceaccount:gpuquota:gpu-exporter") -> dict[str, Any]:  # fmt: skip
    extra = {"authentication.kubernetes.io/node-name": [node]} if node else {}
    return {"operation": operation, "subResource": sub,
            "userInfo": {"username": user, "extra": extra}}  # fmt: skip


def _node(name: str = NODE, taints: list[dict] | None = None, labels: dict | None = None,
          conditions: list[dict] | None = None) -> dict[str, Any]:  # fmt: skip
    return {"metadata": {"name": name, "labels": labels or {"zone": "a"}},
            "spec": {"taints": taints or [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]},
            "status": {"conditions": conditions or [{"type": "Ready", "status": "True"}],
                       "capacity": {"nvidia.com/gpu": "8"}}}  # fmt: skip


OURS = {"key": "gpuquota.io/gpu-unhealthy", "value": "true", "effect": "NoSchedule"}
DEDICATED = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}


def test_node_policy_lets_an_exporter_mark_only_its_own_node() -> None:
    policy = _policy("device-plugin", "node-admission-policy.yaml")
    before = _node()
    tainted = _node(taints=[DEDICATED, OURS])
    assert admitted(policy, _request("UPDATE"), tainted, before)
    assert admitted(policy, _request("UPDATE"), before, tainted)  # and removes it again
    condition = _node(conditions=[{"type": "Ready", "status": "True"},
                                  {"type": "GPUUnhealthy", "status": "True"}])  # fmt: skip
    assert admitted(policy, _request("UPDATE", sub="status"), condition, before)
    # another node, no node in the token, a delete: refused
    other_before, other_after = _node("node-b"), _node("node-b", taints=[DEDICATED, OURS])
    assert not admitted(policy, _request("UPDATE"), other_after, other_before)
    assert not admitted(policy, _request("UPDATE", node=None), tainted, before)
    assert not admitted(policy, _request("DELETE"), None, before)
    # its own node, but what is not the exporter's: labels, other taints, other conditions
    assert not admitted(policy, _request("UPDATE"), _node(labels={"zone": "b"}), before)
    assert not admitted(policy, _request("UPDATE"), _node(taints=[OURS]), before)
    ready_false = _node(conditions=[{"type": "Ready", "status": "False"}])
    assert not admitted(policy, _request("UPDATE", sub="status"), ready_false, before)
    # anyone else is not this policy's business
    admin = _request("UPDATE", node=None, user="kubernetes-admin")
    assert admitted(policy, admin, other_after, other_before)


def _rule(node: str = NODE, pool: str = NODE, labelled: str | None = None) -> dict[str, Any]:
    return {"metadata": {"name": f"gpuquota-{node}-gpu-0",
                         "labels": {"app.kubernetes.io/managed-by": "gpuquota-exporter",
                                    "gpuquota.io/node": labelled or node}},
            "spec": {"deviceSelector": {"driver": DRIVER, "pool": pool, "device": "gpu-0"},
                     "taint": {"key": "gpuquota.io/gpu-unhealthy", "effect": "NoSchedule"}}}  # fmt: skip


def test_device_taint_rule_policy_confines_an_exporter_to_its_own_devices() -> None:
    policy = _policy("dra", "dra-admission-policy.yaml")
    mine = _rule()
    assert admitted(policy, _request("CREATE"), mine, None)
    assert admitted(policy, _request("UPDATE"), mine, mine)
    assert admitted(policy, _request("DELETE"), None, mine)
    theirs = _rule("node-b")
    assert not admitted(policy, _request("CREATE"), theirs, None)
    assert not admitted(policy, _request("DELETE"), None, theirs)
    assert not admitted(policy, _request("UPDATE"), mine, theirs)  # taking over another's rule
    assert not admitted(policy, _request("CREATE"), _rule(pool="node-b"), None)  # their devices
    assert not admitted(policy, _request("CREATE", node=None), mine, None)
    assert admitted(policy, _request("CREATE", node=None, user="kubernetes-admin"), theirs, None)


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


@needs_kubectl
def test_pod_usage_role_grants_exactly_what_the_exporter_calls(folder: Path) -> None:
    """components/pod-usage: the pod list that joins a process's pod UID to its name, nothing more."""
    docs = built("components/pod-usage")
    granted = grants(docs, EXPORTER_SA)
    socket_path = folder / "kubelet.sock"
    with (
        SimNode.create(folder / "nvml.state", "h100x8") as node,
        ApiServer(bookmark_interval=0.2) as api,
        PodResourcesServer(socket_path),
    ):
        exporter = Exporter(
            node,
            socket_path,
            *exporter_args(docs),
            f"--node-name={NODE}",
            f"--kubeconfig={api.write_kubeconfig(folder / 'kubeconfig')}",
        )
        try:
            wait_for(lambda: ("", "pods", "list") in set(api.calls), timeout=15,
                     what="the exporter's pod list")  # fmt: skip
            called = set(api.calls)
        finally:
            exporter.stop()
    assert called <= granted, f"calls no role allows: {sorted(called - granted)}"
    assert granted <= called, (
        f"pod-usage grants what the code never calls: {sorted(granted - called)}"
    )
