"""The store's SQL merge of interval ends is the Python rule ``end_wins``: a property test over
every combination of stored and new end (open, measured, estimated; equal seconds with every
reason), on SQLite and PostgreSQL."""

from __future__ import annotations

import itertools
import uuid
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuquota.quota import accounting as acc
from gpuquota.quota.accounting.rows import AllocationRow, Batch
from gpuquota.quota.store.db import Store
from tests.store import rows

REASONS = [*acc.END_REASON_PRECEDENCE, acc.END_VANISHED]


@st.composite
def ends(draw: st.DrawFn) -> acc.StoredEnd:
    if draw(st.booleans()) and draw(st.booleans()):
        return acc.StoredEnd(None, None, False)
    estimated = draw(st.booleans())
    reason = acc.END_VANISHED if estimated else draw(st.sampled_from(REASONS[:-1]))
    # a few seconds only, so equal ends (where the reason decides) are common
    return acc.StoredEnd(draw(st.integers(100, 103)), reason, estimated)


def allocation(uid: str, end: acc.StoredEnd) -> AllocationRow:
    return AllocationRow(
        pod_uid=uid,
        resource_name="nvidia.com/gpu",
        namespace="ns",
        pod_name="p",
        owner_kind=None,
        owner_name=None,
        node="n",
        node_pool=None,
        gpu_model="H100",
        raw_units=1,
        physical_gpus=1.0,
        replicas=None,
        sharing_strategy=None,
        mig_profile=None,
        started_at=50,
        ended_at=end.ended_at,
        end_reason=end.reason,
        estimated=end.estimated,
        qos_class=None,
        updated_at=60,
        share_numerator=1,
        share_denominator=1,
    )


def merged(store: Store, cluster: str, stored: acc.StoredEnd, new: acc.StoredEnd) -> acc.StoredEnd:
    uid = uuid.uuid4().hex
    store.write(cluster, Batch(allocations=[allocation(uid, stored)]))
    store.write(cluster, Batch(allocations=[replace(allocation(uid, new), updated_at=70)]))
    row = rows.allocations(store, cluster)[(uid, "nvidia.com/gpu")]
    return acc.StoredEnd(row["ended_at"], row["end_reason"], bool(row["estimated"]))


def expected(stored: acc.StoredEnd, new: acc.StoredEnd) -> acc.StoredEnd:
    return new if acc.end_wins(stored, new) else stored


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(stored=ends(), new=ends())
def test_sql_merge_is_the_python_rule(
    store: Store, cluster: str, stored: acc.StoredEnd, new: acc.StoredEnd
) -> None:
    assert merged(store, cluster, stored, new) == expected(stored, new)


def test_sql_merge_equals_the_rule_on_every_reason_pair_at_one_second(
    store: Store, cluster: str
) -> None:
    # the precedence itself, exhaustively: same second, every ordered pair of reasons
    for a, b in itertools.product(REASONS, repeat=2):
        stored = acc.StoredEnd(100, a, a == acc.END_VANISHED)
        new = acc.StoredEnd(100, b, b == acc.END_VANISHED)
        assert merged(store, cluster, stored, new) == expected(stored, new), (a, b)


def test_the_rule_agrees_with_billing_end_on_the_reason_at_one_second() -> None:
    # billing_end picks the reason the precedence lists first; end_wins keeps that one too
    for a, b in itertools.permutations(acc.END_REASON_PRECEDENCE, 2):
        first = acc.END_REASON_PRECEDENCE[min(acc.reason_rank(a), acc.reason_rank(b))]
        evidence = acc.EndEvidence(**{_field(a): 100, _field(b): 100})
        end = acc.billing_end(0, evidence)
        assert end is not None and end.reason == first
        kept = (
            a if not acc.end_wins(acc.StoredEnd(100, a, False), acc.StoredEnd(100, b, False)) else b
        )
        assert kept == first


def _field(reason: str) -> str:
    return {
        acc.END_TERMINATED: "terminated_at",
        acc.END_DELETION_TIMESTAMP: "deletion_at",
        acc.END_DELETED: "deleted_at",
        acc.END_NODE_DELETED: "node_deleted_at",
    }[reason]
