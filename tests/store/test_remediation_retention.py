"""`gpuquota db prune` and the central remediation's record (remediation_actions): pruned by
the same cut-off as the bills, except what `gpuquota remediate` still reads: the evictions the
fleet-wide budget may count (the longest --evict-window, 7 days, before now, whatever the
cut-off: pruning them would hand the budget back; a real instance's and a dry run's own), a pod's condition still to clear, and the
breaker's state. On both databases."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from gpuquota.quota import cli
from gpuquota.quota.remediation.record import Act, Ledger
from gpuquota.quota.store import daytwo, db
from gpuquota.quota.store.models import RemediationAction
from gpuquota.quota.store.vocabulary import MAX_EVICT_WINDOW_S

DAY = 86400
NOW = 1767225600  # 2026-01-01T00:00:00Z
CUT = NOW - 2 * DAY


def test_prune_keeps_what_the_budget_the_conditions_and_the_breaker_still_need(
    empty_db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db.upgrade(empty_db_url)
    with db.open_store(empty_db_url) as store:
        ledger = Ledger(store, "c")
        other = Ledger(store, "d")  # another cluster's rows: its own latest breaker row
        for act, at in (
            (Act("evict", "evicted", pod="old"), NOW - 8 * DAY),  # past every window: goes
            (Act("evict", "evicted", pod="recent"), NOW - 6 * DAY),  # a 7d window counts it
            (Act("evict", "failed", pod="failed"), NOW - 5 * DAY),  # may have evicted: counts
            (Act("evict", "dry_run", pod="preview"), NOW - 6 * DAY),  # a dry run's budget
            (Act("evict", "dry_run", pod="old-preview"), NOW - 8 * DAY),  # past it: goes
            (Act("evict", "dry_run_blocked", pod="p"), NOW - 5 * DAY),  # spent nothing: goes
            (Act("evict", "blocked_by_pdb", pod="blocked"), NOW - 5 * DAY),  # spent nothing
            (Act("evict", "refused", pod="static"), NOW - 5 * DAY),
            (Act("condition", "marked", pod="p1"), NOW - 30 * DAY),
            (Act("condition", "cleared", pod="p1"), NOW - 29 * DAY),  # done: both go
            (Act("condition", "marked", pod="p2"), NOW - 30 * DAY),  # still to clear: stays
            (Act("condition", "dry_run", pod="p2"), NOW - 20 * DAY),  # a dry run's: goes
            (Act("breaker", "open"), NOW - 40 * DAY),
            (Act("breaker", "closed"), NOW - 39 * DAY),
            (Act("breaker", "open"), NOW - 38 * DAY),  # the latest: still open
            (Act("condition", "marked", pod="p3"), NOW - DAY),  # after the cut-off
        ):
            ledger.record(act, at)
        other.record(Act("breaker", "closed"), NOW - 50 * DAY)
        window = MAX_EVICT_WINDOW_S
        before = (ledger.left(NOW, 3, window), ledger.left(NOW, 3, window, dry_run=True),
                  ledger.marked().keys(), ledger.breaker_open())  # fmt: skip
        assert before == (1, 2, {("", "p2"), ("", "p3")}, True)

    code = cli.main(["db", "prune", "--db", empty_db_url, "--before", "2025-12-30"])
    out = capsys.readouterr().out
    shown = {ln.split()[-1]: int(ln.split()[-2]) for ln in out.splitlines()[:-1]}
    assert code == 0
    # by today's clock (weeks after NOW) "recent" and "failed" are past every window too
    assert shown["remediation_actions"] == 13
    found = daytwo.prune(empty_db_url, CUT, apply=True, now=NOW)
    assert {p.table: p.rows for p in found}["remediation_actions"] == 10

    t = RemediationAction.__table__
    with db.open_store(empty_db_url) as store:
        with store.engine.connect() as conn:
            kept = sorted(
                (r.cluster, r.action, r.result, r.pod)
                for r in conn.execute(select(t))  # type: ignore[call-overload]
            )
        assert kept == sorted([
            ("c", "evict", "evicted", "recent"), ("c", "evict", "failed", "failed"),
            ("c", "evict", "dry_run", "preview"),
            ("c", "condition", "marked", "p2"), ("c", "breaker", "open", ""),
            ("c", "condition", "marked", "p3"), ("d", "breaker", "closed", ""),
        ])  # fmt: skip
        # what remediate reads is what it was: the budget is not handed back
        ledger = Ledger(store, "c")
        after = (ledger.left(NOW, 3, window), ledger.left(NOW, 3, window, dry_run=True),
                 ledger.marked().keys(), ledger.breaker_open())  # fmt: skip
        assert after == before
    again = daytwo.prune(empty_db_url, CUT, apply=False, now=NOW)
    assert {p.table: p.rows for p in again}["remediation_actions"] == 0
