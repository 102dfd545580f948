"""The admission policies in deploy/ are allow-lists, decided with the real server's CEL semantics
(sim/admission.py): on its Node the exporter may change its own taint and
condition and nothing else; a DeviceTaintRule it writes is pinned to its driver, its node's
pool, its name and its own labels. Every field of the Node and DeviceTaintRule schemas (from
the kubernetes client's models) is tried: only the allowed ones pass, and every denial carries
the policy's own message, never a CEL error.
"""

from __future__ import annotations

import copy
from typing import Any

import celpy
import pytest
import yaml
from kubernetes import client

from gpuquota.exporter.dra.taintrules import rule_name
from gpuquota.sim.admission import Decision, Policy, request
from gpuquota.sim.nvml.resourceslices import DRIVER
from tests.deploy.manifests import DEPLOY

NODE = "node-a"
EXPORTER = "system:serviceaccount:gpuquota:gpu-exporter"
OURS = {"key": "gpuquota.io/gpu-unhealthy", "value": "true", "effect": "NoSchedule"}
DEDICATED = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
UNREACHABLE = {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute",
               "timeAdded": "2026-11-25T10:00:00Z"}  # fmt: skip
# what the API server itself writes on every request, before admission: not ours to compare
SERVER_SET = {"resourceVersion", "managedFields", "generation"}


def _policy(overlay: str, name: str) -> Policy:
    docs = [
        d for d in yaml.safe_load_all((DEPLOY / "components" / overlay / name).read_text()) if d
    ]
    policy = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicy")
    binding = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    return Policy(policy)


NODE_POLICY = _policy("device-plugin", "node-admission-policy.yaml")
DTR_POLICY = _policy("dra", "dra-admission-policy.yaml")


def _req(operation: str, *, node: str | None = NODE, sub: str | None = None,
         user: str = EXPORTER) -> dict[str, Any]:  # fmt: skip
    return request(operation, node=node, sub=sub, user=user)


def admitted(policy: Policy, req: dict[str, Any], obj: Any, old: Any) -> bool:
    decision = policy.decide(req, obj, old)
    assert not decision.error, decision.message  # a denial must be the policy's own message
    return decision.allowed


# -- the evaluator behaves as the real server's CEL --------------------------------------------


def test_the_evaluator_has_the_real_servers_semantics_for_missing_keys_and_errors() -> None:
    def value(expression: str, req: dict[str, Any]) -> Any:
        env = celpy.Environment()
        try:
            return env.program(env.compile(expression)).evaluate(
                {"request": celpy.json_to_cel(req)}
            )
        except celpy.evaluation.CELEvalError as exc:
            return exc

    main = _req("UPDATE")  # a request to the main resource: no subResource key at all
    assert "subResource" not in main
    assert isinstance(value("request.subResource != 'status'", main), celpy.evaluation.CELEvalError)
    assert value("has(request.subResource)", main) == celpy.celtypes.BoolType(False)
    # an error inside || is swallowed when the other side is true, and only then
    assert value("request.subResource == '' || true", main) == celpy.celtypes.BoolType(True)
    assert value("true || request.subResource == ''", main) == celpy.celtypes.BoolType(True)
    assert isinstance(
        value("false || request.subResource == ''", main), celpy.evaluation.CELEvalError
    )
    assert value("request.subResource == '' && false", main) == celpy.celtypes.BoolType(False)
    # a policy whose validation errors is refused with the raw expression, as the server's 422
    erroring = Policy({"spec": {"validations": [{"expression": "request.subResource != 'status'",
                                                  "message": "never shown"}]}})  # fmt: skip
    decision = erroring.decide(main, {}, {})
    assert decision == Decision(
        False,
        "expression 'request.subResource != 'status'' resulted in error: no such key: subResource",
        True,
    )
    with pytest.raises(ValueError, match="cannot evaluate optional syntax"):
        Policy(
            {"spec": {"validations": [{"expression": "request.?subResource.orValue('') == ''"}]}}
        )


def test_the_6c36c52_policies_error_on_a_request_to_the_main_resource() -> None:
    """Finding 6: the old node policy read request.subResource, absent on the main resource;
    with the real semantics that is an error (a 422 quoting the expression), not a decision."""
    old = Policy({"spec": {"validations": [
        {"expression": "request.subResource != 'status' || true", "message": "m"},
        {"expression": "request.subResource != '' || false", "message": "m"}]}})  # fmt: skip
    decision = old.decide(_req("UPDATE"), _node(), _node())
    assert decision.error and "no such key: subResource" in (decision.message or "")
    for policy in (NODE_POLICY, DTR_POLICY):
        expressions = [v["expression"] for key in ("variables", "validations")
                       for v in policy.spec.get(key, [])]  # fmt: skip
        assert not any("subResource" in e for e in expressions)


# -- the Node policy ---------------------------------------------------------------------------


def _node(name: str = NODE, taints: list[dict[str, Any]] | None = None,
          conditions: list[dict[str, Any]] | None = None) -> dict[str, Any]:  # fmt: skip
    """A Node about as the real server returns it."""
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name, "uid": "3f1c", "resourceVersion": "480", "creationTimestamp": "2026-11-20T09:00:00Z",
            "labels": {"kubernetes.io/hostname": name, "nvidia.com/gpu.present": "true"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
            "managedFields": [{"manager": "kubelet", "operation": "Update"}],
        },
        "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"], "providerID": "aws:///i-1",
                 "taints": [UNREACHABLE, DEDICATED] if taints is None else taints},
        "status": {
            "capacity": {"cpu": "16", "nvidia.com/gpu": "8"},
            "allocatable": {"cpu": "15", "nvidia.com/gpu": "8"},
            "conditions": conditions or [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.7"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"kubeletVersion": "v1.36.2", "bootID": "b1", "machineID": "m1",
                         "osImage": "Debian", "architecture": "amd64"},
            "images": [{"names": ["busybox"], "sizeBytes": 1}],
        },
    }  # fmt: skip


def _changed(value: Any) -> Any:
    """A different value of about the same shape (or a made-up one where there was none)."""
    if isinstance(value, dict):
        return {**value, "made-up": "x"}
    if isinstance(value, list):
        return (
            [*value, {"made-up": "x"}]
            if value and isinstance(value[0], dict)
            else [*value, "made-up"]
        )
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return value + "-x"
    return {"made-up": "x"}


def _fields(model: Any) -> list[str]:
    return list(model.attribute_map.values())


def _mutations(obj: dict[str, Any], sections: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(path, a copy of obj with that one field changed) for every field of the schemas; a
    field that is itself a section is tried field by field (a made-up key in a typed object
    cannot reach the server's admission: it rejects or prunes unknown fields)."""
    out = []
    for section, model in sections.items():
        for name in _fields(model):
            if f"{section}.{name}" in sections:
                continue
            changed = copy.deepcopy(obj)
            parent = changed
            for part in section.split("."):
                parent = parent.setdefault(part, {})
            parent[name] = _changed(parent.get(name))
            out.append((f"{section}.{name}", changed))
    return out


NODE_SECTIONS = {"metadata": client.V1ObjectMeta, "spec": client.V1NodeSpec,
                 "status": client.V1NodeStatus, "status.nodeInfo": client.V1NodeSystemInfo}  # fmt: skip
NODE_ALLOWED = {f"metadata.{f}" for f in SERVER_SET}


@pytest.mark.parametrize(
    ("path", "changed"),
    _mutations(_node(), NODE_SECTIONS),
    ids=lambda p: p if isinstance(p, str) else "",
)
def test_the_node_policy_lets_no_field_change_but_our_taint_and_condition(
    path: str, changed: dict[str, Any]
) -> None:
    before = _node()
    for sub in (None, "status"):
        decision = NODE_POLICY.decide(_req("UPDATE", sub=sub), changed, before)
        assert not decision.error, decision.message
        if path in NODE_ALLOWED:
            assert decision.allowed, (path, decision.message)
        else:
            assert not decision.allowed, f"{path} changed and the policy let it through"
            assert "gpu-exporter may" in (decision.message or "")


def test_the_node_policy_lets_an_exporter_set_only_its_own_taint_and_condition() -> None:
    before = _node()
    tainted = _node(taints=[UNREACHABLE, DEDICATED, OURS])
    assert admitted(NODE_POLICY, _req("UPDATE"), tainted, before)
    assert admitted(NODE_POLICY, _req("UPDATE"), before, tainted)  # and removes it again
    ours_cond = {
        "type": "GPUUnhealthy",
        "status": "True",
        "reason": "GPUUnhealthy",
        "message": "1 unhealthy",
    }
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady"}
    marked = _node(conditions=[ready, ours_cond])
    assert admitted(NODE_POLICY, _req("UPDATE", sub="status"), marked, before)
    assert admitted(
        NODE_POLICY,
        _req("UPDATE", sub="status"),
        _node(conditions=[ready, {**ours_cond, "status": "False"}]),
        marked,
    )
    denied = {
        "our taint with NoExecute": _node(taints=[UNREACHABLE, DEDICATED, {**OURS, "effect": "NoExecute"}]),
        "our taint twice": _node(taints=[UNREACHABLE, DEDICATED, OURS, {**OURS, "effect": "PreferNoSchedule"}]),
        "another taint's timeAdded dropped": _node(taints=[{k: v for k, v in UNREACHABLE.items() if k != "timeAdded"}, DEDICATED, OURS]),
        "another taint removed": _node(taints=[DEDICATED, OURS]),
        "other taints reordered": _node(taints=[DEDICATED, UNREACHABLE, OURS]),
        "another condition changed": _node(conditions=[{**ready, "status": "False"}]),
        "a condition added for someone else": _node(conditions=[ready, {**ours_cond, "type": "DiskPressure"}]),
    }  # fmt: skip
    for what, after in denied.items():
        decision = NODE_POLICY.decide(_req("UPDATE"), after, before)
        assert not decision.allowed and not decision.error, what
        assert (decision.message or "").startswith("on its Node, gpu-exporter may"), what
    # another node, no node in the token, a create or a delete: refused with the policy's words
    other = _node("node-b")
    for req, obj, old in ((_req("UPDATE"), _node("node-b", taints=[UNREACHABLE, DEDICATED, OURS]), other),
                          (_req("UPDATE", node=None), tainted, before),
                          (_req("DELETE"), None, before), (_req("CREATE"), before, None)):  # fmt: skip
        decision = NODE_POLICY.decide(req, obj, old)
        assert not decision.allowed and not decision.error, decision.message
        assert (decision.message or "").startswith("gpu-exporter may")
    # anyone else is not this policy's business
    admin = _req("UPDATE", node=None, user="kubernetes-admin")
    assert admitted(NODE_POLICY, admin, _node("node-b", taints=[OURS]), other)


def test_a_made_up_owner_reference_on_the_node_is_refused() -> None:
    """Finding 4: accepted on 6c36c52 (its policy compared labels, annotations, unschedulable
    and other taints only), after which the garbage collector deleted the Node
    (tests/sim_cluster/test_apiserver_gc.py shows that harm on the stand-in)."""
    owned = _node()
    owned["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": "ghost",
                                             "uid": "no-such-uid"}]  # fmt: skip
    decision = NODE_POLICY.decide(_req("UPDATE"), owned, _node())
    assert decision == Decision(
        False,
        "on its Node, gpu-exporter may change only its taint and condition; metadata stays as it is",
    )


# -- the DeviceTaintRule policy ----------------------------------------------------------------


def _rule(node: str = NODE, pool: str | None = None, labelled: str | None = None,
          driver: str = DRIVER, device: str = "gpu-0") -> dict[str, Any]:  # fmt: skip
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
        "metadata": {"name": rule_name(node, device),
                     "labels": {"app.kubernetes.io/managed-by": "gpuquota-exporter",
                                "gpuquota.io/node": labelled or node},
                     "annotations": {"gpuquota.io/device-uuid": "GPU-1", "gpuquota.io/reasons": "xid_79",
                                     "gpuquota.io/action": "reboot_node"}},
        "spec": {"deviceSelector": {"driver": driver, "pool": pool or node, "device": device},
                 "taint": {"key": "gpuquota.io/gpu-unhealthy", "value": "reboot_node", "effect": "NoSchedule"}},
    }  # fmt: skip


def _stored(rule: dict[str, Any]) -> dict[str, Any]:
    """The rule as the server stores it (what an UPDATE's oldObject is)."""
    out = copy.deepcopy(rule)
    out["metadata"].update(uid="9a7", resourceVersion="77", creationTimestamp="2026-11-25T10:00:00Z",
                           managedFields=[{"manager": "gpu-exporter"}])  # fmt: skip
    out["spec"]["taint"]["timeAdded"] = "2026-11-25T10:00:00Z"
    out["status"] = {"conditions": [{"type": "EvictionInProgress", "status": "False",
                                     "reason": "NoEffect", "message": "Eviction only happens for the NoExecute effect."}]}  # fmt: skip
    return out


DTR_SECTIONS = {"metadata": client.V1ObjectMeta, "spec": client.V1DeviceTaintRuleSpec,
                "spec.deviceSelector": client.V1DeviceTaintSelector, "spec.taint": client.V1DeviceTaint,
                "status": client.V1DeviceTaintRuleStatus}  # fmt: skip
# the exporter's own: its annotations (under gpuquota.io/), the taint's value (the action) and
# timeAdded (kept from the server's), and what the server sets on every write
DTR_ALLOWED = {f"metadata.{f}" for f in SERVER_SET} | {"spec.taint.value", "spec.taint.timeAdded"}


@pytest.mark.parametrize(
    ("path", "changed"),
    _mutations(_stored(_rule()), DTR_SECTIONS),
    ids=lambda p: p if isinstance(p, str) else "",
)
def test_the_rule_policy_lets_no_field_change_but_what_the_exporter_owns(
    path: str, changed: dict[str, Any]
) -> None:
    decision = DTR_POLICY.decide(_req("UPDATE"), changed, _stored(_rule()))
    assert not decision.error, decision.message
    if path in DTR_ALLOWED:
        assert decision.allowed, (path, decision.message)
    else:
        assert not decision.allowed, f"{path} changed and the policy let it through"
        assert "gpu-exporter" in (decision.message or "")


def test_the_rule_policy_confines_an_exporter_to_its_own_devices() -> None:
    mine = _rule()
    assert admitted(DTR_POLICY, _req("CREATE"), mine, None)
    assert admitted(DTR_POLICY, _req("UPDATE"), _stored(mine), _stored(mine))
    assert admitted(DTR_POLICY, _req("DELETE"), None, _stored(mine))
    notes = copy.deepcopy(mine)
    notes["metadata"]["annotations"]["gpuquota.io/reasons"] = "recovery_reboot"
    assert admitted(DTR_POLICY, _req("UPDATE"), _stored(notes), _stored(mine))
    theirs = _rule("node-b")
    refused: dict[str, tuple[dict[str, Any], Any, Any]] = {
        "a rule of another node": (_req("CREATE"), theirs, None),
        "deleting another node's rule": (_req("DELETE"), None, _stored(theirs)),
        "taking over another node's rule": (_req("UPDATE"), _stored(mine), _stored(theirs)),
        "another node's devices": (_req("CREATE"), _rule(pool="node-b"), None),
        "another driver (finding 4)": (_req("CREATE"), _rule(driver="nic.example.com"), None),
        "a name not its device's": (_req("CREATE"), {**mine, "metadata": {**mine["metadata"], "name": "gpuquota-node-a-gpu-1"}}, None),
        "no node in the token": (_req("CREATE", node=None), mine, None),
        "NoExecute": (_req("CREATE"), {**mine, "spec": {**mine["spec"], "taint": {**mine["spec"]["taint"], "effect": "NoExecute"}}}, None),
        "another taint key": (_req("CREATE"), {**mine, "spec": {**mine["spec"], "taint": {**mine["spec"]["taint"], "key": "x"}}}, None),
        "an owner reference": (_req("CREATE"), {**mine, "metadata": {**mine["metadata"], "ownerReferences": [{"uid": "u"}]}}, None),
        "a finalizer": (_req("CREATE"), {**mine, "metadata": {**mine["metadata"], "finalizers": ["x/y"]}}, None),
        "someone else's label": (_req("CREATE"), {**mine, "metadata": {**mine["metadata"], "labels": {**mine["metadata"]["labels"], "team": "a"}}}, None),
        "someone else's annotation": (_req("CREATE"), {**mine, "metadata": {**mine["metadata"], "annotations": {"x.io/y": "z"}}}, None),
        "no selector": (_req("CREATE"), {**mine, "spec": {"taint": mine["spec"]["taint"]}}, None),
    }  # fmt: skip
    for what, (req, obj, old) in refused.items():
        decision = DTR_POLICY.decide(req, obj, old)
        assert not decision.allowed and not decision.error, (what, decision.message)
        assert "gpu-exporter" in (decision.message or ""), what
    assert admitted(DTR_POLICY, _req("CREATE", node=None, user="kubernetes-admin"), theirs, None)


def test_a_driver_older_than_the_api_version_selector_fields_is_refused_without_error() -> None:
    """Every expression guards optional fields with has(): an object missing any of them is
    denied with the policy's message, not a 'no such key' error."""
    for path in ("spec.deviceSelector.driver", "spec.deviceSelector.pool", "spec.deviceSelector.device",
                 "spec.taint.key", "spec.taint.effect", "metadata.labels", "spec.deviceSelector", "spec.taint"):  # fmt: skip
        rule = _rule()
        parent: Any = rule
        *head, last = path.split(".")
        for part in head:
            parent = parent[part]
        del parent[last]
        decision = DTR_POLICY.decide(_req("CREATE"), rule, None)
        assert not decision.allowed and not decision.error, (path, decision.message)


# a node name as long as Kubernetes allows (253), the 242nd character of its rule name a dot
LONG_NODE = "n" * 232 + "." + "m" * 20


def test_a_rule_for_a_device_of_a_node_with_a_long_name_is_valid_and_admitted() -> None:
    """gpuquota-<node>-<device> over 253 characters: the exporter's name is a valid DNS
    subdomain (cut without a trailing dot, then a hash) and the policy admits it for its own
    node, and only for it."""
    import re

    name = rule_name(LONG_NODE, "gpu-0")
    label = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
    assert len(name) <= 253 and re.fullmatch(rf"{label}(\.{label})*", name), name
    mine = _rule(LONG_NODE)
    req = _req("CREATE", node=LONG_NODE)
    assert admitted(DTR_POLICY, req, mine, None)
    assert admitted(DTR_POLICY, _req("UPDATE", node=LONG_NODE), _stored(mine), _stored(mine))
    # the name of another node's rule (its first 200 characters differ), or without the hash
    other = LONG_NODE.replace("n", "o", 1)
    for what, wrong in (
        ("another node's name", rule_name(other, "gpu-0")),
        ("no hash", name[:-11]),
    ):
        obj = {**mine, "metadata": {**mine["metadata"], "name": wrong}}
        decision = DTR_POLICY.decide(req, obj, None)
        assert not decision.allowed and not decision.error, (what, decision.message)
