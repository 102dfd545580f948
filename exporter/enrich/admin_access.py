"""Which devices of a DRA ResourceClaim's allocation are ``adminAccess``: the pure rule.

A DRA claim with ``adminAccess: true`` on a request (what monitoring agents such as
dcgm-exporter ask for) reaches devices other pods already hold; the kubelet's pod-resources
answer lists it like any other claim. Attributing it would make the monitoring pod a holder
of every GPU, so the DRA join (exporter/enrich/dra.py) leaves out the results this rule marks.
The claims are read from the API server by exporter/enrich/claimreader.py, in a thread; this
module only reads a claim object already in hand (no I/O, no threads, no logging).
"""

from __future__ import annotations

from typing import Any

Device = tuple[str, str, str]  # (driver, pool, device)
ClaimKey = tuple[str, str]  # (namespace, name)


def admin_devices(claim: dict[str, Any]) -> frozenset[Device]:
    """The devices of a ResourceClaim's allocation marked ``adminAccess``."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return frozenset(
        (str(r.get("driver")), str(r.get("pool")), str(r.get("device")))
        for r in results
        if isinstance(r, dict) and r.get("adminAccess") is True
    )


def reserved_pods(claim: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """The pods a ResourceClaim is reserved for, as (name, UID): ``status.reservedFor`` names
    every consumer (the pods of the claim's namespace) by name and UID."""
    reserved = (claim.get("status") or {}).get("reservedFor") or []
    return tuple(
        (str(r.get("name") or ""), str(r.get("uid") or ""))
        for r in reserved
        if isinstance(r, dict) and r.get("resource") == "pods" and not r.get("apiGroup")
    )


def claim_path(version: str, namespace: str, name: str) -> str:
    """The API path of one namespaced ResourceClaim (resource.k8s.io `version`)."""
    return f"/apis/resource.k8s.io/{version}/namespaces/{namespace}/resourceclaims/{name}"
