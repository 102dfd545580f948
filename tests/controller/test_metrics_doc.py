"""docs/controller-metrics.md is generated from the controller's metric table and must match
it; the table is what the controller exposes."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest

from gpuquota.quota.controller import metrics_doc
from gpuquota.quota.controller.metrics import METRICS, ControllerMetrics
from gpuquota.quota.ledger.ingest import LedgerFacts

DOC = Path(__file__).resolve().parents[2] / "docs" / "controller-metrics.md"


def test_committed_reference_matches_the_table() -> None:
    assert DOC.read_text() == metrics_doc.render(), (
        "docs/controller-metrics.md is stale: run "
        "`python -m gpuquota.quota.controller.metrics_doc --write docs/controller-metrics.md`"
    )


def test_the_table_is_what_the_controller_exposes() -> None:
    metrics = ControllerMetrics()
    metrics.ledger.read_from(LedgerFacts)  # a leader's ingester that has ingested nothing yet
    for spec in METRICS:
        if spec.scraped or spec.ledger:  # read at scrape time: no attribute to set
            assert not hasattr(metrics, spec.attr)
            continue
        collector = getattr(metrics, spec.attr)
        if spec.labels:
            collector.labels(*("x" for _ in spec.labels))
    exposed = generate_latest(metrics.registry).decode()
    helps = {line.split()[2] for line in exposed.splitlines() if line.startswith("# HELP ")}
    expected = {s.name + ("_total" if s.type == "counter" else "") for s in METRICS}
    assert expected <= helps
    assert {n for n in helps if not n.endswith("_created")} == expected
    for spec in METRICS:
        assert f"| `{spec.name}` |" in metrics_doc.render()


def test_check_flag_fails_on_a_stale_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = tmp_path / "controller-metrics.md"
    stale.write_text("# old\n")
    assert metrics_doc.main(["--check", str(stale)]) == 1
    assert "is stale" in capsys.readouterr().err
    assert metrics_doc.main(["--write", str(stale)]) == 0
    assert metrics_doc.main(["--check", str(stale)]) == 0
