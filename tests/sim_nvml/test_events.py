"""XID events through nvmlEventSetWait_v2: timeout, filtering, order, and delivery from
another process."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pynvml
import pytest

from gpuquota.sim.nvml.control import SimNode

XID = pynvml.nvmlEventTypeXidCriticalError
NONE = 0xFFFFFFFF


@pytest.fixture
def event_set():
    sets = []

    def make(*indices):
        es = pynvml.nvmlEventSetCreate()
        sets.append(es)
        for i in indices:
            pynvml.nvmlDeviceRegisterEvents(pynvml.nvmlDeviceGetHandleByIndex(i), XID, es)
        return es

    yield make
    for es in sets:
        pynvml.nvmlEventSetFree(es)


def test_wait_times_out_after_its_timeout_when_nothing_comes(nvml, event_set):
    nvml("l4x2")
    es = event_set(0, 1)
    start = time.monotonic()
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(es, 150)
    assert time.monotonic() - start >= 0.15
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(es, 0)


def test_events_arrive_in_order_for_registered_gpus_only(nvml, event_set):
    node = nvml("h100x8")
    node.inject_xid(0, 13)  # before the set exists: not delivered
    es = event_set(0, 3)
    node.inject_xid(1, 31)  # GPU 1 is not registered
    node.inject_xid(3, 79)
    node.inject_xid(0, 48)
    got = []
    for _ in range(2):
        e = pynvml.nvmlEventSetWait_v2(es, 1000)
        got.append((pynvml.nvmlDeviceGetIndex(e.device), e.eventType, e.eventData))
        assert (e.gpuInstanceId, e.computeInstanceId) == (NONE, NONE)
    assert got == [(3, XID, 79), (0, XID, 48)]
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(es, 0)


def test_a_waiting_thread_wakes_on_injection(nvml, event_set):
    node = nvml("a100-mig")
    es = event_set(0, 1, 2, 3)
    timer = threading.Timer(
        0.05, node.inject_xid, args=(2, 43), kwargs={"gpu_instance_id": 5, "compute_instance_id": 0}
    )
    timer.start()
    try:
        e = pynvml.nvmlEventSetWait_v2(es, 10_000)
    finally:
        timer.join()
    assert pynvml.nvmlDeviceGetIndex(e.device) == 2  # the physical GPU, as NVML reports
    assert (e.eventData, e.gpuInstanceId, e.computeInstanceId) == (43, 5, 0)


def test_unsupported_event_types_are_refused(nvml, event_set):
    nvml("l4x2")
    es = event_set()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeDoubleBitEccError, es)


def test_a_full_ring_drops_the_oldest_events_not_the_newest(nvml, event_set):
    node = nvml("l4x2")
    es = event_set(0)
    for n in range(300):  # more than the 256-event ring
        node.inject_xid(0, 1000 + n)
    first = pynvml.nvmlEventSetWait_v2(es, 0).eventData
    rest = [pynvml.nvmlEventSetWait_v2(es, 0).eventData for _ in range(1299 - first)]
    assert first > 1000 and rest[-1] == 1299
    assert rest == list(range(first + 1, 1300))


WAITER = """
import sys, time, pynvml as n
n.nvmlInit()
es = n.nvmlEventSetCreate()
for i in range(n.nvmlDeviceGetCount()):
    n.nvmlDeviceRegisterEvents(n.nvmlDeviceGetHandleByIndex(i), n.nvmlEventTypeXidCriticalError, es)
print("ready", flush=True)
for _ in range(int(sys.argv[1])):
    e = n.nvmlEventSetWait_v2(es, 10000)
    print(n.nvmlDeviceGetIndex(e.device), e.eventData, time.time(), flush=True)
n.nvmlEventSetFree(es)
n.nvmlShutdown()
"""


def test_events_from_another_process(make_node):
    node: SimNode = make_node("h100x8")
    proc = subprocess.Popen(
        [sys.executable, "-c", WAITER, "3"],
        env={**os.environ, **node.env()},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        for gpu, xid in ((7, 79), (2, 63), (7, 94)):
            node.inject_xid(gpu, xid)
            line = proc.stdout.readline().split()
            assert (int(line[0]), int(line[1])) == (gpu, xid)
        assert proc.wait(timeout=10) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()


def test_a_forced_failure_of_the_wait_is_reported_not_taken_for_a_timeout(nvml, event_set):
    node = nvml("l4x2")
    es = event_set(0)
    node.fail_call(None, "nvmlEventSetWait", pynvml.NVML_ERROR_UNKNOWN)  # matches _v2 too
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlEventSetWait_v2(es, 1000)
    node.fail_call(None, "nvmlEventSetWait", None)
    node.inject_xid(0, 79)
    assert pynvml.nvmlEventSetWait_v2(es, 1000).eventData == 79
