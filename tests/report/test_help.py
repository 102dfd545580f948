"""`gpuquota report --help` through the real `gpuquota` frame tells a new user everything."""

from __future__ import annotations

import pytest

from gpuquota.quota import cli as gpuquota


def test_help_lists_every_option_key_and_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        gpuquota.main(["report", "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    for needle in (
        "--from",
        "--to",
        "--month",
        "--last",
        "--tz",
        "--by",
        "--rate-card",
        "--idle",
        "--spread-idle",
        "--prometheus",
        "--format",
        "--chart",
        "--db",
        "--cluster",
        "--top",
        "label:<key>",
        "owner",
        "examples:",
        "gpuquota report --month 2026-10 --rate-card",
        "exit status",
        "gpuquota[chart]",
    ):
        assert needle in text, needle


def test_subcommand_errors_exit_2_through_the_frame(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpuquota.main(["report", "--by", "colour", "--db", "sqlite:////nonexistent/x.db"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == (
        "gpuquota report: error: --by: unknown group key 'colour' "
        "(known: namespace, model, node, pool, cluster, owner, resource, pod, path, label:<key>)"
    )


def test_span_index_migration_matches_the_models_expression() -> None:
    """The report's window scans match ix_allocations_span only if the query's class expression
    is the indexed one, character for character (SQLite compares expressions as written)."""
    import importlib.util
    from pathlib import Path

    from gpuquota.quota.store.models import SPAN_CLASS_SQL

    path = (
        Path(__file__).resolve().parents[2]
        / "alembic"
        / "versions"
        / "0003_allocation_span_index.py"
    )
    spec = importlib.util.spec_from_file_location("migration_0003", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.SPAN_CLASS_SQL == SPAN_CLASS_SQL
