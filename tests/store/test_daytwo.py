"""Day two (issue 18): backup and restore (SQLite's online backup, pg_dump), pruning history
older than a date with what goes shown first, and `db upgrade` across every migration with
data in the store. Each fails on 6c36c52, where `db backup` and `db prune` did not exist and
no test upgraded a store that held data at every revision."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import JSON, BigInteger, Boolean, Float, Integer, MetaData, String, create_engine
from sqlalchemy import insert as sql_insert
from sqlalchemy import text as sql_text
from sqlalchemy.engine import make_url

from gpuquota.quota.store import db
from gpuquota.sim.workload import generate

GPUQUOTA = str(Path(sys.executable).parent / "gpuquota")
MONTH = ["--month", "2026-01"]
START = 1767225600  # 2026-01-01T00:00:00Z, where the generated workload starts


def gpuquota(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GPUQUOTA, *args], capture_output=True, text=True, timeout=120)


def filled(url: str, tmp_path: Path, hours: float = 2.0) -> None:
    events = tmp_path / "events.jsonl"
    events.write_text("".join(line + "\n" for line in generate(3, hours).lines()))
    done = gpuquota("replay", str(events), "--db", url, "--migrate", "--cluster", "c")
    assert done.returncode == 0, done.stderr


def report(url: str, *args: str) -> str:
    done = gpuquota("report", "--db", url, *args, "--idle", "--format=csv")
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_sqlite_backup_is_one_consistent_file_and_restores(tmp_path: Path) -> None:
    live = tmp_path / "gpuquota.db"
    url = f"sqlite:///{live}"
    filled(url, tmp_path)
    writer = sqlite3.connect(live)  # a writer mid-way: its changes sit in the write-ahead log
    try:
        writer.execute("PRAGMA wal_autocheckpoint=0")
        writer.execute("UPDATE heartbeats SET at = at + 60")
        writer.commit()
        assert Path(f"{live}-wal").stat().st_size > 0
        copy = tmp_path / "backup.db"
        done = gpuquota("db", "backup", "--db", url, "--to", str(copy))
        assert done.returncode == 0, done.stderr
        assert f"backed up to {copy}" in done.stdout
    finally:
        writer.close()
    assert not Path(f"{copy}-wal").exists()  # one self-contained file
    with closing(sqlite3.connect(copy)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        at = conn.execute("SELECT at FROM heartbeats").fetchone()[0]
    with closing(sqlite3.connect(live)) as conn:
        assert conn.execute("SELECT at FROM heartbeats").fetchone()[0] == at  # the log's change
    # restore: the file back in place (controller stopped), and the same bill
    restored = tmp_path / "restored" / "gpuquota.db"
    restored.parent.mkdir()
    shutil.copy(copy, restored)
    assert report(f"sqlite:///{restored}", *MONTH) == report(url, *MONTH)
    again = gpuquota("db", "backup", "--db", url, "--to", str(copy))
    assert again.returncode == 2 and "exists" in again.stderr and again.stderr.count("\n") == 1


def test_backup_of_postgres_points_to_pg_dump(pg_schemas: Any) -> None:
    done = gpuquota("db", "backup", "--db", pg_schemas.new("gq_bk"), "--to", "/tmp/never.db")
    assert done.returncode == 2 and "pg_dump" in done.stderr


@pytest.mark.postgres
def test_pg_dump_and_pg_restore_round_trip(pg_schemas: Any, tmp_path: Path) -> None:
    """The commands docs/operations.md gives for PostgreSQL, run as written there."""
    url = pg_schemas.new("gq_dump")
    filled(url, tmp_path)
    want = report(url, *MONTH)
    parsed = make_url(url)
    schema = str(parsed.query["options"]).split("=", 1)[1]
    libpq = parsed.set(drivername="postgresql", query={}).render_as_string(hide_password=False)
    dump = tmp_path / "gpuquota.dump"
    subprocess.run(
        ["pg_dump", "--format=custom", f"--schema={schema}", f"--file={dump}", libpq],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    engine = create_engine(pg_schemas.base_url)
    with engine.begin() as conn:  # the loss
        conn.execute(sql_text(f'DROP SCHEMA "{schema}" CASCADE'))
    engine.dispose()
    subprocess.run(
        ["pg_restore", "--no-owner", f"--dbname={libpq}", str(dump)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    assert report(url, *MONTH) == want


def counts(path: Path) -> dict[str, int]:
    with closing(sqlite3.connect(path)) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {t: conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables}


def test_prune_shows_first_then_removes_only_what_no_later_bill_needs(tmp_path: Path) -> None:
    path = tmp_path / "gpuquota.db"
    url = f"sqlite:///{path}"
    filled(url, tmp_path, hours=4.0)
    # the usage ledger: pods that stopped counting before the cut-off (their series go with
    # their windows; the device only one of them held goes too) and one still counting after
    # it (its old windows go, it and its device stay)
    with closing(sqlite3.connect(path)) as conn, conn:
        conn.executemany(
            "INSERT INTO usage_devices (id, cluster, device_uuid) VALUES (?, 'c', ?)",
            [(1, "GPU-1"), (2, "GPU-2")],
        )
        for sid, device, uid in ((1, 2, "uid-gone"), (2, 1, "uid-on"), (3, 1, "uid-gone-too")):
            conn.execute(
                "INSERT INTO usage_series (id, device_id, cluster, holder_kind, holder_uid,"
                " namespace, holder_name) VALUES (?, ?, 'c', 'pod', ?, 'ns', ?)",
                (sid, device, uid, uid),
            )
        conn.executemany(
            "INSERT INTO usage_windows (series_id, window_start, window_seconds,"
            " used_gpu_seconds, energy_joules, sampled_seconds, end_used, end_energy)"
            " VALUES (?, ?, 3600, 1.0, 2.0, 3600.0, 1.0, 2.0)",
            [(1, START), (1, START + 3600), (2, START + 3600), (2, START + 7200), (3, START)],
        )
    cut = "2026-01-01T02:00:00Z"
    after = ["--from", cut, "--to", "2026-01-01T04:00:00Z"]
    want = report(url, *after)
    rows = counts(path)
    shown = gpuquota("db", "prune", "--before", cut, "--db", url)
    assert shown.returncode == 0, shown.stderr
    assert "would remove" in shown.stdout and "run again with --yes" in shown.stdout
    assert counts(path) == rows  # the default only shows
    would = {ln.split()[-1]: int(ln.split()[-2]) for ln in shown.stdout.splitlines()[:-1]}
    assert would["allocations"] > 0 and would["quota_samples"] > 0
    assert (would["usage_windows"], would["usage_series"], would["usage_devices"]) == (4, 2, 1)
    done = gpuquota("db", "prune", "--before", cut, "--db", url, "--yes")
    assert done.returncode == 0, done.stderr
    left = counts(path)
    for table, n in would.items():
        assert left[table] == rows[table] - n, table
    assert report(url, *after) == want  # every bill after the cut-off is what it was
    before = gpuquota("report", "--db", url, *MONTH, "--format=csv")
    assert before.returncode == 0 and "begins at 2026-01-01T02:00:00Z" in before.stderr
    none = gpuquota("db", "prune", "--before", cut, "--db", url, "--yes")
    assert all(ln.split()[1] == "0" for ln in none.stdout.splitlines()[:-1]), none.stdout
    future = gpuquota("db", "prune", "--before", "2999-01-01", "--db", url)
    assert future.returncode == 2 and "in the future" in future.stderr


def plausible(column: Any) -> Any:
    """A value of the column's type, for a row that must survive every later migration."""
    kind = column.type
    if isinstance(kind, Boolean):
        return False
    if isinstance(kind, (Integer, BigInteger)):
        return START + 3600 if column.name.endswith(("_at", "_from", "_to")) else 1
    if isinstance(kind, Float):
        return 1.0
    if isinstance(kind, JSON):
        return {}
    if isinstance(kind, String):
        return f"x-{column.name}"[: kind.length or 64]
    return "x"


@pytest.mark.filterwarnings("ignore:Skipped unsupported reflection of expression-based index")
def test_db_upgrade_across_every_migration_with_data(tmp_path: Path) -> None:
    """Step up one revision at a time; at each, put a row in every table it has; at the end
    every row is still there and the store opens at the latest revision."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(db._alembic_config())
    revisions = [r.revision for r in reversed(list(script.walk_revisions()))]
    assert len(revisions) >= 6
    path = tmp_path / "old.db"
    url = f"sqlite:///{path}"
    written: dict[str, int] = {}
    for i, revision in enumerate(revisions):
        db.upgrade(url, revision)
        now = counts(path)
        for table, n in written.items():
            assert now[table] >= n, (revision, table)  # the upgrade lost no row
        # rows a migration derives from others (0010: a ledger device per series' device)
        written.update({t: n for t, n in now.items() if t != "alembic_version"})
        engine = create_engine(url)
        meta = MetaData()
        meta.reflect(engine)
        with engine.begin() as conn:
            for table in meta.sorted_tables:
                if table.name == "alembic_version":
                    continue
                row = {
                    c.name: plausible(c)
                    for c in table.columns
                    # a lone integer key numbers itself; a composite key's parts are data
                    if not (
                        c.primary_key
                        and len(table.primary_key.columns) == 1
                        and isinstance(c.type, Integer)
                        and c.autoincrement
                    )
                }
                for key in ("cluster", "pod_uid", "claim_uid", "node", "namespace"):
                    if key in row:
                        row[key] = f"{key}-{i}"
                if table.name == "clusters":
                    row["name"] = f"cluster-{i}"
                if table.name == "usage_windows":  # its key (series_id, window_start) is data
                    row["window_start"] = START + 3600 * i
                conn.execute(sql_insert(table).values(**row))
                written[table.name] = written.get(table.name, 0) + 1
        engine.dispose()
    db.upgrade(url)
    assert db.current(url) == db.head_revision()
    left = counts(path)
    for table, n in written.items():
        assert left[table] == n, table
    done = gpuquota("db", "current", "--db", url)
    assert done.returncode == 0 and "(latest)" in done.stdout


def test_monthly_report_job_writes_the_previous_month_whole(tmp_path: Path) -> None:
    """What components/report-cronjob runs: --month previous and --output with {month}."""
    url = f"sqlite:///{tmp_path / 'gpuquota.db'}"
    filled(url, tmp_path)
    args = ["--month=previous", "--now=2026-02-10T00:00:00Z", "--format=csv"]
    out = tmp_path / "reports"
    out.mkdir()
    done = gpuquota("report", "--db", url, *args, f"--output={out}/gpuquota-{{month}}.csv")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert sorted(p.name for p in out.iterdir()) == ["gpuquota-2026-01.csv"]
    same = gpuquota("report", "--db", url, *MONTH, "--format=csv")
    assert (out / "gpuquota-2026-01.csv").read_text() == same.stdout != ""
    for bad in (f"{tmp_path}/no/such/folder/x.csv", str(out), ""):
        refused = gpuquota("report", "--db", url, *MONTH, f"--output={bad}")
        assert refused.returncode in (1, 2) and refused.stderr.count("\n") == 1, refused.stderr
        assert "Traceback" not in refused.stderr
    assert sorted(p.name for p in out.iterdir()) == ["gpuquota-2026-01.csv"]
