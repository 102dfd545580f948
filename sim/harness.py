"""Chores every driver of our programs repeats: wait for a condition, stop a child process,
tell whether the controller has caught up with the API server stand-in.

The demo, the benchmarks and the tests start gpu-exporter, gpuquota and Prometheus as real
processes and wait for them to reach a state; these are the one implementation of each.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from gpuquota.sim.apiserver import ApiServer

T = TypeVar("T")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a program about to)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def poll(condition: Callable[[], T], timeout: float = 10.0, interval: float = 0.05) -> T | None:
    """The first truthy value of ``condition()`` within ``timeout`` seconds, else None."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            return None
        time.sleep(interval)


def wait_for(
    condition: Callable[[], T],
    timeout: float = 10.0,
    what: str = "the condition",
    interval: float = 0.05,
) -> T:
    """Like poll, but a timeout is an AssertionError naming ``what`` (for tests)."""
    value = poll(condition, timeout, interval)
    if value is None:
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
    return value


def stop_process(proc: subprocess.Popen[Any], timeout: float = 10.0) -> int:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout``; its exit code."""
    if proc.poll() is None:
        proc.terminate()
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def caught_up(
    api: ApiServer,
    versions: Mapping[str, object],
    kinds: Iterable[str],
    applies: Callable[[dict[str, Any]], bool],
) -> bool:
    """Whether a controller's stored heartbeat ``versions`` name, for every kind in ``kinds``,
    a version after which ``api`` wrote nothing the controller applies (``applies``: it drops
    pods without GPUs). The stand-in orders its own versions; the controller never compares
    them, and neither does this."""
    for kind in kinds:
        if kind not in versions:
            return False
        changed = api.changed_since(kind, str(versions[kind]))
        if changed is None or any(applies(obj) for obj in changed):
            return False
    return True
