"""The API server stand-in's resource.k8s.io kinds, through the official kubernetes client."""

from __future__ import annotations

import json
import tempfile
import threading
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from gpuquota.sim.apiserver import ApiServer
from gpuquota.sim.nvml import spec
from gpuquota.sim.nvml.resourceslices import DRIVER, device_uuids, resource_slices
from tests.sim_cluster.watching import watch_lines


def _client(api: ApiServer) -> client.ApiClient:
    path = Path(tempfile.mkdtemp(dir="/tmp")) / "kubeconfig"
    api.write_kubeconfig(path)
    return config.new_client_from_config(str(path))


def _raw(kube: client.ApiClient, path: str, **query: str) -> dict:
    resp = kube.call_api(
        *kube.param_serialize("GET", path, query_params=list(query.items()))
    ).response
    return json.loads(resp.data)


def test_slices_are_listed_and_watched_by_node(apiserver: ApiServer, kube) -> None:
    for node in ("node-a", "node-b"):
        for obj in resource_slices(spec.load("mixed"), node):
            apiserver.apply("ADDED", obj)
    resource = client.ResourceV1Api(kube)
    listed = resource.list_resource_slice(field_selector="spec.nodeName=node-a")
    assert [s.spec.node_name for s in listed.items] == ["node-a"]
    assert listed.api_version == "resource.k8s.io/v1"
    names = {d.name for d in listed.items[0].spec.devices}
    assert names == set(device_uuids(spec.load("mixed")))
    assert len(resource.list_resource_slice(field_selector=f"spec.driver={DRIVER}").items) == 2
    assert resource.list_resource_slice(field_selector="spec.nodeName!=node-a").items[
        0
    ].spec.node_name == ("node-b")

    with pytest.raises(ApiException) as err:
        resource.list_resource_slice(field_selector="spec.devices=x")
    assert err.value.status == 400 and "field label not supported" in err.value.body

    # a watch from the list's version sees node-a's changes only
    rv = listed.metadata.resource_version
    resp = resource.list_resource_slice(
        field_selector="spec.nodeName=node-a",
        watch=True,
        resource_version=rv,
        timeout_seconds=2,
        _preload_content=False,
    )
    events: list[dict] = []
    reader = threading.Thread(target=lambda: events.extend(watch_lines(resp)))
    reader.start()
    a = apiserver.get("resourceslices", listed.items[0].metadata.name)
    assert a is not None
    apiserver.apply("DELETED", a)
    for obj in resource_slices(spec.load("mixed"), "node-b", generation=2):
        apiserver.apply("MODIFIED", obj)
    reader.join(5)
    assert [(e["type"], e["object"]["spec"]["nodeName"]) for e in events] == [("DELETED", "node-a")]


def test_claims_classes_and_label_selectors(apiserver: ApiServer, kube) -> None:
    resource = client.ResourceV1Api(kube)
    apiserver.apply(
        "ADDED",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "gpu.nvidia.com"},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]},
        },
    )
    for name, team in (("train", "a"), ("infer", "b")):
        apiserver.apply(
            "ADDED",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": "ml", "labels": {"team": team}},
                "spec": {"devices": {"requests": []}},
            },
        )
    assert [c.metadata.name for c in resource.list_device_class().items] == ["gpu.nvidia.com"]
    claims = resource.list_namespaced_resource_claim("ml", label_selector="team=a")
    assert [c.metadata.name for c in claims.items] == ["train"]
    assert [
        c.metadata.name
        for c in resource.list_resource_claim_for_all_namespaces(label_selector="team!=a").items
    ] == ["infer"]
    assert resource.list_namespaced_resource_claim("ml", label_selector="!team").items == []


def test_device_taint_rule_versions_and_discovery(tmp_path: Path) -> None:
    rule = {
        "apiVersion": "resource.k8s.io/v1alpha3",
        "kind": "DeviceTaintRule",
        "metadata": {"name": "r1"},
        "spec": {
            "deviceSelector": {"driver": DRIVER, "pool": "node-a", "device": "gpu-0"},
            "taint": {"key": "example.com/bad", "effect": "NoSchedule"},
        },
    }
    # a 1.35-like cluster: DRA at v1 and v1beta2, DeviceTaintRules only in v1alpha3
    with ApiServer(
        resource_versions=("v1", "v1beta2"), device_taint_rule_versions=("v1alpha3",)
    ) as api:
        kube = _client(api)
        group = _raw(kube, "/apis/resource.k8s.io")
        assert [v["version"] for v in group["versions"]] == ["v1", "v1beta2", "v1alpha3"]
        assert group["preferredVersion"]["version"] == "v1"
        v1 = _raw(kube, "/apis/resource.k8s.io/v1")
        assert "devicetaintrules" not in {r["name"] for r in v1["resources"]}
        assert "resourceslices" in {r["name"] for r in v1["resources"]}
        alpha = client.ResourceV1alpha3Api(kube)
        created = alpha.create_device_taint_rule(rule)
        assert created.api_version == "resource.k8s.io/v1alpha3"
        assert created.spec.device_selector.device == "gpu-0"
        assert created.spec.taint.time_added is not None  # set by the server, as for real
        with pytest.raises(ApiException) as err:
            client.ResourceV1Api(kube).list_device_taint_rule()
        assert err.value.status == 404
        alpha.delete_device_taint_rule("r1")
        assert api.count("devicetaintrules") == 0

    with pytest.raises(ValueError, match="v1beta1"):
        ApiServer(resource_versions=("v1beta1",))


def test_forbidden_resource_answers_403(apiserver: ApiServer, kube) -> None:
    apiserver.forbid("resourceslices")
    with pytest.raises(ApiException) as err:
        client.ResourceV1Api(kube).list_resource_slice()
    assert err.value.status == 403
    message = json.loads(err.value.body)["message"]
    assert 'cannot list resource "resourceslices" in API group "resource.k8s.io"' in message
    apiserver.forbid("resourceslices", False)
    assert client.ResourceV1Api(kube).list_resource_slice().items == []


def test_resourceslices_cli_prints_the_slices(capsys) -> None:
    from gpuquota.sim.nvml.resourceslices import main

    assert main(["mixed", "node-a"]) == 0
    assert json.loads(capsys.readouterr().out) == resource_slices(spec.load("mixed"), "node-a")
    assert main(["no-such-preset", "node-a"]) == 2
    assert "unknown preset 'no-such-preset'" in capsys.readouterr().err
