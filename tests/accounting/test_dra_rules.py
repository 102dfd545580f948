"""The DRA claim rules (quota/dra.py) and the claim tracker's handling of bad objects, without
I/O: hand-written objects in the API's JSON form."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from gpuquota.quota import accounting as acc
from gpuquota.quota.accounting.rules import claims as dra
from gpuquota.quota.accounting.trackers.claims import ClaimTracker

NS = "team"


def slice_obj(name: str, devices: list[tuple[str, str, str | None]], node: str = "n1") -> Any:
    """devices: (name, type, MIG profile or None)."""
    return {
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": d,
                    "attributes": {
                        "type": {"string": t},
                        "productName": {"string": "NVIDIA A100-SXM4-80GB"},
                        **({"profile": {"string": p}} if p else {}),
                    },
                    "capacity": {"memory": {"value": "80Gi"}},
                }
                for d, t, p in devices
            ],
        },
    }


def claim_obj(
    name: str,
    results: list[dict[str, Any]],
    *,
    uid: str | None = None,
    device_class: str = "gpu.nvidia.com",
    reserved: tuple[str, ...] = (),
    annotations: dict[str, str] | None = None,
) -> Any:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": NS,
        "uid": uid or f"uid-{name}",
        "creationTimestamp": "1970-01-01T00:00:00Z",
    }
    if annotations:
        meta["annotations"] = annotations
    return {
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", **r}
                        for r in results
                    ]
                }
            },
            "reservedFor": [{"resource": "pods", "name": u, "uid": u} for u in reserved],
        },
    }


def pod_obj(uid: str, claim: str, start: int | None = None, **status: Any) -> Any:
    return {
        "kind": "Pod",
        "metadata": {"name": uid, "namespace": NS, "uid": uid},
        "spec": {
            "nodeName": "n1",
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}],
        },
        "status": {
            "phase": "Running",
            **({"startTime": acc.format_time(start)} if start is not None else {}),
            **status,
        },
    }


# ------------------------------------------------------------------------------ pure rules


def test_charged_pieces_cut_the_union_into_disjoint_pieces() -> None:
    spans = [
        dra.PodSpan("a", 0, 100),
        dra.PodSpan("b", 50, 150),  # overlaps a
        dra.PodSpan("c", 60, 90),  # inside a and b: nothing of its own
        dra.PodSpan("d", 200, None),  # after a gap, still running
        dra.PodSpan("e", 210, 300),  # behind an open pod
    ]
    pieces = dra.charged_pieces(spans)
    assert pieces == {
        "a": (0, 100),
        "b": (100, 150),
        "c": (90, 90),
        "d": (200, None),
        "e": (300, 300),
    }
    # the pieces add up to the union [0, 150) + [200, open)
    closed = sum(e - s for s, e in pieces.values() if e is not None)
    assert closed == 150


def test_charged_pieces_do_not_depend_on_input_order() -> None:
    spans = [dra.PodSpan("x", 10, 20), dra.PodSpan("y", 10, 30), dra.PodSpan("z", 5, 12)]
    assert dra.charged_pieces(spans) == dra.charged_pieces(list(reversed(spans)))


def test_charges_whole_mig_shared_admin_and_foreign_driver() -> None:
    _, devices = dra.slice_devices(
        slice_obj(
            "s",
            [("gpu-0", "gpu", None), ("gpu-1", "gpu", None), ("gpu-2-mig-3g", "mig", "3g.40gb")],
        )
    )
    index = {d.key: d for d in devices}
    claim = dra.claim_facts(
        claim_obj(
            "c",
            [
                {"device": "gpu-0"},
                {"device": "gpu-1", "adminAccess": True},  # a monitor's: never charged
                {"device": "gpu-2-mig-3g"},
                {"device": "fpga-0", "driver": "fpga.example.com"},
            ],
        )
    )
    charges, problems = dra.charges(claim, index)
    assert [(c.device_class, c.units, c.gpu_model) for c in charges] == [
        ("gpu.nvidia.com", 2, "NVIDIA-A100-SXM4-80GB")
    ]
    assert charges[0].physical == pytest.approx(1 + 3 / 7)
    assert [p.reason for p in problems] == ["driver"]
    # a share of a device through consumable capacity: the consumed part of its memory
    shared = dra.claim_facts(
        claim_obj(
            "s",
            [{"device": "gpu-0", "shareID": "x", "consumedCapacity": {"memory": "20Gi"}}],
        )
    )
    (share,), _ = dra.charges(shared, index)
    assert (share.physical, share.estimated, share.sharing) == (0.25, False, "consumable-capacity")
    # a device the slices do not list: a whole GPU, reported
    unknown = dra.claim_facts(claim_obj("u", [{"device": "gpu-9"}]))
    (whole,), problems = dra.charges(unknown, index)
    assert (whole.units, whole.physical, whole.gpu_model) == (1, 1.0, None)
    assert [p.reason for p in problems] == ["device"]


def test_device_class_quota_keys() -> None:
    key = "gpu.nvidia.com.deviceclass.resource.k8s.io/devices"
    assert dra.device_class_quota(key) == "gpu.nvidia.com"
    assert dra.device_class_quota("requests." + key) == "gpu.nvidia.com"
    assert dra.device_class_quota("nic.example.com.deviceclass.resource.k8s.io/devices") is None
    assert acc.quota_gpu_resource(key)
    facts = acc.quota_facts(
        {
            "metadata": {"name": "q", "namespace": NS},
            "spec": {"hard": {key: "4", "requests.cpu": "8"}},
            "status": {"hard": {key: "4"}, "used": {key: "1"}},
        }
    )
    assert [(f.resource_name, f.hard, f.used) for f in facts.figures] == [(key, 4.0, 1.0)]


def test_malformed_claim_names_the_field() -> None:
    bad = claim_obj("c", [{"device": 7}])
    with pytest.raises(acc.AccountingError, match=r"results\[0\]\.device"):
        dra.claim_facts(bad)


# ------------------------------------------------------------------------- the tracker


def interval(tracker: ClaimTracker, uid: str, start: int, end: int | None) -> None:
    tracker.pod_interval(
        uid,
        uid,
        ("Job", uid),
        start,
        acc.BillingEnd(end, acc.END_TERMINATED, False) if end is not None else None,
        end or start,
    )


def test_shared_claim_is_charged_once_over_the_union() -> None:
    tracker = ClaimTracker()
    tracker.apply("ResourceSlice", slice_obj("s", [("gpu-0", "gpu", None)]), False, 0)
    tracker.apply("ResourceClaim", claim_obj("shared", [{"device": "gpu-0"}]), False, 0)
    for uid, start, end in (("a", 10, 100), ("b", 50, 200), ("c", 300, None)):
        assert tracker.pod_claims(pod_obj(uid, "shared", start))
        interval(tracker, uid, start, end)
    rows = tracker.pending_rows()
    assert sorted((r.pod_uid, r.started_at, r.ended_at) for r in rows) == [
        ("a", 10, 100),
        ("b", 100, 200),
        ("c", 300, None),
    ]
    assert {r.raw_units for r in rows} == {1}


def test_extended_resource_claim_is_not_charged_again() -> None:
    tracker = ClaimTracker()
    tracker.apply("ResourceSlice", slice_obj("s", [("gpu-0", "gpu", None)]), False, 0)
    tracker.apply("ResourceClaim", claim_obj("ext", [{"device": "gpu-0"}]), False, 0)
    pod = pod_obj("p", "other", 10, extendedResourceClaimStatus={"resourceClaimName": "ext"})
    pod["spec"].pop("resourceClaims")
    tracker.pod_claims(pod)
    tracker.apply(
        "ResourceClaim", claim_obj("ext", [{"device": "gpu-0"}], reserved=("p",)), False, 1
    )
    interval(tracker, "p", 10, 50)
    assert all(r.started_at == r.ended_at for r in tracker.pending_rows())


def test_unknown_device_is_logged_counted_and_filled_in_when_listed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tracker = ClaimTracker()
    tracker.apply("ResourceClaim", claim_obj("c", [{"device": "gpu-5"}]), False, 0)
    tracker.pod_claims(pod_obj("p", "c", 10))
    interval(tracker, "p", 10, None)
    with caplog.at_level(logging.WARNING):
        (row,) = tracker.pending_rows()
    assert "which no slice lists" in caplog.text and "team/c" in caplog.text
    assert tracker.problems["device"] == 1
    assert (row.physical_gpus, row.gpu_model) == (1.0, None)  # a whole GPU, model unknown
    tracker.written([row])
    tracker.apply("ResourceSlice", slice_obj("s", [("gpu-5", "mig", "1g.10gb")]), False, 20)
    (row,) = tracker.pending_rows()
    assert row.physical_gpus == pytest.approx(1 / 7)
    assert row.gpu_model == "NVIDIA-A100-SXM4-80GB"
    assert row.started_at == 10 and row.ended_at is None  # the interval is kept


def test_slice_that_disappears_keeps_the_recorded_facts(caplog: pytest.LogCaptureFixture) -> None:
    tracker = ClaimTracker()
    s = slice_obj("s", [("gpu-2-mig", "mig", "3g.40gb")])
    tracker.apply("ResourceSlice", s, False, 0)
    tracker.apply("ResourceClaim", claim_obj("c", [{"device": "gpu-2-mig"}]), False, 1)
    tracker.pod_claims(pod_obj("p", "c", 10))
    interval(tracker, "p", 10, None)
    tracker.written(tracker.pending_rows())
    with caplog.at_level(logging.WARNING):
        tracker.apply("ResourceSlice", s, True, 30)
    assert "ResourceSlice s disappeared" in caplog.text
    assert tracker.problems["slice_gone"] == 1
    interval(tracker, "p", 10, 90)  # the pod ends later: its interval is not lost
    (row,) = tracker.pending_rows()
    assert (row.started_at, row.ended_at) == (10, 90)
    assert row.physical_gpus == pytest.approx(3 / 7) and row.mig_profile == "3g.40gb"


def test_foreign_driver_claim_is_counted_not_charged(caplog: pytest.LogCaptureFixture) -> None:
    tracker = ClaimTracker()
    tracker.apply(
        "ResourceClaim",
        claim_obj("f", [{"device": "fpga-0", "driver": "fpga.example.com"}]),
        False,
        0,
    )
    tracker.pod_claims(pod_obj("p", "f", 10))
    interval(tracker, "p", 10, 20)
    with caplog.at_level(logging.INFO):
        assert tracker.pending_rows() == []
    assert tracker.problems["driver"] == 1
    assert "'fpga.example.com' is not a GPU driver" in caplog.text
