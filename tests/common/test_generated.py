"""The --write / --check convention of the docs/ generators (gpuquota/cli_common/generated.py): a
document missing, stale or unreadable fails the check with one line naming the fix, exit 1."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gpuquota.cli_common.generated import STALE, add_target_options, check, emit, write

MODULE = "tools.example_doc"


def run(argv: list[str], text: str) -> int:
    parser = argparse.ArgumentParser()
    add_target_options(parser)
    return emit(parser.parse_args(argv), text, module=MODULE, source="the table")


def test_write_then_check_then_stale(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = tmp_path / "nested" / "doc.md"  # the folder is created
    assert run(["--write", str(doc)], "# one\n") == 0
    assert doc.read_text() == "# one\n"
    assert run(["--check", str(doc)], "# one\n") == 0
    assert capsys.readouterr().err == ""
    assert run(["--check", str(doc)], "# two\n") == STALE == 1
    err = capsys.readouterr().err
    assert err == (
        f"{doc} is stale: out of date with the table; run `python -m {MODULE} --write {doc}`\n"
    )
    assert doc.read_text() == "# one\n"  # a check never writes


def test_neither_flag_prints_the_document(capsys: pytest.CaptureFixture[str]) -> None:
    assert run([], "# doc\n") == 0
    assert capsys.readouterr().out == "# doc\n"


def test_the_flags_exclude_each_other(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exited:
        run(["--write", str(tmp_path / "a"), "--check", str(tmp_path / "a")], "")
    assert exited.value.code == 2


def test_a_missing_document_is_stale(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert check(tmp_path / "absent.md", "# doc\n", module=MODULE, source="the table") == 1
    assert "absent.md is stale" in capsys.readouterr().err


def test_an_unreadable_document_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert check(tmp_path, "# doc\n", module=MODULE, source="the table") == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{MODULE}: cannot read {tmp_path}: ")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_write_replaces_what_was_there(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("old and longer\n")
    assert write(doc, "new\n") == 0
    assert doc.read_text() == "new\n"
