"""A skipped test is a defect here, not a pass: this pytest hook reports every skip as a failure.

The suite's real parts (Prometheus, PostgreSQL, kubectl, node) are installed by `make test`; a
test that skips because one is missing would otherwise let a broken set-up look green. Imported
by tests/conftest.py (which registers the hook) and loadable alone with ``-p tests.noskip``."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Generator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped tests fail this suite (install what it needs): {reason}"
