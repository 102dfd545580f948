"""The checker thread: queue-fed inputs, its own expiry timer, publication on the board."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from gpuquota.exporter.collect.xid import XidEvent
from gpuquota.exporter.health.checker import CheckerThread
from gpuquota.exporter.health.config import parse_config
from gpuquota.exporter.health.verdict import NodeHealth, State
from tests.health.factory import gpus, node


@pytest.fixture
def checker() -> Iterator[CheckerThread]:
    c = CheckerThread(parse_config(None, quiet_period_s=0.3))
    c.start()
    yield c
    c.stop()


def wait_state(c: CheckerThread, uuid: str, state: State, timeout: float = 2.0) -> NodeHealth:
    generation = -1
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        h = c.board.wait_for_change(generation, 0.1)
        generation = h.generation
        d = h.by_uuid().get(uuid)
        if d is not None and d.state is state:
            return h
    raise AssertionError(f"{uuid} never became {state.label}")


def test_xid_marks_then_the_quiet_period_heals(checker: CheckerThread) -> None:
    seen: list[tuple[int, int]] = []
    checker.add_listener(lambda before, after: seen.append((before.generation, after.generation)))
    assert not checker.board.ready
    checker.on_snapshot(node(*gpus(2)))
    wait_state(checker, "GPU-00000000", State.HEALTHY)
    assert checker.board.ready
    checker.on_xid(XidEvent("GPU-00000001", 1, 79, time.time()))
    h = wait_state(checker, "GPU-00000001", State.UNHEALTHY)
    assert h.by_uuid()["GPU-00000000"].state is State.HEALTHY
    # Nothing else arrives: the checker's own timer ends the episode after the quiet period.
    wait_state(checker, "GPU-00000001", State.HEALTHY)
    assert len(seen) >= 3 and all(b < a for b, a in seen)


def test_bad_inputs_do_not_stop_the_checker(checker: CheckerThread) -> None:
    def broken(before: NodeHealth, after: NodeHealth) -> None:
        raise RuntimeError("listener bug")

    checker.add_listener(broken)
    checker.on_xid(XidEvent("", -1, 79, time.time()))  # the watcher could not name the GPU
    checker.on_snapshot(node(*gpus(1)))
    checker.on_xid(XidEvent("GPU-00000000", 0, 48, time.time()))
    wait_state(checker, "GPU-00000000", State.UNHEALTHY)
    assert "" not in checker.current().by_uuid()
