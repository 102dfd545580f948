"""DRA claims through the Accountant against the workload generator's own record of which
claims held GPUs when (sim/workload.py, dra=True): an oracle written without quota/ code.
Every claim's charged time must match to the second, raw and physical, on both databases,
also across restarts of the Accountant."""

from __future__ import annotations

import random
from collections import defaultdict
from fractions import Fraction
from typing import Any

import pytest
from sqlalchemy import select

from gpuquota.quota.accounting.accountant import Accountant
from gpuquota.quota.store.db import Store
from gpuquota.quota.store.models import ClaimAllocation
from gpuquota.sim.workload import DRA_MODEL, DRA_NAMESPACE, GPU, Workload, generate


def claim_rows(store: Store, cluster: str) -> list[dict[str, Any]]:
    t = ClaimAllocation.__table__
    with store.engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(select(t).where(t.c.cluster == cluster))]


def charged(
    rows: list[dict[str, Any]], until: int
) -> dict[tuple[str, str, str], tuple[int, Fraction]]:
    """Per (namespace, claim, device class): raw device-seconds and physical GPU-seconds."""
    out: dict[tuple[str, str, str], list[Any]] = defaultdict(lambda: [0, Fraction(0)])
    for r in rows:
        end = until if r["ended_at"] is None else min(r["ended_at"], until)
        seconds = max(0, end - r["started_at"])
        if not seconds:
            continue
        key = (r["namespace"], r["claim_name"], r["resource_name"])
        out[key][0] += r["raw_units"] * seconds
        out[key][1] += Fraction(r["physical_gpus"]).limit_denominator(1000) * seconds
    return {k: (v[0], v[1]) for k, v in out.items()}


def truth(workload: Workload) -> dict[tuple[str, str, str], tuple[int, Fraction]]:
    out: dict[tuple[str, str, str], list[Any]] = defaultdict(lambda: [0, Fraction(0)])
    for iv in workload.truth.dra_intervals:
        key = (iv.namespace, iv.claim_name, iv.device_class)
        seconds = iv.seconds(workload.end)
        out[key][0] += iv.units * seconds
        out[key][1] += iv.physical * seconds
    return {k: (v[0], v[1]) for k, v in out.items()}


def replay(store: Store, cluster: str, workload: Workload, restart_every: int = 0) -> Accountant:
    """Feed the events; with ``restart_every``, restart the Accountant that often and give it
    what the controller lists on a resume (nodes, slices, classes: the facts of the moment)."""
    accountant = Accountant(store, cluster)
    current: dict[tuple[str, str], dict[str, Any]] = {}
    for i, event in enumerate(workload.events, start=1):
        accountant.apply(event.type, event.object, event.at)
        kind, name = event.object["kind"], event.object["metadata"]["name"]
        if kind in ("Node", "ResourceSlice", "DeviceClass"):
            if event.type == "DELETED":
                current.pop((kind, name), None)
            else:
                current[(kind, name)] = event.object
        if i % 97 == 0:
            accountant.heartbeat(event.at)
            accountant.flush()
        if restart_every and i % restart_every == 0:
            accountant.flush()
            accountant = Accountant(store, cluster)  # a restart: state from the store only
            for obj in current.values():
                accountant.apply("MODIFIED", obj, event.at)
    accountant.flush()
    return accountant


@pytest.mark.parametrize("seed", [3, 11])
def test_dra_claims_match_the_generator_truth(store: Store, cluster: str, seed: int) -> None:
    workload = generate(seed, 2.0, dra=True)
    accountant = replay(store, cluster, workload)
    rows = claim_rows(store, cluster)
    assert charged(rows, workload.end) == truth(workload)
    assert len(workload.truth.dra_intervals) >= 6
    # the model is the slice's productName, spelt as the node label spells it
    assert {r["gpu_model"] for r in rows if r["started_at"] != r["ended_at"]} == {DRA_MODEL}
    # adminAccess, another driver, the extended-resource claim: never charged
    names = {r["claim_name"] for r in rows if r["ended_at"] != r["started_at"]}
    assert "monitor-gpus" not in names and "fpga-0" not in names
    assert not any(n.startswith("ext-0-extended") for n in names)
    assert accountant.claims.problems["driver"] == 1
    # the extended-resource pod is charged once, as its nvidia.com/gpu request
    ext = [iv for iv in workload.truth.intervals if iv.pod_name == "ext-0"]
    assert [(iv.resource, iv.namespace) for iv in ext] == [(GPU, DRA_NAMESPACE)]


@pytest.mark.parametrize("restart_every", [40, 173])
def test_dra_claims_survive_restarts(store: Store, cluster: str, restart_every: int) -> None:
    workload = generate(5, 2.0, dra=True)
    replay(store, cluster, workload, restart_every)
    assert charged(claim_rows(store, cluster), workload.end) == truth(workload)


def test_replaying_twice_changes_nothing(store: Store, cluster: str) -> None:
    workload = generate(7, 1.0, dra=True)
    replay(store, cluster, workload)
    first = sorted(claim_rows(store, cluster), key=lambda r: r["id"])
    replay(store, cluster, workload)
    again = sorted(claim_rows(store, cluster), key=lambda r: r["id"])
    assert again == first


def test_a_stale_copy_never_reopens_a_closed_piece(store: Store, cluster: str) -> None:
    """Replaying a prefix of the stream again (an old recording, a resume from an old version)
    after the whole one: what the store closed stays closed."""
    workload = generate(13, 1.0, dra=True)
    replay(store, cluster, workload)
    final = charged(claim_rows(store, cluster), workload.end)
    prefix = Workload(
        workload.seed,
        workload.start,
        workload.end,
        workload.events[: len(workload.events) // 2],
        workload.truth,
    )
    replay(store, cluster, prefix)
    assert charged(claim_rows(store, cluster), workload.end) == final == truth(workload)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_kinds_interleaved_like_separate_watches(store: Store, cluster: str, seed: int) -> None:
    """Each kind arrives on its own watch: order holds within a kind, not across kinds (a
    claim can come before its slice, a pod before its claim). Every event is also delivered
    twice. The claims still match the truth to the second."""
    workload = generate(seed, 2.0, dra=True, observation_independent=True)
    rng = random.Random(seed)
    streams: dict[str, list[Any]] = defaultdict(list)
    for event in workload.events:
        streams[event.object["kind"]].append(event)
    accountant = Accountant(store, cluster)
    seen = 0
    while any(streams.values()):
        kind = rng.choice([k for k, s in streams.items() if s])
        for _ in range(rng.randint(1, 12)):
            if not streams[kind]:
                break
            event = streams[kind].pop(0)
            seen = max(seen, event.at)
            for _copy in range(2):
                accountant.apply(event.type, event.object, seen)
        if rng.random() < 0.05:
            accountant.flush()
    accountant.flush()
    assert charged(claim_rows(store, cluster), workload.end) == truth(workload)
