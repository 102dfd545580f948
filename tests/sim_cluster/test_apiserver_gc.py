"""The stand-in's garbage collectors act on ownerReferences as the real ones do, which is why the
node admission policy must refuse a made-up ownerReference on the exporter's own Node
(issue 17, finding 4; tests/deploy/test_admission_policies.py shows the policy refusing it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuquota.kube.client import ApiStatusError, Kube, load
from gpuquota.sim.apiserver import ApiServer
from gpuquota.sim.harness import poll
from gpuquota.sim.nvml import spec
from gpuquota.sim.nvml.resourceslices import resource_slices
from tests.deploy.manifests import DEPLOY


def _node(name: str, uid: str) -> dict[str, Any]:
    return {"kind": "Node", "apiVersion": "v1", "metadata": {"name": name, "uid": uid},
            "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}  # fmt: skip


def _pod(name: str, node: str, owner: dict[str, Any] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ml", "uid": f"uid-{name}"}
    if owner:
        meta["ownerReferences"] = [owner]
    return {"kind": "Pod", "apiVersion": "v1", "metadata": meta,
            "spec": {"nodeName": node, "containers": [{"name": "main"}]}, "status": {"phase": "Running"}}  # fmt: skip


def test_a_made_up_owner_reference_on_a_node_deletes_the_node_and_its_pods(tmp_path: Path) -> None:
    """Without the admission policy, one merge patch by the node agent's identity loses the
    Node, its 5 pods (pod GC) and its ResourceSlices (owned by the Node), as seen on a real
    cluster; pods and objects whose owners exist, or are of kinds not served, are kept."""
    with ApiServer(garbage_collector=True) as api:
        slices = resource_slices(spec.load("mixed"), "node-a")  # owned by the Node, by uid
        api.apply("ADDED", _node("node-a", slices[0]["metadata"]["ownerReferences"][0]["uid"]))
        api.apply("ADDED", _node("node-b", "uid-node-b"))
        for i in range(5):
            api.apply("ADDED", _pod(f"train-{i}", "node-a"))
        job = {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "uid-job"}  # not served
        api.apply("ADDED", _pod("other", "node-b", owner=job))
        for obj in slices:
            api.apply("ADDED", obj)
        assert api.count("resourceslices") >= 1 and api.count("pods") == 6
        assert api.collect_garbage() == []  # a consistent cluster: nothing to collect

        kube = Kube(load(str(api.write_kubeconfig(tmp_path / "kubeconfig"))))
        made_up = {"apiVersion": "v1", "kind": "Node", "name": "ghost", "uid": "no-such-uid"}
        kube.call("PATCH", "/api/v1/nodes/node-a", body={"metadata": {"ownerReferences": [made_up]}},
                  content_type="application/merge-patch+json")  # fmt: skip
        assert poll(lambda: api.get("nodes", "node-a") is None)
        assert poll(lambda: api.count("pods") == 1 and api.count("resourceslices") == 0)
        assert api.get("nodes", "node-b") is not None and api.get("pods", "other", "ml") is not None


def test_with_the_node_policy_enforced_the_same_patch_is_refused_and_nothing_is_lost(
    tmp_path: Path,
) -> None:
    """The stand-in judges HTTP writes with deploy/'s policy, with the real server's CEL
    semantics (gpuquota.sim.admission): a 403 carrying the policy's own message."""
    docs = yaml.safe_load_all(
        (DEPLOY / "components/device-plugin/node-admission-policy.yaml").read_text()
    )
    policy = next(d for d in docs if d and d["kind"] == "ValidatingAdmissionPolicy")
    with ApiServer(garbage_collector=True) as api:
        api.apply("ADDED", _node("node-a", "uid-node-a"))
        api.apply("ADDED", _pod("train-0", "node-a"))
        api.admit([policy], {"username": "system:serviceaccount:gpuquota:gpu-exporter",
                             "extra": {"authentication.kubernetes.io/node-name": ["node-a"]}})  # fmt: skip
        kube = Kube(load(str(api.write_kubeconfig(tmp_path / "kubeconfig"))))
        made_up = {"apiVersion": "v1", "kind": "Node", "name": "ghost", "uid": "no-such-uid"}
        with pytest.raises(ApiStatusError) as refused:
            kube.call("PATCH", "/api/v1/nodes/node-a", body={"metadata": {"ownerReferences": [made_up]}},
                      content_type="application/merge-patch+json")  # fmt: skip
        assert refused.value.status == 403
        assert str(refused.value).endswith(
            "ValidatingAdmissionPolicy 'gpu-exporter-own-node' with binding 'gpu-exporter-own-node' "
            "denied request: on its Node, gpu-exporter may change only its taint and condition; "
            "metadata stays as it is"
        )
        assert api.collect_garbage() == []
        assert api.get("nodes", "node-a") is not None and api.count("pods") == 1
