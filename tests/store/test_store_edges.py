"""Issue 27, point 6: the store commands' edges, each with the exit status and the one line a
user can act on (each failed on 4b1b947 as its docstring says)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

from gpuquota.sim.workload import generate

BIN = Path(sys.executable).parent
MONTH = ["--month", "2026-01"]


def run(program: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / program), *args], capture_output=True, text=True, timeout=120)


def filled(path: Path) -> str:
    events = path.parent / "events.jsonl"
    events.write_text("".join(line + "\n" for line in generate(3, 1.0).lines()))
    url = f"sqlite:///{path}"
    done = run("gpuquota", "replay", str(events), "--db", url, "--migrate", "--cluster", "c")
    assert done.returncode == 0, done.stderr
    return url


def one_line(done: subprocess.CompletedProcess[str], status: int, *needles: str) -> None:
    assert done.returncode == status, (done.returncode, done.stderr)
    assert done.stderr.count("\n") == 1, done.stderr
    for needle in needles:
        assert needle in done.stderr, done.stderr


def test_a_file_that_is_no_sqlite_database_is_bad_input(tmp_path: Path) -> None:
    """Was exit 1 ("the environment did not answer") for the user's own wrong file."""
    wrong = tmp_path / "notes.db"
    wrong.write_text("these are not the tables you are looking for\n" * 20)
    url = f"sqlite:///{wrong}"
    for argv in (["report", *MONTH], ["db", "current"], ["db", "upgrade"]):
        one_line(run("gpuquota", *argv, "--db", url), 2, "not a SQLite database")


def test_db_current_refuses_a_foreign_database_as_upgrade_does(tmp_path: Path) -> None:
    """Was: `db current` said "empty ... run `gpuquota db upgrade`", which then refused it."""
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE invoices (id INTEGER)")
    url = f"sqlite:///{other}"
    current = run("gpuquota", "db", "current", "--db", url)
    one_line(current, 2, "not a gpuquota store", "invoices")
    assert "db upgrade" not in current.stderr and current.stdout == ""
    one_line(run("gpuquota", "db", "upgrade", "--db", url), 2, "not a gpuquota store")


def test_prune_before_the_epoch_is_refused(tmp_path: Path) -> None:
    """Was accepted ("0 rows"), hiding a typo in the year."""
    url = filled(tmp_path / "gpuquota.db")
    one_line(run("gpuquota", "db", "prune", "--db", url, "--before", "1969-12-31"), 2, "epoch")


def test_a_label_no_namespace_carries_is_noted(tmp_path: Path) -> None:
    """Was a 100 % "(none)" row with no word on why."""
    url = filled(tmp_path / "gpuquota.db")
    done = run("gpuquota", "report", "--db", url, *MONTH, "--by", "label:nope")
    assert done.returncode == 0, done.stderr
    assert "no namespace carried the label 'nope'" in done.stdout + done.stderr


def test_every_subcommand_takes_the_v_its_help_names(tmp_path: Path) -> None:
    """`gpuquota db current -v` was refused though its --help says -v shows a traceback."""
    done = run("gpuquota", "db", "current", "-v", "--db", f"sqlite:///{tmp_path / 'x.db'}")
    assert "unrecognized arguments" not in done.stderr and done.returncode == 1, done.stderr


def test_exporter_takes_the_v_its_help_names() -> None:
    """Its --help said "-v shows one" (a traceback) and the flag was refused."""
    help_text = run("gpu-exporter", "--help").stdout
    assert "-v shows one" in help_text and "-v, --verbose" in help_text
    done = run("gpu-exporter", "-v", "--listen", "not-an-address")
    assert "unrecognized arguments: -v" not in done.stderr
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr


def test_report_help_says_how_a_shared_claim_is_split() -> None:
    """The help said a shared claim's time goes to the pod carrying it; the docs and the
    output split it equally among the pods using it."""
    text = " ".join(run("gpuquota", "report", "--help").stdout.split())
    assert "goes to the pod carrying it" not in text
    assert "split its time equally among the pods using it" in text
