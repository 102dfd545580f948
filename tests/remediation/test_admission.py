"""The remediation component's admission policies, decided by the API server stand-in with the
real server's CEL semantics: gpuquota-remediate may set the pod condition GPUUnhealthy and
nothing else of a pod's status, and may evict only with the pod's UID as a precondition."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuquota.kube.client import ApiStatusError, Kube
from gpuquota.kube.rest import load
from gpuquota.sim.apiserver import ApiServer
from tests.deploy.manifests import built, needs_kubectl

SMP = "application/strategic-merge-patch+json"
STATUS = "/api/v1/namespaces/ml/pods/p/status"
EVICT = "/api/v1/namespaces/ml/pods/p/eviction"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[ApiServer, Kube]]:
    docs = built("components/remediation")
    policies = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    with ApiServer() as server:
        server.apply("ADDED", {"kind": "Pod", "apiVersion": "v1",
                               "metadata": {"name": "p", "namespace": "ml", "uid": "uid-p",
                                            "labels": {"app": "x"}},
                               "spec": {"nodeName": "n", "containers": [{"name": "main"}]},
                               "status": {"phase": "Running", "podIP": "10.0.0.1",
                                          "conditions": [{"type": "Ready", "status": "True"}]}})  # fmt: skip
        server.admit(policies, {"username": "system:serviceaccount:gpuquota:gpuquota-remediate"})
        yield server, Kube(load(str(server.write_kubeconfig(tmp_path / "kubeconfig"))))


def status(**fields: Any) -> dict[str, Any]:
    return {"status": fields}


OURS = {"type": "GPUUnhealthy", "status": "True", "reason": "GPUNeedsReboot", "message": "m"}


@needs_kubectl
def test_only_our_condition_may_change(api: tuple[ApiServer, Kube]) -> None:
    server, kube = api
    kube.call("PATCH", STATUS, body=status(conditions=[OURS]), content_type=SMP)
    refused = [
        status(conditions=[{"type": "Ready", "status": "False"}]),
        status(phase="Failed"),
        status(podIP="10.9.9.9"),
        {"metadata": {"labels": {"app": "y"}}},
    ]
    for body in refused:
        with pytest.raises(ApiStatusError) as raised:
            kube.call("PATCH", STATUS, body=body, content_type=SMP)
        assert raised.value.status == 403, body
        assert "gpuquota-remediate may set only the pod condition GPUUnhealthy" in str(raised.value)
    pod = server.get("pods", "p", "ml") or {}
    assert pod["status"]["phase"] == "Running" and pod["metadata"]["labels"] == {"app": "x"}


@needs_kubectl
def test_an_eviction_without_the_pods_uid_is_refused(api: tuple[ApiServer, Kube]) -> None:
    server, kube = api
    bare = {"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": "p", "namespace": "ml"}}  # fmt: skip
    with pytest.raises(ApiStatusError) as raised:
        kube.call("POST", EVICT, body=bare)
    assert raised.value.status == 403 and "preconditions.uid" in str(raised.value)
    with pytest.raises(ApiStatusError) as raised:  # another pod object's UID: the server's 409
        kube.call("POST", EVICT, body={**bare, "deleteOptions": {"preconditions": {"uid": "x"}}})
    assert raised.value.status == 409
    assert server.get("pods", "p", "ml") is not None
    kube.call("POST", EVICT, body={**bare, "deleteOptions": {"preconditions": {"uid": "uid-p"}}})
    assert server.get("pods", "p", "ml") is None


def test_the_stand_in_checks_events_and_a_uid_in_a_patch_as_the_real_server(
    tmp_path: Path,
) -> None:
    with ApiServer() as server:
        kube = Kube(load(str(server.write_kubeconfig(tmp_path / "kubeconfig"))))
        server.apply("ADDED", {"kind": "Pod", "apiVersion": "v1",
                               "metadata": {"name": "p", "namespace": "ml", "uid": "uid-p"},
                               "spec": {}, "status": {"phase": "Running"}})  # fmt: skip
        event = {"apiVersion": "events.k8s.io/v1", "kind": "Event",
                 "metadata": {"name": "p.1", "namespace": "ml"},
                 "eventTime": "2026-11-29T00:00:00.000000Z", "reportingController": "x/y",
                 "reportingInstance": "i", "action": "Evict", "reason": "GPUEvicted",
                 "regarding": {"kind": "Pod", "name": "p", "namespace": "ml"}, "type": "Warning"}  # fmt: skip
        path = "/apis/events.k8s.io/v1/namespaces/ml/events"
        for missing in ("eventTime", "reportingController", "action"):
            with pytest.raises(ApiStatusError) as raised:
                kube.call("POST", path, body={k: v for k, v in event.items() if k != missing})
            assert raised.value.status == 422 and missing in str(raised.value)
        kube.call("POST", path, body=event)
        assert server.count("events") == 1
        with pytest.raises(ApiStatusError) as raised:  # another pod object's UID
            kube.call("PATCH", STATUS, body={"metadata": {"uid": "uid-old"}}, content_type=SMP)
        assert raised.value.status == 422
