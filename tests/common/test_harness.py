"""gpuquota.sim.harness: polling and stopping child processes."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from gpuquota.sim.harness import poll, stop_process, wait_for


def test_poll_returns_the_first_truthy_value_or_none() -> None:
    values = iter([0, "", "ready"])
    assert poll(lambda: next(values), timeout=1, interval=0) == "ready"
    started = time.monotonic()
    assert poll(lambda: False, timeout=0.2, interval=0.01) is None
    assert time.monotonic() - started >= 0.2


def test_wait_for_names_what_it_waited_for() -> None:
    with pytest.raises(AssertionError, match="waiting for the moon"):
        wait_for(lambda: None, timeout=0.05, what="the moon", interval=0.01)


def test_stop_process_kills_what_ignores_sigterm() -> None:
    ignores = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", ignores], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline()  # the handler is installed
    assert stop_process(proc, timeout=0.5) == -9
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert stop_process(polite) == -15
