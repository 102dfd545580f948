"""A watch loop against the API server stand-in, in-process: what proves a resumed kind
current, and which version the consumer gets to store.

- A resumed watch's first replayed event proves only that the stored version is still served:
  the kind is current once the watch ended cleanly (the whole replay delivered). On 4b1b947 it
  was current at the first event, so a heartbeat could be written before a pod's DELETED later
  in the replay was applied; a crash then and a 410 after the next start closed the pod at that
  heartbeat, after its real end.
- Events of objects the consumer ignores (pods without GPUs) still reach it as version-only
  BOOKMARKs. On 4b1b947 they moved nothing, so the stored Pod version stayed at the last GPU
  pod's: a restart replayed every ignored event since, and on a quiet cluster (no GPU pod
  changing for longer than the server keeps events) got 410 Gone for them: a needless relist
  and a gap.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuquota.kube.client import Kube, Timeouts, load
from gpuquota.kube.messages import Event, Message, Resync
from gpuquota.kube.watch import WatchLoop
from gpuquota.sim.apiserver import ApiServer
from tests.accounting.objects import pod

PROOF = 2  # the resumed watch's timeoutSeconds


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with ApiServer(bookmarks="none") as server:
        yield server


def _loop(
    api: ApiServer, tmp_path: Path, resume_from: str | None = None, keep: Any = None
) -> tuple[WatchLoop, queue.Queue[Message], threading.Event]:
    kube = Kube(
        load(str(api.write_kubeconfig(tmp_path / "kubeconfig"))), timeouts=Timeouts(proof=PROOF)
    )
    out: queue.Queue[Message] = queue.Queue()
    stop = threading.Event()
    loop = WatchLoop("Pod", kube, out, stop, resume_from=resume_from, keep=keep, known_at=1)
    loop.start()
    return loop, out, stop


def _events(out: queue.Queue[Message], n: int) -> list[Event]:
    got = []
    while len(got) < n:
        msg = out.get(timeout=5)
        if isinstance(msg, Event):
            got.append(msg)
    return got


def test_a_resumed_watch_is_current_only_once_its_replay_is_complete(
    api: ApiServer, tmp_path: Path
) -> None:
    stored = api.apply("ADDED", pod("uid-a", "a"))["metadata"]["resourceVersion"]
    api.apply("MODIFIED", pod("uid-a", "a", phase="Succeeded", finished=2000))
    api.apply("DELETED", pod("uid-a", "a", phase="Succeeded", finished=2000))
    loop, out, stop = _loop(api, tmp_path, resume_from=stored)
    try:
        replay = _events(out, 2)
        assert [e.event_type for e in replay] == ["MODIFIED", "DELETED"]
        assert not loop.current.is_set()  # the replay is not proven complete yet
        started = time.monotonic()
        assert loop.current.wait(PROOF + 5)  # the watch's clean end proves it
        assert time.monotonic() - started > 0.5
    finally:
        stop.set()


def test_the_version_of_ignored_pods_reaches_the_consumer(api: ApiServer, tmp_path: Path) -> None:
    api.apply("ADDED", pod("uid-g", "gpu-pod"))
    loop, out, stop = _loop(api, tmp_path, keep=lambda obj: obj["metadata"]["name"] == "gpu-pod")
    try:
        assert loop.current.wait(5)
        ignored = api.apply("ADDED", pod("uid-c", "cpu-pod", gpus=0))
        version = ignored["metadata"]["resourceVersion"]
        (marker,) = _events(out, 1)
        assert marker.event_type == "BOOKMARK"
        assert marker.obj["metadata"]["resourceVersion"] == version
        assert marker.obj["kind"] == "Pod"
    finally:
        stop.set()


@pytest.mark.parametrize("progress_notify", [True, False], ids=["etcd-3.6", "etcd-3.5"])
def test_a_stored_version_the_server_has_not_reached_is_relisted_not_proven(
    tmp_path: Path, progress_notify: bool
) -> None:
    """An etcd restore: the stored version is ahead of every one the server handed out. A
    real server answers the resumed watch with HTTP 200 and silence until timeoutSeconds
    (docs/real-kube-apiserver.md), and so does the stand-in now: the clean end must not prove
    the kind current; the server says it has not reached the version, and the loop relists
    (a gap from the stored heartbeat). On 4b1b947 the silent end proved it current."""
    with ApiServer(bookmarks="none", first_version=1_000, progress_notify=progress_notify) as api:
        api.apply("ADDED", pod("uid-a", "a"))
        loop, out, stop = _loop(api, tmp_path, resume_from="99999999")
        try:
            msg = out.get(timeout=PROOF + 10)
            assert isinstance(msg, Resync) and msg.gap_from == 1
            assert [o["metadata"]["name"] for o in msg.items] == ["a"]
            assert loop.current.wait(5)
        finally:
            stop.set()


def test_a_quiet_kind_over_an_etcd_without_progress_notify_is_proven_not_relisted(
    tmp_path: Path,
) -> None:
    """A real kube-apiserver 1.36.2 over etcd 3.5.1 (no RequestWatchProgress): a quiet kind's
    watch cache never catches up with the versions the server hands out for other kinds, so
    a list NotOlderThan the stored version says "Too large resource version" although the
    server handed it out (docs/real-kube-apiserver.md). On 2e6eed9 every quiet kind was
    relisted on every restart, each with a spurious gap; the list at exactly that version,
    which such a server sends to etcd, proves it reached."""
    with ApiServer(bookmarks="none", progress_notify=False) as api:
        api.apply("ADDED", pod("uid-a", "a"))
        kube = Kube(load(str(api.write_kubeconfig(tmp_path / "lister"))))
        api.apply("ADDED", {"kind": "Namespace", "metadata": {"name": "team-a"}})
        _, stored = kube.list("Pod")  # the server's version now: past the last pod's
        loop, out, stop = _loop(api, tmp_path, resume_from=stored)
        try:
            assert loop.current.wait(PROOF + 5)
            sent = []
            while not out.empty():
                sent.append(out.get())
            assert not [m for m in sent if isinstance(m, Resync)]  # no relist, no gap
        finally:
            stop.set()


@pytest.mark.parametrize("progress_notify", [True, False], ids=["etcd-3.6", "etcd-3.5"])
def test_the_server_tells_whether_it_reached_a_version(
    tmp_path: Path, progress_notify: bool
) -> None:
    """``Kube.reached`` as the real server answered it over etcd 3.6.13 and 3.5.1
    (docs/real-kube-apiserver.md): a version it handed out is reached, also after the kind's
    last change and also once compacted (410 to the list at exactly it); one ahead is not."""
    with ApiServer(first_version=1_000, progress_notify=progress_notify) as api:
        kube = Kube(load(str(api.write_kubeconfig(tmp_path / "kubeconfig"))))
        api.apply("ADDED", pod("uid-a", "a"))
        api.apply("ADDED", {"kind": "Namespace", "metadata": {"name": "team-a"}})
        _, handed_out = kube.list("Pod")
        assert kube.reached("Pod", handed_out)
        assert not kube.reached("Pod", "99999999")
        api.force_gone()
        assert kube.reached("Pod", handed_out)
