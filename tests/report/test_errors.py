"""Bad input: one clear line on stderr, exit 2, nothing on stdout."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.report.conftest import Store
from tests.report.helpers import assert_refused, closed_port


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["--by", "team"], ["unknown group key 'team'", "label:<key>"]),
        (["--by", "namespace,namespace"], ["given twice"]),
        (["--by", "label:"], ["needs a label key"]),
        (["--from", "2026-10-05", "--to", "2026-10-01"], ["inverted"]),
        (["--from", "2026-10-05", "--to", "2026-10-05"], ["empty"]),
        (["--month", "2026-10", "--last", "7d"], ["choose one"]),
        (["--month", "10/2026"], ["--month"]),
        (["--tz", "Moon/Base"], ["--tz"]),
        (["--chart", "out.pdf"], ["--chart", ".png or .svg"]),
        (["--top", "-1"], ["--top"]),
        (["--top", "0"], ["--top", "at least 1"]),  # not a silent "all"
        (["--prometheus", "not-a-url"], ["--prometheus", "not an http(s) URL"]),
        (["--month", "9999-12"], ["--month", "outside the years"]),
        (["--cluster", ""], ["--cluster", "empty"]),
        # any --by works with --prometheus (per-pod utilisation); a bad URL still refuses
        (["--by", "model", "--prometheus", "prometheus:9090"], ["not an http(s) URL"]),
    ],
)
def test_bad_flags(report: Any, sqlite_store: Store, argv: list[str], needles: list[str]) -> None:
    assert_refused(report(*argv, db=sqlite_store), *needles)


def test_malformed_rate_card_names_file_and_key(
    report: Any, sqlite_store: Store, tmp_path: Path
) -> None:
    card = tmp_path / "card.yaml"
    card.write_text("default_rate: 1\nmodels:\n  H100:\n    - {rate: ten}\n")
    assert_refused(
        report("--rate-card", str(card), db=sqlite_store),
        str(card),
        "models.H100[0].rate",
        "number",
    )


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"default_rate: 1\nmodels:\n  H100:\n    - {rate: 2, from: 2026-13-01}\n", "invalid date"),
        (bytes(range(256)), "not a YAML text file"),
    ],
    ids=["month-13", "binary"],
)
def test_rate_card_that_is_no_rate_card(
    report: Any, sqlite_store: Store, tmp_path: Path, content: bytes, needle: str
) -> None:
    card = tmp_path / "card.yaml"
    card.write_bytes(content)
    assert_refused(report("--rate-card", str(card), db=sqlite_store), str(card), needle)


@pytest.mark.parametrize("last", ["1h30m", "7", "90m", "1.5h"])
def test_last_takes_the_shared_duration_grammar(
    report: Any, sqlite_store: Store, last: str
) -> None:
    from gpuquota.cli_common.durations import parse_duration

    sqlite_store.clear()
    sqlite_store.alloc("ml", 0, 60)  # a store with data (an empty one is refused)
    result = report("--last", last, "--json", "--now", "2026-10-02T00:00:00Z", db=sqlite_store)
    assert result.rc == 0, result.err
    period = json.loads(result.out)["period"]
    assert period["end_unix"] - period["start_unix"] == parse_duration(last)


def test_unreachable_postgres(report: Any) -> None:
    url = f"postgresql+psycopg://postgres@127.0.0.1:{closed_port()}/test"
    assert_refused(report(db=url), "cannot connect to database", "127.0.0.1", status=1)


def test_missing_sqlite_file(report: Any, tmp_path: Path) -> None:
    assert_refused(report(db=f"sqlite:///{tmp_path}/none.db"), "does not exist")


def test_database_without_tables(report: Any, tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    import sqlite3

    sqlite3.connect(empty).close()
    assert_refused(report(db=f"sqlite:///{empty}"), "empty database", "gpuquota db upgrade")


def test_not_a_url(report: Any) -> None:
    assert_refused(report(db="not a url"), "--db")


def test_unreachable_prometheus(report: Any, sqlite_store: Store) -> None:
    sqlite_store.clear()
    sqlite_store.alloc("ml", 0, 60)  # a store with data (an empty one is refused first)
    url = f"http://127.0.0.1:{closed_port()}"
    assert_refused(
        report("--prometheus", url, db=sqlite_store), "cannot reach Prometheus", url, status=1
    )


def test_missing_matplotlib_says_what_to_install(
    report: Any, sqlite_store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a None entry in sys.modules makes the import system report the package as absent
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = report("--chart", str(tmp_path / "c.png"), db=sqlite_store)
    assert_refused(result, "matplotlib", "gpuquota[chart]")
    assert not (tmp_path / "c.png").exists()
