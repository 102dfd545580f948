"""docs/health.md is generated from the one XID table and must not drift from it."""

from __future__ import annotations

from pathlib import Path

from gpuquota.exporter.health.config import defaults
from gpuquota.exporter.health.doc import main, render

DOC = Path(__file__).resolve().parents[2] / "docs" / "health.md"


def test_docs_are_up_to_date() -> None:
    assert main([str(DOC), "--check"]) == 0


def test_every_xid_row_is_documented() -> None:
    text = DOC.read_text()
    for xid, rule in defaults().xid_rules.items():
        assert f"| {xid} | `{rule.mnemonic}` |" in text


def test_check_fails_on_a_stale_file(tmp_path: Path) -> None:
    stale = tmp_path / "health.md"
    stale.write_text(DOC.read_text().replace("| 79 |", "| 97 |"))
    assert main([str(stale), "--check"]) == 1
    assert main([str(stale), "--write"]) == 0
    assert stale.read_text() == render(DOC.read_text())
    (tmp_path / "empty.md").write_text("no markers")
    assert main([str(tmp_path / "empty.md"), "--check"]) == 2
