"""What the checks on real machines share (tools/real_kubelet_checks.py, issue 31, and
tools/real_cluster_checks.py, issue 38): waiting for an answer, and one ``PASS``/``FAIL`` line
and results entry per check.

The tools run as scripts (``python tools/<tool>.py``), so this module is found beside them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.rest import ApiException

# what a check's probe may raise while the answer is not there yet (an object not created,
# a server not listening, a field not set): asked again
NOT_YET = (ApiException, OSError, KeyError, ValueError, IndexError)


def poll(check: Callable[[], Any], timeout: float, step: float = 0.5) -> tuple[Any, float]:
    """(the first truthy answer of ``check`` or None, seconds taken), asked every ``step``
    seconds until ``timeout``."""
    start = time.monotonic()
    while True:
        try:
            value = check()
        except NOT_YET:
            value = None
        if value:
            return value, time.monotonic() - start
        if time.monotonic() - start > timeout:
            return None, time.monotonic() - start
        time.sleep(step)


@dataclass
class Results:
    """Every check's result, in order, as the results file holds them."""

    results: list[dict[str, Any]] = field(default_factory=list, kw_only=True)

    def add(self, ok: bool, detail: str, seconds: float | None, **names: str) -> bool:
        """Record one check, named by ``names`` (e.g. mode and check, in that order), and
        print its line: ``PASS|FAIL <names> (<seconds>s): <detail>``. Returns ``ok``."""
        self.results.append({**names, "ok": ok, "detail": detail, "seconds": seconds})
        took = f" ({seconds:.1f}s)" if seconds is not None else ""
        print(f"{'PASS' if ok else 'FAIL'} {' '.join(names.values())}{took}: {detail}", flush=True)
        return ok
