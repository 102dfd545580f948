"""Measured utilisation from Prometheus: busy GPU-seconds per namespace or pod over a window.

The exporter (exporter/expose/metrics.py) publishes ``gpu_utilization_ratio`` per device, the
attribution join metric ``gpu_pod_info{gpu, uuid, namespace, pod, container}`` (value 1, one
series per container holding the device) and, with ``--pod-usage``,
``gpu_pod_sm_utilization_ratio{uuid, namespace, pod, container, owner, pod_uid}``: each pod's
own share of the device's SM time (a pod the node names by ``pod_uid`` alone holds no
allocation and is left out). The query reduces each to one series per device (utilisation;
``--pod-labels`` may copy it per pod) and per (device, pod). Where a device has per-pod
utilisation, each pod is charged what it used (utilisation-weighted); elsewhere a shared
GPU's busy time is split evenly among the pods holding it.

Reports grouped by namespace ask per namespace. Any other grouping (model, node, pool,
owner, label:..., pod) asks per (namespace, pod), and ``attach`` hands each pod's figures to
the report groups its allocations fall in, in proportion to the pod's physical GPU-seconds
in each (a pod is in one group for most keys; a namespace label that changed mid-window
splits it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from gpuquota.quota.promhttp import PrometheusError, check_url, instant_query
from gpuquota.quota.promscope import Scope
from gpuquota.quota.report.compute import Report

__all__ = ["PrometheusError", "check_url"]  # re-exported: the report's CLI imports them here

UTIL_METRIC = "gpu_utilization_ratio"
JOIN_METRIC = "gpu_pod_info"
POD_UTIL_METRIC = "gpu_pod_sm_utilization_ratio"
DEVICE_LABEL = "uuid"
MAX_POINTS = 10_000


def step_for(seconds: int) -> int:
    """Subquery resolution: at most MAX_POINTS samples per series (a week: one a minute).
    Steps shorter than the scrape interval repeat the last sample, which keeps the sum right."""
    return max(1, math.ceil(seconds / MAX_POINTS))


def busy_query(
    seconds: int, step: int, *, measured: bool = False, by: tuple[str, ...] = ("namespace",)
) -> str:
    """PromQL: busy GPU-seconds per ``by`` labels (namespace, or namespace and pod) over the
    ``seconds`` before the evaluation time; with ``measured``, the GPU-seconds that had a
    utilisation sample at all (busy or not), which is how much of the allocated time
    Prometheus covers."""
    util = f"max by ({DEVICE_LABEL}) ({UTIL_METRIC})"
    if measured:
        util = f"({util} * 0 + 1)"
    pods = f"max by ({DEVICE_LABEL}, namespace, pod) ({JOIN_METRIC})"
    joined = (
        f"({util} * on ({DEVICE_LABEL}) group_right {pods})"
        f" / on ({DEVICE_LABEL}) group_left count by ({DEVICE_LABEL}) ({pods})"
    )
    if not measured:  # each pod's own use where the exporter measures it per pod
        # a pod the node could name only by pod_uid holds no GPU through the kubelet (no
        # allocation to charge): left out, so it cannot hide the holders' even split
        own = f'sum by ({DEVICE_LABEL}, namespace, pod) ({POD_UTIL_METRIC}{{owner="pod",pod!=""}})'
        joined = f"{own} or ({joined} unless on ({DEVICE_LABEL}) {own})"
    labels = ", ".join(by)
    return f"sum by ({labels}) (sum_over_time(({joined})[{seconds}s:{step}s])) * {step}"


@dataclass(frozen=True)
class Measured:
    """Per namespace, or per "namespace/pod": busy GPU-seconds, and the GPU-seconds that
    had samples at all."""

    busy: dict[str, Fraction]
    sampled: dict[str, Fraction]
    per_pod: bool = False


def measure(
    base_url: str,
    start: int,
    end: int,
    timeout: float = 30.0,
    *,
    per_pod: bool = False,
    scope: Scope | None = None,
) -> Measured:
    """Busy and sampled physical GPU-seconds per namespace (or per pod) in [start, end), of
    ``scope``'s cluster when Prometheus holds several (quota/promscope.py)."""
    by = ("namespace", "pod") if per_pod else ("namespace",)
    return Measured(
        busy_seconds(base_url, start, end, timeout, by=by, scope=scope),
        busy_seconds(base_url, start, end, timeout, measured=True, by=by, scope=scope),
        per_pod,
    )


def busy_seconds(
    base_url: str,
    start: int,
    end: int,
    timeout: float = 30.0,
    *,
    measured: bool = False,
    by: tuple[str, ...] = ("namespace",),
    scope: Scope | None = None,
) -> dict[str, Fraction]:
    """Busy physical GPU-seconds per namespace (or "namespace/pod" with ``by`` both) in
    [start, end), from Prometheus at ``base_url`` (with ``measured``: the GPU-seconds that
    had samples; ``scope``: one cluster's series)."""
    seconds = end - start
    if seconds <= 0:
        return {}
    step = step_for(seconds)
    data = instant_query(
        base_url, busy_query(seconds, step, measured=measured, by=by), end, timeout, scope
    )
    if data.get("resultType") != "vector":
        raise PrometheusError(
            f"Prometheus at {base_url}: expected a vector result, got {data.get('resultType')!r}"
        )
    out: dict[str, Fraction] = {}
    for sample in data.get("result", []):
        try:
            key = "/".join(sample["metric"].get(label, "") for label in by)
            value = float(sample["value"][1])
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise PrometheusError(f"Prometheus at {base_url}: malformed sample {sample!r}") from exc
        if math.isfinite(value):
            out[key] = Fraction(value)
    return out


def attach(report: Report, measured: Measured, pods: Report | None = None) -> None:
    """Set each group's busy and sampled GPU-seconds. Namespace reports read the namespace
    figures; others need ``pods``: the same report grouped by its keys plus "pod", whose
    physical seconds split each pod's figures among the groups. A group Prometheus has no
    samples for keeps None: no data, not zero."""
    busy: dict[tuple[str | None, ...], Fraction] = {}
    sampled: dict[tuple[str | None, ...], Fraction] = {}
    if not measured.per_pod:
        for g in report.groups:
            ns = g.keys[0] or ""
            if ns in measured.sampled:
                sampled[g.keys] = measured.sampled[ns]
                busy[g.keys] = measured.busy.get(ns, Fraction(0))
    else:
        if pods is None:
            raise ValueError("attach: per-pod figures need the report grouped by pod too")
        held: dict[str, Fraction] = {}  # pod -> its physical seconds over all groups
        for g in pods.groups:
            held[g.keys[-1] or ""] = held.get(g.keys[-1] or "", Fraction(0)) + g.physical_seconds
        for g in pods.groups:
            pod = g.keys[-1] or ""
            if pod not in measured.sampled or not held[pod]:
                continue
            share = g.physical_seconds / held[pod]
            key = g.keys[:-1]
            sampled[key] = sampled.get(key, Fraction(0)) + measured.sampled[pod] * share
            busy[key] = busy.get(key, Fraction(0)) + measured.busy.get(pod, Fraction(0)) * share
    for g in report.groups:
        got = sampled.get(g.keys)
        if got is None or got <= 0:
            continue
        g.measured_seconds = min(got, g.physical_seconds)
        g.utilised_seconds = min(busy.get(g.keys, Fraction(0)), g.measured_seconds)
