"""Known counter samples of the ledger tests, as OpenMetrics text for promtool.

Each series is a function of time sampled every 15 s over a span; the tests' expected figures
are worked out by hand from these definitions (see each test)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

WINDOW = 3600
STEP = 15
# the first test window: a whole hour some hours back, so every window of the tests is closed
T0 = (int(time.time()) // WINDOW - 8) * WINDOW


@dataclass(frozen=True)
class Series:
    metric: str
    labels: dict[str, str]
    value: Callable[[int], float]  # counter value at t
    start: int  # first sample
    stop: int  # samples while t < stop
    skip: tuple[int, int] | None = None  # no samples in [a, b]

    def samples(self) -> Iterable[tuple[int, float]]:
        for t in range(self.start, self.stop, STEP):
            if self.skip and self.skip[0] <= t <= self.skip[1]:
                continue
            yield t, self.value(t)


def openmetrics(series: Iterable[Series]) -> str:
    by_metric: dict[str, list[Series]] = {}
    for s in series:
        by_metric.setdefault(s.metric, []).append(s)
    lines: list[str] = []
    for metric, group in by_metric.items():
        family = metric.removesuffix("_total")
        lines.append(f"# TYPE {family} counter")
        for s in group:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            lines += [f"{metric}{{{labels}}} {v!r} {t}" for t, v in s.samples()]
    return "\n".join(lines) + "\n# EOF\n"


def pod(metric: str, gpu: str, uid: str, name: str, namespace: str = "team-a") -> dict[str, str]:
    labels = {"gpu": "0", "uuid": gpu, "namespace": namespace, "pod": name, "pod_uid": uid}
    labels["instance"] = "node-1:9400"
    if "used" in metric:
        labels["activity"] = "sm_active"
    return labels
