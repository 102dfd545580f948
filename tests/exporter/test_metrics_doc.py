"""docs/metrics.md is generated from the metric table and must match it."""

from __future__ import annotations

from pathlib import Path

from gpuquota.exporter.expose import metrics, metrics_doc

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def test_committed_reference_matches_the_table() -> None:
    assert DOC.read_text() == metrics_doc.render(), (
        "docs/metrics.md is stale: run `python -m gpuquota.exporter.expose.metrics_doc --write docs/metrics.md`"
    )


def test_every_metric_is_documented() -> None:
    text = metrics_doc.render()
    for spec in metrics.METRICS:
        assert f"| `{spec.name}` |" in text


def test_check_flag_fails_on_a_stale_file(tmp_path: Path, capsys) -> None:
    stale = tmp_path / "metrics.md"
    stale.write_text("# old\n")
    assert metrics_doc.main(["--check", str(stale)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert metrics_doc.main(["--write", str(stale)]) == 0
    assert metrics_doc.main(["--check", str(stale)]) == 0
