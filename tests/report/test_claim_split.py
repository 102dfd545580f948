"""A shared DRA claim's time grouped by pod-level keys: the report's split (computed in SQL from
the stored pod intervals) against a second-by-second count, for random pods sharing claims,
open and estimated ones included, clipped to a window, on SQLite and PostgreSQL."""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import UTC
from fractions import Fraction

import pytest
from sqlalchemy import insert

from gpuquota.quota.accounting.rules.claims import PodSpan, charged_pieces
from gpuquota.quota.report import build, compute, period
from gpuquota.quota.store.models import ClaimAllocation
from tests.report.conftest import H100, Store

T0 = 1_790_000_000
NOW = T0 + 2000


def put_claim(
    store: Store,
    claim: str,
    pods: dict[str, tuple[int, int | None]],
    *,
    units: int = 1,
    share: Fraction = Fraction(1),
    extended: bool = False,
    estimated: frozenset[str] = frozenset(),
) -> None:
    """Rows as the claim tracker writes them: each pod's interval and its charged piece."""
    pieces = charged_pieces([PodSpan(uid, s, e) for uid, (s, e) in pods.items()])
    with store.engine.begin() as conn:
        for uid, (start, end) in pods.items():
            lo, hi = (start, start) if extended else pieces[uid]
            conn.execute(
                insert(ClaimAllocation).values(
                    cluster="c1",
                    claim_uid=f"uid-{claim}",
                    pod_uid=uid,
                    resource_name="gpu.nvidia.com",
                    namespace="dra",
                    claim_name=claim,
                    pod_name=uid,
                    owner_kind="Job",
                    owner_name=uid,
                    node="n1",
                    node_pool="pool-a",
                    gpu_model=H100,
                    raw_units=units,
                    physical_gpus=float(units * share),
                    share_numerator=share.numerator,
                    share_denominator=share.denominator,
                    share_estimated=False,
                    pod_started_at=start,
                    pod_ended_at=end,
                    started_at=lo,
                    ended_at=hi,
                    end_reason="vanished" if uid in estimated else None,
                    estimated=uid in estimated,
                    updated_at=start,
                )
            )


def by_second(
    claims: dict[str, tuple[dict[str, tuple[int, int | None]], int, Fraction]],
    lo: int,
    hi: int,
) -> tuple[dict[str, Fraction], dict[str, Fraction], int, int]:
    """Per pod: raw and physical seconds, counting each second of [lo, hi) among the pods
    holding the claim then; the claims' whole raw seconds (the union, once); and the most
    pods that held one claim at once."""
    raw: dict[str, Fraction] = defaultdict(Fraction)
    phys: dict[str, Fraction] = defaultdict(Fraction)
    union = 0
    most = 0
    for pods, units, share in claims.values():
        for second in range(lo, hi):
            holding = [
                uid for uid, (s, e) in pods.items() if s <= second < (NOW if e is None else e)
            ]
            most = max(most, len(holding))
            if holding:
                union += units
            for uid in holding:
                raw[uid] += Fraction(units, len(holding))
                phys[uid] += units * share / len(holding)
    return dict(raw), dict(phys), union, most


def report(
    store: Store, lo: int, hi: int, *keys: str
) -> dict[tuple[str | None, ...], compute.Group]:
    request = build.ReportRequest(period.Period(lo, hi, UTC), NOW, keys)
    with store.engine.connect() as conn:
        return {g.keys: g for g in build.build_report(conn, request).groups}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_split_by_pod_matches_a_second_by_second_count(store: Store, seed: int) -> None:
    rng = random.Random(seed)
    claims: dict[str, tuple[dict[str, tuple[int, int | None]], int, Fraction]] = {}
    for c in range(4):
        pods: dict[str, tuple[int, int | None]] = {}
        for p in range(rng.randint(1, 4)):
            start = T0 + rng.randrange(0, 1500)
            end = None if rng.random() < 0.25 else start + rng.randrange(0, 700)
            pods[f"c{c}-pod-{p}"] = (start, end)
        units, share = rng.choice([(1, Fraction(1)), (2, Fraction(1)), (1, Fraction(3, 7))])
        estimated = frozenset(u for u in pods if pods[u][1] is not None and rng.random() < 0.2)
        put_claim(store, f"claim-{c}", pods, units=units, share=share, estimated=estimated)
        claims[f"claim-{c}"] = (pods, units, share)
    # three pods at once, one still running: thirds, halves, then whole seconds
    trio: dict[str, tuple[int, int | None]] = {
        "trio-pod-0": (T0 + 100, T0 + 900),
        "trio-pod-1": (T0 + 400, None),
        "trio-pod-2": (T0 + 500, T0 + 777),
    }
    put_claim(store, "trio", trio, share=Fraction(1, 7))
    claims["trio"] = (trio, 1, Fraction(1, 7))
    # a claim made for an extended resource: charged through the pod, never here
    put_claim(store, "ext", {"ext-pod-0": (T0, T0 + 500), "ext-pod-1": (T0, None)}, extended=True)

    for lo, hi in ((T0, NOW), (T0 + 311, T0 + 1207)):
        raw, phys, union, most = by_second(claims, lo, hi)
        assert most >= 3  # claims really shared, by more than two pods at once
        by_pod = report(store, lo, hi, "pod")
        shown = {k[0]: g for k, g in by_pod.items() if g.raw_seconds}
        assert {p.split("/", 1)[1] for p in shown} == {u for u, r in raw.items() if r}
        for pod, g in shown.items():
            uid = pod.split("/", 1)[1]
            assert (g.raw_seconds, g.physical_seconds) == (raw[uid], phys[uid]), (lo, hi, uid)
        # by owner (one Job per pod here) and beside a claim-level key: the same shares
        by_owner = report(store, lo, hi, "owner", "namespace")
        for (owner, ns), g in by_owner.items():
            assert ns == "dra"
            assert g.raw_seconds == raw.get(str(owner).split("/", 2)[2], 0)
        # the split adds up to the claims' union, which is what the namespace gets
        (ns_group,) = report(store, lo, hi, "namespace").values()
        assert ns_group.raw_seconds == union == sum(raw.values())
        assert ns_group.physical_seconds == sum(phys.values())
