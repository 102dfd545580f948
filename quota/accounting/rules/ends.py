"""When a pod's GPUs stop being charged, and why: end evidence, its merge, the billing end, and
the one end-reason precedence (the store's SQL merge is derived from :func:`end_wins`)."""

from __future__ import annotations

from dataclasses import dataclass

from gpuquota.quota.accounting.rules.pods import PodFacts

# End reasons stored in Allocation.end_reason.
END_TERMINATED = "terminated"
END_DELETION_TIMESTAMP = "deletion_timestamp"
END_DELETED = "deleted"
END_NODE_DELETED = "node_deleted"
END_VANISHED = "vanished"
# Which measured reason names an end when several give the same second: the first listed.
# billing_end and the store's merge of a later observation both follow it, so the stored
# reason does not depend on the order events arrive in.
END_REASON_PRECEDENCE = (END_TERMINATED, END_DELETION_TIMESTAMP, END_DELETED, END_NODE_DELETED)


@dataclass(frozen=True)
class EndEvidence:
    """Everything observed so far that can end a pod's billing interval.

    Every field is the earliest such observation: merging evidence takes minimums, so the
    result does not depend on the order in which duplicated or reordered events arrive.
    """

    terminated_at: int | None = None  # terminal: latest container finishedAt, else observed
    deletion_at: int | None = None  # metadata.deletionTimestamp
    deleted_at: int | None = None  # the DELETED event
    node_deleted_at: int | None = None  # the pod's node was deleted
    vanished_at: int | None = None  # gone at a relist: last time it was known to exist

    def merge(self, other: EndEvidence) -> EndEvidence:
        return EndEvidence(
            terminated_at=_min(self.terminated_at, other.terminated_at),
            deletion_at=_min(self.deletion_at, other.deletion_at),
            deleted_at=_min(self.deleted_at, other.deleted_at),
            node_deleted_at=_min(self.node_deleted_at, other.node_deleted_at),
            vanished_at=_min(self.vanished_at, other.vanished_at),
        )


def _min(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def observed_evidence(facts: PodFacts, observed_at: int) -> EndEvidence:
    """The end evidence one copy of a pod carries, seen at ``observed_at``."""
    terminated_at: int | None = None
    if facts.terminal:
        terminated_at = facts.finished_at if facts.finished_at is not None else observed_at
    return EndEvidence(terminated_at=terminated_at, deletion_at=facts.deletion_at)


@dataclass(frozen=True)
class BillingEnd:
    at: int
    reason: str
    estimated: bool


def billing_end(started_at: int, evidence: EndEvidence) -> BillingEnd | None:
    """When the pod's GPUs stopped being charged, or None while they still are.

    The earliest of: terminal (latest container finishedAt, else when the phase change was
    observed), deletionTimestamp, the DELETED event, the node's deletion. A pod that vanished
    unobserved ends at the last time it was known to exist, marked estimated, unless a real
    observation gives an end. An end before the start is clamped to an empty interval.
    """
    observed = {
        END_TERMINATED: evidence.terminated_at,
        END_DELETION_TIMESTAMP: evidence.deletion_at,
        END_DELETED: evidence.deleted_at,
        END_NODE_DELETED: evidence.node_deleted_at,
    }
    candidates = [
        (at, rank, reason)
        for rank, reason in enumerate(END_REASON_PRECEDENCE)
        if (at := observed[reason]) is not None
    ]
    if candidates:
        at, _, reason = min(candidates)
        return BillingEnd(at=max(at, started_at), reason=reason, estimated=False)
    if evidence.vanished_at is not None:
        return BillingEnd(
            at=max(evidence.vanished_at, started_at), reason=END_VANISHED, estimated=True
        )
    return None


@dataclass(frozen=True)
class StoredEnd:
    """The end columns of one stored allocation row (ended_at None: still open)."""

    ended_at: int | None
    reason: str | None
    estimated: bool


def reason_rank(reason: str | None) -> int:
    """A reason's place in END_REASON_PRECEDENCE; estimates and unknown reasons rank last."""
    if reason in END_REASON_PRECEDENCE:
        return END_REASON_PRECEDENCE.index(reason)
    return len(END_REASON_PRECEDENCE)


def end_wins(stored: StoredEnd, new: StoredEnd) -> bool:
    """Whether a newly written end replaces the stored one: the rule by which replayed, stale
    or duplicated observations can never reopen or lengthen an interval.

    An open row takes any end; an end is never replaced by "open"; a measured end beats an
    estimate and is never replaced by one; otherwise the earlier end wins, and at the same
    second the reason END_REASON_PRECEDENCE lists first (as in :func:`billing_end`), so the
    stored reason does not depend on which observation was written first. The store's SQL
    upsert is this function written in SQL (tests/store/test_end_merge.py proves them equal).
    """
    if stored.ended_at is None:
        return True
    if new.ended_at is None:
        return False
    if stored.estimated != new.estimated:
        return stored.estimated
    return (new.ended_at, reason_rank(new.reason)) < (stored.ended_at, reason_rank(stored.reason))
