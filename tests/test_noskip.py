"""The suite's rule that a skipped test fails the run (tests/noskip.py), checked on a tiny suite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_skips_are_reported_as_failures_and_xfail_still_works(tmp_path: Path) -> None:
    (tmp_path / "test_tiny.py").write_text(
        "import pytest\n"
        "def test_passes(): pass\n"
        "def test_skips(): pytest.skip('promtool missing')\n"
        "@pytest.mark.skipif(True, reason='no kubectl')\n"
        "def test_marked(): pass\n"
        "@pytest.mark.xfail(reason='known', strict=True)\n"
        "def test_expected_failure(): assert False\n"
    )
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.noskip", "-p", "no:cacheprovider",
         "-q", "-rA", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 1, run.stdout + run.stderr
    # a skip in the test body fails the test; a skipif mark (decided at set-up) errors it
    assert "1 failed, 1 passed, 1 xfailed, 1 error" in run.stdout, run.stdout
    assert "promtool missing" in run.stdout and "no kubectl" in run.stdout
    assert "skipped" not in run.stdout.splitlines()[-1]
