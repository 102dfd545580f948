"""The fleet history tests' scenario: what two node agents said about three GPUs over four
hours, as OpenMetrics text for promtool (every 15 s). Expected figures in the tests are worked
out by hand from the definitions here.

- S1 (GPU-a1 on node-1): an XID 13 counter at 2 from before anything is ingested; XID 13 again
  at A+1000; XID 79 at A+600 fences it (unhealthy, reboot_node) until A+1800; its agent
  restarts at A+2440 (no scrapes in [A+2400, A+2430], XID counters gone); XID 79 again at
  B+300 fences it until B+900 (a relapse 2100 s after its release).
- S2 (GPU-b1 on node-1) leaves node-1 after A+2985 and comes back as GPU-b2 on node-2 at
  B+600 (a gap of 1215 s); its correctable remapped rows went from 0 to 2 meanwhile and reach
  3 at C.
- S3 (GPU-c1 on node-2) appears at B+600, degraded (row_remap_pending) from C+1200 on.
- Pods on S1 (the usage ledger's counters; their allocations are the tests'): team-a's
  train-0 from BORN to A+900 (running when S1 is first fenced), team-b's eval-0 from A+2000
  on (running at the second fence).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

WINDOW = 3600
STEP = 15
T0 = (int(time.time()) // WINDOW - 8) * WINDOW
A, B, C, D = T0, T0 + WINDOW, T0 + 2 * WINDOW, T0 + 3 * WINDOW
BORN = A - 600
END = D + 120
RESTART = A + 2440
MODEL = "NVIDIA H100 80GB HBM3"
# (namespace, pod, pod UID, first sample, samples while t < this) of the pods on GPU-a1
PODS = (
    ("team-a", "train-0", "u-train", BORN, A + 900),
    ("team-b", "eval-0", "u-eval", A + 2000, END),
)


@dataclass(frozen=True)
class Seen:
    """One agent's word on one GPU at one time."""

    serial: str
    uuid: str
    node: str
    pci: str
    state: str
    since: int
    reasons: tuple[tuple[str, str], ...] = ()
    xids: tuple[tuple[str, int], ...] = ()
    remapped: int | None = None


def s1(t: int) -> Seen | None:
    if RESTART - 40 <= t <= RESTART - 10:
        return None  # the agent restarting
    xids: list[tuple[str, int]] = []
    if t < RESTART:
        xids.append(("13", 2 if t < A + 1000 else 3))
        if t >= A + 600:
            xids.append(("79", 1))
    elif t >= B + 300:
        xids.append(("79", 1))
    if A + 600 <= t < A + 1800:
        state, since, reasons = "unhealthy", A + 600, (("xid_79", "reboot_node"),)
    elif B + 300 <= t < B + 900:
        state, since, reasons = "unhealthy", B + 300, (("xid_79", "reboot_node"),)
    elif t < A + 600:
        state, since, reasons = "healthy", BORN, ()
    elif t < RESTART:
        state, since, reasons = "healthy", A + 1800, ()
    elif t < B + 300:
        state, since, reasons = "healthy", RESTART, ()
    else:
        state, since, reasons = "healthy", B + 900, ()
    return Seen("S1", "GPU-a1", "node-1", "00000000:18:00.0", state, since, reasons, tuple(xids))


def s2(t: int) -> Seen | None:
    if t <= A + 2985:
        return Seen("S2", "GPU-b1", "node-1", "00000000:2A:00.0", "healthy", BORN, remapped=0)
    if t >= B + 600:
        remapped = 2 if t < C else 3
        return Seen(
            "S2", "GPU-b2", "node-2", "00000000:9A:00.0", "healthy", B + 600, remapped=remapped
        )
    return None


def s3(t: int) -> Seen | None:
    if t < B + 600:
        return None
    if t < C + 1200:
        return Seen("S3", "GPU-c1", "node-2", "00000000:18:00.0", "healthy", B + 600)
    pending = (("row_remap_pending", "reset_gpu"),)
    return Seen("S3", "GPU-c1", "node-2", "00000000:18:00.0", "degraded", C + 1200, pending)


def seen() -> Iterator[tuple[int, Seen]]:
    for t in range(BORN, END, STEP):
        for gpu in (s1, s2, s3):
            found = gpu(t)
            if found is not None:
                yield t, found


def _labels(s: Seen, **more: str) -> str:
    labels = {"gpu": "0", "uuid": s.uuid, "node": s.node, "instance": f"{s.node}:9400", **more}
    return ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))


def openmetrics(
    found: Iterable[tuple[int, Seen]] | None = None,
    pods: Iterable[tuple[str, str, str, int, int]] = PODS,
) -> str:
    """The samples of ``found`` (default: this scenario's) and of the pods, as OpenMetrics."""
    families: dict[str, tuple[str, dict[str, list[str]]]] = {}

    def add(family: str, kind: str, series: str, line: str) -> None:
        families.setdefault(family, (kind, {}))[1].setdefault(series, []).append(line)

    for t, s in seen() if found is None else found:
        info = _labels(
            s,
            serial=s.serial,
            model=MODEL,
            pci_bus_id=s.pci,
            driver_version="550.54.15",
            vbios_version="96.00.89.00.01",
        )
        add("gpu_info", "gauge", info, f"gpu_info{{{info}}} 1 {t}")
        for state in ("healthy", "degraded", "unhealthy"):
            labels = _labels(s, state=state)
            value = 1 if state == s.state else 0
            add("gpu_health_state", "gauge", labels, f"gpu_health_state{{{labels}}} {value} {t}")
        since = _labels(s)
        add(
            "gpu_health_since_timestamp_seconds",
            "gauge",
            since,
            f"gpu_health_since_timestamp_seconds{{{since}}} {s.since} {t}",
        )
        for reason, action in s.reasons:
            labels = _labels(s, reason=reason, action=action)
            add("gpu_health_reason", "gauge", labels, f"gpu_health_reason{{{labels}}} 1 {t}")
        for code, count in s.xids:
            labels = _labels(s, xid=code)
            add(
                "gpu_xid_errors", "counter", labels, f"gpu_xid_errors_total{{{labels}}} {count} {t}"
            )
        if s.remapped is not None:
            for cause, value in (("correctable", s.remapped), ("uncorrectable", 0)):
                labels = _labels(s, cause=cause)
                add(
                    "gpu_remapped_rows",
                    "counter",
                    labels,
                    f"gpu_remapped_rows_total{{{labels}}} {value} {t}",
                )
    for namespace, pod, uid, first, stop in pods:
        labels = ",".join(
            f'{k}="{v}"'
            for k, v in sorted(
                {
                    "gpu": "0",
                    "uuid": "GPU-a1",
                    "node": "node-1",
                    "instance": "node-1:9400",
                    "namespace": namespace,
                    "pod": pod,
                    "pod_uid": uid,
                    "activity": "sm_active",
                }.items()
            )
        )
        for t in range(first, stop, STEP):
            add(
                "gpu_pod_used_seconds",
                "counter",
                labels,
                f"gpu_pod_used_seconds_total{{{labels}}} {0.5 * (t - first)} {t}",
            )
    lines: list[str] = []
    for family, (kind, series) in families.items():
        lines.append(f"# TYPE {family} {kind}")
        for samples in series.values():
            lines += samples
    return "\n".join(lines) + "\n# EOF\n"
