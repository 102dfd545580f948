"""Gaps in the record and quota history, through the Accountant, a real store (SQLite and
PostgreSQL) and the report in every format.

Issue 17 finding 3: two quota updates in one second (quota admission of two pods) keep both,
so the peak is exact; on 6c36c52 the history kept the first write of each second (peak 1).
Issue 21 item 2: a relist after 410 Gone is stored as a gap, pods that vanished inside it are
closed where the kind was last known (never later), and every report format names the gap;
on 6c36c52 there was no gap table and the vanished pod was closed at the heartbeat.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC

from sqlalchemy import text

from gpuquota.quota.accounting.accountant import Accountant
from gpuquota.quota.report import build, period, render
from gpuquota.quota.store.db import Store
from tests.accounting.objects import namespace, node, pod, quota

T0 = 1_790_000_000


def _report(store: Store, cluster: str, lo: int, hi: int) -> tuple[str, str, str, list[str]]:
    window = period.Period(lo, hi, UTC)
    request = build.ReportRequest(window, hi, ("namespace",), cluster)
    with store.engine.connect() as conn:
        report = build.build_report(conn, request)
    return (
        render.render_table(report, window),
        render.render_csv(report),
        render.render_json(report, window),
        render.notes(report),
    )


def _quota_row(table: str) -> list[str]:
    lines = [line for line in table.splitlines() if line.startswith("team-a") and "gpu" in line]
    assert len(lines) == 2, table  # the usage row, then the quota row
    return lines[1].split()


def test_two_quota_updates_in_one_second_keep_the_exact_peak(store: Store, cluster: str) -> None:
    acct = Accountant(store, cluster)
    acct.apply("ADDED", node(created=T0), T0)
    acct.apply("ADDED", namespace(labels={"team": "a"}, created=T0), T0)
    acct.apply("ADDED", quota(hard=2, used=0, created=T0), T0)
    acct.heartbeat(T0)
    acct.flush()
    # quota admission of two pods admitted in the same second: used 0 -> 1 -> 2, each update
    # written on its own flush (what a busy controller does)
    for used in (1, 2):
        acct.apply("MODIFIED", quota(hard=2, used=used), T0 + 100)
        acct.flush()
    # and in another second: up to 2 and back to 1 at once (a pod admitted, another finished)
    for used in (0, 2, 1):
        acct.apply("MODIFIED", quota(hard=2, used=used), T0 + 200)
        acct.flush()
    acct.heartbeat(T0 + 300)
    acct.flush()
    # the peak of [T0, T0 + 150) is 2, and so is the peak of [T0 + 150, T0 + 300), where 2
    # held for no whole second; the last sample of a second is what holds after it
    table, _, doc, _ = _report(store, cluster, T0, T0 + 150)
    quota_json = json.loads(doc)["quota"]["rows"]
    assert [r["quota_peak_used"] for r in quota_json] == [2.0], table
    table, _, doc, _ = _report(store, cluster, T0 + 150, T0 + 300)
    (row,) = json.loads(doc)["quota"]["rows"]
    assert row["quota_peak_used"] == 2.0
    # used 2 for 50 s, then 1 for 100 s (the 0 and the 2 of T0 + 200 held no whole second):
    # 200 unit-seconds over 150 s
    assert row["quota_avg_used"] == 200 / 150  # JSON carries the exact figure (docs/report.md)
    with store.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT observed_at, seq, used FROM quota_samples WHERE cluster = :c"
                " AND resource_name = 'requests.nvidia.com/gpu' ORDER BY observed_at, seq"
            ),
            {"c": cluster},
        ).all()
    assert [tuple(r) for r in rows] == [
        (T0, 0, 0),
        (T0 + 100, 0, 1),
        (T0 + 100, 1, 2),
        (T0 + 200, 0, 0),
        (T0 + 200, 1, 2),
        (T0 + 200, 2, 1),
    ]
    # a restarted Accountant continues the second's order from the store
    again = Accountant(store, cluster)
    again.apply("MODIFIED", quota(hard=2, used=2), T0 + 200)
    again.flush()
    with store.engine.connect() as conn:
        assert (
            conn.execute(
                text(
                    "SELECT max(seq) FROM quota_samples WHERE cluster = :c AND observed_at = :at"
                    " AND resource_name = 'requests.nvidia.com/gpu'"
                ),
                {"c": cluster, "at": T0 + 200},
            ).scalar()
            == 3
        )


def test_a_relist_after_410_is_a_gap_named_by_every_report_format(
    store: Store, cluster: str
) -> None:
    acct = Accountant(store, cluster)
    acct.apply("ADDED", node(created=T0), T0)
    acct.apply("ADDED", namespace(labels={"team": "a"}, created=T0), T0)
    acct.apply("ADDED", pod("kept", "kept", created=T0, start=T0 + 10), T0 + 10)
    acct.apply("ADDED", pod("gone", "gone", created=T0, start=T0 + 10), T0 + 10)
    acct.heartbeat(T0 + 100)
    acct.flush()
    # the Pod watch was last known current at T0 + 100; its 410 was followed by a relist that
    # completed at T0 + 400, while the heartbeat went on (the other kinds were current)
    acct.heartbeat(T0 + 390)
    acct.resync(
        "Pod", [pod("kept", "kept", created=T0, start=T0 + 10)], T0 + 400, "v-opaque", T0 + 100
    )
    acct.heartbeat(T0 + 500)
    acct.flush()
    with store.engine.connect() as conn:
        ends = dict(
            conn.execute(
                text("SELECT pod_name, ended_at FROM allocations WHERE cluster = :c AND estimated"),
                {"c": cluster},
            ).all()
        )
        gaps = conn.execute(
            text("SELECT kind, started_at, ended_at, reason FROM gaps WHERE cluster = :c"),
            {"c": cluster},
        ).all()
    # closed where the Pod kind was last known, not at the later heartbeats
    assert ends == {"gone": T0 + 100}
    assert [tuple(g) for g in gaps] == [("Pod", T0 + 100, T0 + 400, "gone")]
    # a replayed batch does not double the gap
    acct.resync(
        "Pod", [pod("kept", "kept", created=T0, start=T0 + 10)], T0 + 400, "v-opaque", T0 + 100
    )
    acct.flush()
    with store.engine.connect() as conn:
        assert (
            conn.execute(
                text("SELECT count(*) FROM gaps WHERE cluster = :c"), {"c": cluster}
            ).scalar()
            == 1
        )

    table, csv_text, doc, notes = _report(store, cluster, T0, T0 + 500)
    said = "Pod not followed from 2026-09-21T14:15:00Z to 2026-09-21T14:20:00Z (5m00s"
    assert any(said in line and "may be missing" in line for line in table.splitlines())
    assert any(said in note for note in notes)  # CSV: on stderr, as every note
    (gap_line,) = [r for r in csv.DictReader(io.StringIO(csv_text)) if r["row"] == "gap"]
    assert (gap_line["gap_kind"], gap_line["gap_seconds"]) == ("Pod", "300")
    assert gap_line["gap_start"] == "2026-09-21T14:15:00Z"
    (gap,) = json.loads(doc)["gaps"]
    assert (gap["kind"], gap["seconds"], gap["start_unix"]) == ("Pod", 300, T0 + 100)
    assert "created and deleted" in gap["may_miss"]
    assert any(said in m for m in json.loads(doc)["notes"]["messages"])
    # a period that does not overlap the gap says nothing of it
    table, csv_text, doc, _ = _report(store, cluster, T0 + 400, T0 + 500)
    assert "not followed" not in table and json.loads(doc)["gaps"] == []
    assert "gap" not in {r["row"] for r in csv.DictReader(io.StringIO(csv_text))}


def test_one_note_per_downtime_not_per_kind() -> None:
    # a restart leaves one gap per watched kind with the same span: one note names them all
    # (pods last); another span gets its own note, with the kind's own wording
    from types import SimpleNamespace

    from gpuquota.quota.report.render import gap_notes
    from gpuquota.quota.report.scope import GapRecord

    down = [
        GapRecord("c", kind, T0, T0 + 44, "restart")
        for kind in ("Pod", "Node", "Namespace", "ResourceClaim")
    ]
    relist = GapRecord("c", "Pod", T0 + 600, T0 + 639, "gone")
    notes = gap_notes(SimpleNamespace(gaps=[*down, relist]))  # type: ignore[arg-type]
    assert len(notes) == 2
    assert "Namespace, Node, ResourceClaim, Pod not followed from" in notes[0]
    assert "(44s; the controller was down" in notes[0] and "objects of these kinds" in notes[0]
    assert "Pod not followed from" in notes[1] and "Pod objects created and deleted" in notes[1]
    assert "410 Gone" in notes[1]
