"""Read-only stores (issue 18): every read-only command works on a SQLite store in a folder
that cannot be written (a backup handed to a finance team, a read-only volume) and on a
PostgreSQL user granted SELECT only, and writes nothing there."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from gpuquota.quota.store import db
from gpuquota.sim.workload import generate
from tests.conftest import PgSchemas

GPUQUOTA = str(Path(sys.executable).parent / "gpuquota")
MONTH = ["--month", "2026-01"]


def gpuquota(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GPUQUOTA, *args], capture_output=True, text=True, timeout=120)


@contextmanager
def read_only_folder(folder: Path) -> Iterator[Path]:
    """``folder`` made unwritable for this process: mode 555, and for root (whom modes do not
    stop) the immutable attribute as well."""
    folder.chmod(0o555)
    immutable = os.geteuid() == 0
    if immutable:
        subprocess.run(["chattr", "+i", str(folder)], check=True)
    try:
        with pytest.raises(OSError):
            (folder / "probe").touch()  # the folder really is read-only
        yield folder
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        folder.chmod(0o755)


def filled(url: str, tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    events.write_text("".join(line + "\n" for line in generate(3, 1.0).lines()))
    done = gpuquota("replay", str(events), "--db", url, "--migrate", "--cluster", "c")
    assert done.returncode == 0, done.stderr


def test_sqlite_store_in_a_read_only_folder(tmp_path: Path) -> None:
    """Fails on 6c36c52: "cannot connect to database ...: unable to open database file" (the
    store is in WAL mode, whose shared-memory file cannot be made there)."""
    source = tmp_path / "live" / "gpuquota.db"
    source.parent.mkdir()
    filled(f"sqlite:///{source}", tmp_path)
    want = gpuquota("report", "--db", f"sqlite:///{source}", *MONTH, "--idle", "--format=csv")
    assert want.returncode == 0, want.stderr
    copy = tmp_path / "finance"
    copy.mkdir()
    shutil.copy(source, copy / "gpuquota.db")
    (copy / "gpuquota.db").chmod(0o444)
    url = f"sqlite:///{copy / 'gpuquota.db'}"
    with read_only_folder(copy):
        got = gpuquota("report", "--db", url, *MONTH, "--idle", "--format=csv")
        assert got.returncode == 0, got.stderr
        assert got.stdout == want.stdout
        current = gpuquota("db", "current", "--db", url)
        assert current.returncode == 0, current.stderr
        assert "(latest)" in current.stdout
        # issue 27: backup refused what report read ("unable to open database file")
        backup = gpuquota("db", "backup", "--db", url, "--to", str(tmp_path / "b.db"))
        assert backup.returncode == 0, backup.stderr
        assert sorted(p.name for p in copy.iterdir()) == ["gpuquota.db"]  # nothing written
    again = gpuquota(
        "report", "--db", f"sqlite:///{tmp_path / 'b.db'}", *MONTH, "--idle", "--format=csv"
    )
    assert again.returncode == 0 and again.stdout == want.stdout


def test_read_only_commands_create_no_files(tmp_path: Path) -> None:
    """Issue 27: in a writable folder, a read-only connection to the WAL store left its -wal
    and -shm files behind, though docs/operations.md says these commands create none."""
    store = tmp_path / "live" / "gpuquota.db"
    store.parent.mkdir()
    url = f"sqlite:///{store}"
    filled(url, tmp_path)
    assert sorted(p.name for p in store.parent.iterdir()) == ["gpuquota.db"]
    before = store.read_bytes()
    for argv in (
        ["report", *MONTH, "--idle", "--format=json"],
        ["db", "current"],
        ["db", "backup", "--to", str(tmp_path / "b.db")],
        ["db", "prune", "--before", "2026-01-02"],  # shows, removes nothing
    ):
        done = gpuquota(*argv, "--db", url)
        assert done.returncode == 0, (argv, done.stderr)
        assert sorted(p.name for p in store.parent.iterdir()) == ["gpuquota.db"], argv
    assert store.read_bytes() == before


def test_a_writer_keeps_its_log_while_a_report_reads(tmp_path: Path) -> None:
    """The tidy-up after a read removes no log a writer has open."""
    store = tmp_path / "live" / "gpuquota.db"
    store.parent.mkdir()
    filled(f"sqlite:///{store}", tmp_path)
    writer = sqlite3.connect(store)
    try:
        writer.execute("PRAGMA wal_autocheckpoint=0")
        writer.execute("UPDATE heartbeats SET at = at + 1")
        writer.commit()
        done = gpuquota("db", "current", "--db", f"sqlite:///{store}")
        assert done.returncode == 0, done.stderr
        assert (store.parent / "gpuquota.db-wal").stat().st_size > 0
    finally:
        writer.close()


def test_unread_write_ahead_log_in_a_read_only_folder_is_refused(tmp_path: Path) -> None:
    """Reading such a copy without its log would silently miss what the log holds."""
    source = tmp_path / "live" / "gpuquota.db"
    source.parent.mkdir()
    filled(f"sqlite:///{source}", tmp_path)
    copy = tmp_path / "copy"
    copy.mkdir()
    writer = sqlite3.connect(source)  # a writer still open: its log is not checkpointed
    try:
        writer.execute("PRAGMA wal_autocheckpoint=0")
        writer.execute("UPDATE heartbeats SET at = at + 1")
        writer.commit()
        for name in ("gpuquota.db", "gpuquota.db-wal"):
            shutil.copy(source.parent / name, copy / name)
    finally:
        writer.close()
    assert (copy / "gpuquota.db-wal").stat().st_size > 0
    with read_only_folder(copy):
        got = gpuquota("report", "--db", f"sqlite:///{copy / 'gpuquota.db'}", *MONTH)
    assert got.returncode == 1 and got.stderr.count("\n") == 1
    assert "write-ahead log" in got.stderr and "gpuquota db backup" in got.stderr


@pytest.mark.postgres
def test_postgres_user_with_select_only(pg_schemas: PgSchemas, tmp_path: Path) -> None:
    url = pg_schemas.new("gq_ro")
    filled(url, tmp_path)
    schema = make_url(url).query["options"].split("=", 1)[1]  # type: ignore[union-attr]
    role = f"gq_reader_{uuid.uuid4().hex[:8]}"
    admin = create_engine(pg_schemas.base_url)
    with admin.begin() as conn:
        conn.execute(text(f"CREATE ROLE {role} LOGIN PASSWORD 'r'"))
        conn.execute(text(f'GRANT USAGE ON SCHEMA "{schema}" TO {role}'))
        conn.execute(text(f'GRANT SELECT ON ALL TABLES IN SCHEMA "{schema}" TO {role}'))
    reader = make_url(url).set(username=role, password="r").render_as_string(hide_password=False)
    try:
        want = gpuquota("report", "--db", url, *MONTH, "--idle", "--format=csv")
        got = gpuquota("report", "--db", reader, *MONTH, "--idle", "--format=csv")
        assert want.returncode == 0 and got.returncode == 0, got.stderr
        assert got.stdout == want.stdout
        current = gpuquota("db", "current", "--db", reader)
        assert current.returncode == 0 and "(latest)" in current.stdout, current.stderr
        # the grant really is SELECT only
        with create_engine(reader).connect() as conn, pytest.raises(Exception, match="denied"):
            conn.execute(text("DELETE FROM allocations"))
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'REVOKE ALL ON ALL TABLES IN SCHEMA "{schema}" FROM {role}'))
            conn.execute(text(f'REVOKE ALL ON SCHEMA "{schema}" FROM {role}'))
            conn.execute(text(f"DROP ROLE {role}"))
        admin.dispose()
    assert db.safe_url(reader).count("***") == 1
