"""One rule for a time an object cannot have carried when it was seen (later than that by
more than the clock skew allowed): `gpuquota replay` refuses the recording
(tests/store/test_cli.py), and the live controller's Accountant skips the event, so a node
whose clock runs a day ahead cannot charge a pod a day it did not run. A deletion is certain
when seen: a DELETED event is applied without the impossible times."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine
from sqlalchemy.pool import StaticPool

from gpuquota.quota import accounting as acc
from gpuquota.quota.accounting.accountant import Accountant
from gpuquota.quota.store.db import Store
from gpuquota.quota.store.models import Base
from tests.accounting.objects import node, pod
from tests.store import rows

DAY = 86400


def _store() -> Store:
    engine = create_engine(
        "sqlite://", poolclass=StaticPool, connect_args={"check_same_thread": False}
    )
    Base.metadata.create_all(engine)
    return Store("sqlite://", engine)


def test_a_finish_time_a_day_ahead_is_refused_and_the_deletion_ends_the_pod_when_seen() -> None:
    store = _store()
    accountant = Accountant(store, "c")
    accountant.apply("ADDED", node(created=10), 10)
    accountant.apply("ADDED", pod("u1", start=1010), 1010)
    ahead = pod("u1", start=1010, phase="Succeeded", finished=2000 + DAY)
    with pytest.raises(acc.AccountingError, match=r"finishedAt .* is later than when it was seen"):
        accountant.apply("MODIFIED", ahead, 2000)
    accountant.flush()
    (row,) = rows.allocations(store, "c").values()
    assert row["ended_at"] is None  # the impossible end was not taken
    accountant.apply("DELETED", ahead, 2100)
    accountant.flush()
    (row,) = rows.allocations(store, "c").values()
    assert (row["ended_at"], row["estimated"]) == (2100, False)  # when the deletion was seen


def test_a_time_within_the_clock_skew_or_a_grace_deadline_is_taken() -> None:
    store = _store()
    accountant = Accountant(store, "c")
    accountant.apply("ADDED", node(created=10), 10)
    accountant.apply("ADDED", pod("u1", start=1010), 1010)
    skewed = pod("u1", start=1010, phase="Succeeded", finished=2000 + acc.CLOCK_SKEW)
    accountant.apply("MODIFIED", skewed, 2000)
    accountant.apply("ADDED", pod("u2", start=1010), 1010)
    # a deletionTimestamp is a deadline: the request's time plus the grace period
    deadline = pod("u2", start=1010, deletion=2000 + 3600, grace=3600)
    accountant.apply("MODIFIED", deadline, 2000)
    accountant.flush()
    got = {uid: r["ended_at"] for (uid, _), r in rows.allocations(store, "c").items()}
    assert got == {"u1": 2000 + acc.CLOCK_SKEW, "u2": 2000 + 3600}
