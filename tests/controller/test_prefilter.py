"""The raw pre-filter: pods the accounting ignores are not decoded, and no pod it reads is
ever dropped, whatever its shape (property tests over pods with GPUs in requests, limits,
init containers, sidecars, overhead, DRA claims and extended-resource claim status), whether
the server dresses it or not, and whatever its labels and annotations hold."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuquota.kube.client import (
    Kube,
    filtered_page,
    load,
    stub_event,
    without_managed_fields,
)
from gpuquota.quota import accounting as acc
from gpuquota.quota.accounting.rules.claims import names_claims
from gpuquota.quota.accounting.rules.pods import raw_prefilter
from gpuquota.sim.apiserver import ApiServer
from gpuquota.sim.realism import dress

GPUS = ["nvidia.com/gpu", "nvidia.com/gpu.shared", "amd.com/gpu", "nvidia.com/mig-1g.10gb"]
OTHERS = ["cpu", "memory", "example.com/fpga", "hugepages-2Mi"]
PREFILTER = raw_prefilter()
assert PREFILTER is not None

# text that looks like JSON structure, resource names and the item separator
tricky = st.text(
    alphabet='{}[],:"\\abn/.-',
    max_size=30,
)
quantities = st.sampled_from(["1", "2", "500m", "4Gi", "0"])


@st.composite
def pods(draw: st.DrawFn) -> tuple[dict[str, Any], bool]:
    """A pod and whether it asks for a GPU or a claim (by construction, not by the rules)."""
    where = draw(
        st.sampled_from(
            [
                "none",
                "requests",
                "limits",
                "init",
                "sidecar",
                "overhead",
                "claims",
                "extended",
            ]
        )
    )
    gpu = draw(st.sampled_from(GPUS))
    n = str(draw(st.integers(1, 8)))

    def resources(with_gpu: str | None) -> dict[str, Any]:
        other = draw(st.dictionaries(st.sampled_from(OTHERS), quantities, max_size=2))
        out: dict[str, Any] = {}
        if other:
            out["requests"] = dict(other)
        if with_gpu == "requests":
            out.setdefault("requests", {})[gpu] = n
            out.setdefault("limits", {})[gpu] = n
        elif with_gpu == "limits":
            out.setdefault("limits", {})[gpu] = n
        return out

    containers = [
        {"name": f"c{i}", "image": "img:1", "resources": resources(None)}
        for i in range(draw(st.integers(0, 2)))
    ]
    main = {"name": "main", "image": "img:1"}
    main["resources"] = resources(where if where in ("requests", "limits") else None)
    containers.insert(draw(st.integers(0, len(containers))), main)
    spec: dict[str, Any] = {"containers": containers}
    if where in ("init", "sidecar"):
        init = {"name": "init", "image": "img:1", "resources": resources("requests")}
        if where == "sidecar":
            init["restartPolicy"] = "Always"
        spec["initContainers"] = [init]
    if where == "overhead":
        spec["overhead"] = {gpu: n, "cpu": "250m"}
    status: dict[str, Any] = {"phase": draw(st.sampled_from(["Pending", "Running", "Succeeded"]))}
    if where == "claims":
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
        status["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": "p-gpu-x1"}]
    if where == "extended":
        # an extended resource the config does not name, backed by a DRA DeviceClass
        main["resources"] = {"requests": {"example.com/gpu": n}, "limits": {"example.com/gpu": n}}
        status["extendedResourceClaimStatus"] = {"resourceClaimName": "p-extended-resources-x"}
    if draw(st.booleans()):
        spec["nodeName"] = "node-1"
    i = draw(st.integers(0, 10**6))
    meta: dict[str, Any] = {
        "name": f"p-{i}",
        "namespace": draw(st.sampled_from(["a", "team-b"])),
        "uid": f"uid-{i}-{where}",
        "resourceVersion": str(draw(st.integers(1, 10**9))),
        "creationTimestamp": "2026-01-01T00:00:00Z",
        "labels": draw(st.dictionaries(tricky, tricky, max_size=2)),
        "annotations": draw(st.dictionaries(tricky, tricky, max_size=2)),
    }
    pod = {"kind": "Pod", "apiVersion": "v1", "metadata": meta, "spec": spec, "status": status}
    if draw(st.booleans()):
        rv = meta["resourceVersion"]
        pod = dress(pod)
        pod["metadata"]["resourceVersion"] = rv
    return pod, where != "none"


def encode(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def item(pod: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in pod.items() if k not in ("kind", "apiVersion")}


def unmanaged(obj: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in obj["metadata"].items() if k != "managedFields"}
    return {**obj, "metadata": meta}


def test_the_rule_names_every_gpu_resource_and_refuses_escapable_names() -> None:
    assert PREFILTER(b'{"requests":{"nvidia.com/mig-3g.40gb":"1"}}')
    assert not PREFILTER(b'{"requests":{"cpu":"1"}}')
    odd = acc.AccountingConfig(gpu_resources=("example.com/<gpu>",))
    assert raw_prefilter(odd) is None


@given(pods())
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
def test_prefilter_never_drops_a_pod_with_gpus_or_claims(case: tuple[dict[str, Any], bool]) -> None:
    pod, has_gpu = case
    kept = bool(acc.effective_units(pod)) or names_claims(pod)
    assert kept == (has_gpu and "extendedResourceClaimStatus" not in pod["status"])
    if has_gpu:
        assert PREFILTER(encode(pod))
        assert PREFILTER(json.dumps(pod).encode())  # whitespace changes nothing
        assert PREFILTER(encode(item(pod)))
    if not PREFILTER(encode(pod)):
        assert not kept


@given(st.lists(pods(), max_size=12))
@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
def test_a_filtered_list_page_keeps_exactly_the_wanted_items(
    cases: list[tuple[dict[str, Any], bool]],
) -> None:
    items = [item(pod) for pod, _ in cases]
    data = encode(
        {
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": "7", "continue": "abc"},
            "items": items,
        }
    )
    page = filtered_page(data + b"\n", PREFILTER)  # as the real server ends it
    if page is None:
        # only where an item is not in the real server's encoding (name first in metadata)
        assert any(next(iter(i["metadata"])) != "name" for i in items)
        return
    assert page["metadata"] == {"resourceVersion": "7", "continue": "abc"}
    # as the client reads them: slim() drops managedFields that were not cut before decoding
    got = [unmanaged(i) for i in page["items"]]
    assert got == [unmanaged(i) for i in items if PREFILTER(encode(i))]
    for (_, has_gpu), i in zip(cases, items, strict=True):
        if has_gpu:
            assert unmanaged(i) in got


@given(pods(), st.sampled_from(["ADDED", "MODIFIED", "DELETED"]))
@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
def test_managed_fields_are_cut_before_decoding_and_nothing_else(
    case: tuple[dict[str, Any], bool], etype: str
) -> None:
    pod, _ = case
    fields = encode(pod["metadata"].get("managedFields"))
    for raw, whole in (
        (encode({"type": etype, "object": pod}), {"type": etype, "object": unmanaged(pod)}),
        (encode(item(pod)), unmanaged(item(pod))),
    ):
        cut = without_managed_fields(raw)
        if cut == raw:
            # left whole only when it cannot tell where they end (a "]" in a field name)
            assert "managedFields" not in pod["metadata"] or b"]" in fields[1:-1]
        else:
            assert json.loads(cut) == whole


@given(pods(), st.sampled_from(["ADDED", "MODIFIED", "DELETED"]))
@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
def test_a_watch_event_left_undecoded_keeps_its_metadata(
    case: tuple[dict[str, Any], bool], etype: str
) -> None:
    pod, _ = case
    line = encode({"type": etype, "object": pod})
    stub = stub_event(line)
    if stub is None:
        return  # not the real server's encoding: the client decodes it whole
    meta = pod["metadata"]
    assert stub == {
        "type": etype,
        "object": {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion")},
        },
    }
    # what the watch loop's filter makes of a stub: a pod without GPUs
    assert not acc.effective_units(stub["object"]) and not names_claims(stub["object"])


def cluster_pod(n: int) -> dict[str, Any]:
    """Every third pod asks for a GPU (its place in the spec varies), the rest do not."""
    res: dict[str, Any] = {"requests": {"cpu": "1"}}
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "img:1", "resources": res}]}
    if n % 3 == 0:
        where = ("requests", "limits", "sidecar", "overhead", "claims")[n // 3 % 5]
        if where == "requests":
            res["requests"]["nvidia.com/gpu"] = "1"
        elif where == "limits":
            res["limits"] = {"nvidia.com/gpu": "2"}
        elif where == "sidecar":
            spec["initContainers"] = [
                {
                    "name": "s",
                    "restartPolicy": "Always",
                    "resources": {"limits": {"amd.com/gpu": "1"}},
                }
            ]
        elif where == "overhead":
            spec["overhead"] = {"nvidia.com/gpu": "1"}
        else:
            spec["resourceClaims"] = [{"name": "g", "resourceClaimName": f"claim-{n}"}]
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": f"p-{n}", "namespace": "a", "uid": f"uid-{n}"},
        "spec": {**spec, "nodeName": "node-1"},
        "status": {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"},
    }


def test_list_and_watch_through_the_stand_in_keep_every_gpu_pod(tmp_path: Path) -> None:
    """The client against the stand-in (real-size pods): every pod that may have GPUs is
    decoded, whole and equal to what an unfiltered client reads; the others are not decoded,
    and their watch events still carry the metadata the watch needs."""
    gpu_pods = {f"p-{n}" for n in range(0, 60, 3)}
    with ApiServer() as api:
        for n in range(60):
            api.apply("ADDED", cluster_pod(n))
        kubeconfig = str(api.write_kubeconfig(tmp_path / "kubeconfig"))
        plain = Kube(load(kubeconfig), page_size=7)
        filtered = Kube(load(kubeconfig), page_size=7, raw_filters={"Pod": PREFILTER})
        everything, version = plain.list("Pod")
        some, _ = filtered.list("Pod")
        by_name = {p["metadata"]["name"]: p for p in everything}
        assert len(everything) == 60
        assert {p["metadata"]["name"] for p in some} == gpu_pods
        assert all(p == by_name[p["metadata"]["name"]] for p in some)
        for n in range(60):
            api.apply("DELETED", by_name[f"p-{n}"])
        events = []
        for event in filtered.watch("Pod", version):
            if event["type"] == "DELETED":
                events.append(event)
            if len(events) == 60:
                break
    assert [e["object"]["metadata"]["uid"] for e in events] == [f"uid-{n}" for n in range(60)]
    assert {e["object"]["metadata"]["name"] for e in events if "spec" in e["object"]} == gpu_pods
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(versions) and versions[0] > int(version)
