"""Connections cost no thread each (starting a thread costs about as much CPU as serving a
cached scrape): the event loop serves them all, so no thread is started per connection."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.exporter.scrape import get


@pytest.fixture
def thread_starts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the threads started from now on (the stdlib's Thread.start, counted)."""
    started: list[str] = []
    original = threading.Thread.start

    def counting(self: threading.Thread) -> None:
        started.append(self.name)
        original(self)

    monkeypatch.setattr(threading.Thread, "start", counting)
    return started


def test_sequential_scrapes_reuse_workers(serve, thread_starts: list[str]) -> None:
    _node, _collector, server = serve()
    thread_starts.clear()  # the collector's and the server's own threads
    for _ in range(50):
        assert get(server, "/metrics")[0] == 200
    assert len(thread_starts) <= 5, thread_starts


def test_concurrent_scrapes_are_all_answered(serve, thread_starts: list[str]) -> None:
    _node, _collector, server = serve()
    with ThreadPoolExecutor(20) as pool:
        thread_starts.clear()
        statuses = list(pool.map(lambda _: get(server, "/metrics")[0], range(200)))
    assert statuses == [200] * 200
    served_by = [n for n in thread_starts if not n.startswith("ThreadPoolExecutor")]
    # about one worker per connection open at once (a client may reconnect before the
    # worker that served it is idle again), far fewer than one per connection
    assert len(served_by) <= 40, served_by
