"""The API server stand-in answers the dry-run requests of `gpuquota remediate` (and the ones
the stand-in's own dry-run tests make) as the real Kubernetes 1.36 API server answered them on
tools/real-cluster (docs/real-cluster.md, 2026-11-29): the same status code and, as JSON, the
same Status body. The pods, the PodDisruptionBudget's status and the admission policies are
the run's: gpu-d with no budget, gpu-p behind one with maxUnavailable 0 (the disruption
controller's status for pods without a controller), components/remediation's policies judging
the component's ServiceAccount."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from gpuquota.sim.apiserver import ApiServer
from tests.deploy.manifests import built, needs_kubectl

NS = "gq-checks"
UID = {"gpu-d": "d65939d3-01ce-4fec-a23b-2c424d43c424", "gpu-p": "eeec929e-e8a3-4e87-83f0-443754de4801"}  # fmt: skip
WRONG = "00000000-0000-0000-0000-000000000000"
PDB_STATUS = {  # as kube-controller-manager's disruption controller wrote it in the run
    "conditions": [{"lastTransitionTime": "2026-11-29T06:20:51Z", "message": "",
                    "observedGeneration": 1, "reason": "InsufficientPods", "status": "False",
                    "type": "DisruptionAllowed"}],
    "currentHealthy": 1, "desiredHealthy": 0, "disruptionsAllowed": 0, "expectedPods": 0,
    "observedGeneration": 1,
}  # fmt: skip
DENIED = (
    "ValidatingAdmissionPolicy 'gpuquota-remediate-evictions' with binding "
    "'gpuquota-remediate-evictions' denied request: gpuquota-remediate evicts only with the "
    "pod's UID as a precondition (deleteOptions.preconditions.uid)"
)
IMMUTABLE = {"reason": "FieldValueInvalid", "field": "metadata.uid",
             "message": f'Invalid value: "{WRONG}": field is immutable'}  # fmt: skip
NOT_ALL = 'Unsupported value: ["Some"]: supported values: "All"'


def failure(code: int, message: str, reason: str | None, details: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                            "status": "Failure", "message": message}  # fmt: skip
    if reason:
        body["reason"] = reason
    if details is not None:
        body["details"] = details
    return {**body, "code": code}


# what the real server answered: (what, pod/subresource, request body, query) -> (code, body)
REAL: list[tuple[str, str, dict[str, Any], str, int, dict[str, Any] | None]] = [
    ("evict gpu-d (no PDB)", "gpu-d/eviction", {"preconditions": {"uid": UID["gpu-d"]}},
     "dryRun=All", 201,
     {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    ("evict gpu-p (PDB maxUnavailable 0)", "gpu-p/eviction",
     {"preconditions": {"uid": UID["gpu-p"]}}, "dryRun=All", 429,
     failure(429, "Cannot evict pod as it would violate the pod's disruption budget.",
             "TooManyRequests", {"causes": [{"reason": "DisruptionBudget", "message":
                                             "The disruption budget gpu-p does not allow evicting pods currently"}]})),
    ("evict gpu-d, no preconditions.uid", "gpu-d/eviction", {}, "dryRun=All", 403,
     failure(403, f'pods "gpu-d" is forbidden: {DENIED}', "Forbidden",
             {"name": "gpu-d", "kind": "pods", "causes": [{"message": DENIED}]})),
    ("evict gpu-d, a wrong uid", "gpu-d/eviction", {"preconditions": {"uid": WRONG}},
     "dryRun=All", 409,
     failure(409, f'Operation cannot be fulfilled on Pod "gpu-d": the UID in the precondition '
                  f"({WRONG}) does not match the UID in record ({UID['gpu-d']}). The object "
                  "might have been deleted and then recreated", "Conflict",
             {"name": "gpu-d", "kind": "Pod"})),
    ("evict gpu-d, deleteOptions.dryRun [Other]", "gpu-d/eviction",
     {"preconditions": {"uid": UID["gpu-d"]}, "dryRun": ["Other"]}, "dryRun=All", 500,
     failure(500, "Non-matching dry-run options in request and content: [All] and [Other]",
             None)),
    ("patch gpu-d status, a wrong uid", "gpu-d/status", {"uid": WRONG}, "dryRun=All", 422,
     failure(422, f'Pod "gpu-d" is invalid: metadata.uid: Invalid value: "{WRONG}": field is '
                  "immutable", "Invalid",
             {"name": "gpu-d", "kind": "Pod", "causes": [IMMUTABLE, IMMUTABLE]})),
    ("patch gpu-d status, dryRun=Some", "gpu-d/status", {"uid": UID["gpu-d"]}, "dryRun=Some",
     422,
     failure(422, f'PatchOptions.meta.k8s.io "" is invalid: dryRun: {NOT_ALL}', "Invalid",
             {"group": "meta.k8s.io", "kind": "PatchOptions",
              "causes": [{"reason": "FieldValueNotSupported", "message": NOT_ALL,
                          "field": "dryRun"}]})),
    ("patch gpu-d status", "gpu-d/status", {"uid": UID["gpu-d"]}, "dryRun=All", 200, None),
]  # fmt: skip


def pod(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": name, "namespace": NS, "uid": UID[name], "labels": labels},
            "spec": {"nodeName": "gq-node", "containers": [{"name": "work"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}  # fmt: skip


@pytest.fixture
def server() -> Iterator[ApiServer]:
    policies = [d for d in built("components/remediation") if d["kind"] == "ValidatingAdmissionPolicy"]  # fmt: skip
    with ApiServer() as api:
        api.apply("ADDED", pod("gpu-d", {}))
        api.apply("ADDED", pod("gpu-p", {"gq-check": "pdb"}))
        api.apply("ADDED", {"kind": "PodDisruptionBudget", "apiVersion": "policy/v1",
                            "metadata": {"name": "gpu-p", "namespace": NS, "uid": "pdb-uid"},
                            "spec": {"maxUnavailable": 0,
                                     "selector": {"matchLabels": {"gq-check": "pdb"}}},
                            "status": PDB_STATUS})  # fmt: skip
        api.admit(policies, {"username": "system:serviceaccount:gpuquota:gpuquota-remediate"})
        yield api


def ask(api: ApiServer, path: str, body: dict[str, Any], query: str) -> tuple[int, Any]:
    name, sub = path.split("/")
    if sub == "eviction":
        sent: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction",
                                "metadata": {"name": name, "namespace": NS}}  # fmt: skip
        if body:
            sent["deleteOptions"] = body
        method, ctype = "POST", "application/json"
    else:
        sent = {"metadata": body, "status": {"conditions": [
            {"type": "GPUUnhealthy", "status": "True", "reason": "GPUNeedsReboot", "message": "probe"}]}}  # fmt: skip
        method, ctype = "PATCH", "application/strategic-merge-patch+json"
    request = urllib.request.Request(
        f"{api.url}/api/v1/namespaces/{NS}/pods/{path}?{query}", data=json.dumps(sent).encode(),
        method=method, headers={"Content-Type": ctype},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


@needs_kubectl
@pytest.mark.parametrize(("what", "path", "body", "query", "code", "real"), REAL, ids=[r[0] for r in REAL])  # fmt: skip
def test_the_stand_in_answers_as_the_real_server_did(
    server: ApiServer, what: str, path: str, body: dict[str, Any], query: str, code: int,
    real: dict[str, Any] | None,
) -> None:  # fmt: skip
    before = {name: server.get("pods", name, NS) for name in UID}
    got = ask(server, path, body, query)
    assert got[0] == code, (what, got)
    if real is not None:
        assert got[1] == real, what
    else:  # the patched pod, not stored (the real server's body is the whole pod)
        assert got[1]["kind"] == "Pod"
        assert "GPUUnhealthy" in {c["type"] for c in got[1]["status"]["conditions"]}
    assert {name: server.get("pods", name, NS) for name in UID} == before  # a dry run
