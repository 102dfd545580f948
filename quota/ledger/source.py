"""The usage ledger's source: the node agents' usage counters, read from Prometheus' HTTP API.

One instant query per window of the five counters of the #19 contract (docs/metrics.md) with a
range selector: every raw sample from ``max_gap`` before the window to ``max_gap`` after it
(the samples around the window give its coverage at the edges), grouped per ledger series
(device UUID, holder kind, holder UID). Raw samples are what the increase and coverage rules
(ledger/rules.py) need: nothing is extrapolated or resampled by Prometheus.
"""

from __future__ import annotations

import math
import urllib.parse
from dataclasses import dataclass, field

from gpuquota.quota.promhttp import PrometheusError, get_json

# metric -> (holder kind, counter): the contract's names (exporter/expose/metrics.py)
COUNTERS: dict[str, tuple[str, str]] = {
    "gpu_pod_used_seconds_total": ("pod", "used"),
    "gpu_pod_energy_joules_total": ("pod", "energy"),
    "gpu_claim_used_seconds_total": ("claim", "used"),
    "gpu_claim_energy_joules_total": ("claim", "energy"),
    "gpu_unallocated_energy_joules_total": ("unallocated", "energy"),
}
# the holder's UID and name labels per kind
HOLDER_LABELS = {"pod": ("pod_uid", "pod"), "claim": ("claim_uid", "claim")}
MODEL_LABELS = ("gpu_model", "modelName")


@dataclass
class SeriesSamples:
    """One ledger series' samples around a window, and its labels (the last seen)."""

    device_uuid: str
    holder_kind: str
    holder_uid: str
    namespace: str = ""
    holder_name: str = ""
    node: str | None = None
    gpu_model: str | None = None
    mig_profile: str | None = None
    activity: str | None = None
    used: list[tuple[float, float]] = field(default_factory=list)
    energy: list[tuple[float, float]] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.device_uuid, self.holder_kind, self.holder_uid)


def selector() -> str:
    names = "|".join(COUNTERS)
    return f'{{__name__=~"{names}"}}'


def fetch_window(
    base_url: str, start: int, window: int, max_gap: int, timeout: float = 60.0
) -> dict[tuple[str, str, str], SeriesSamples]:
    """Every ledger series' raw samples in [start - max_gap, start + window + max_gap]."""
    at = start + window + max_gap
    span = window + 2 * max_gap
    params = urllib.parse.urlencode({"query": f"{selector()}[{span}s]", "time": str(at)})
    body = get_json(f"{base_url.rstrip('/')}/api/v1/query?{params}", base_url, timeout)
    if body.get("status") != "success":
        raise PrometheusError(
            f"Prometheus at {base_url}: query failed: {body.get('error', body.get('status'))}"
        )
    data = body.get("data") or {}
    if data.get("resultType") != "matrix":
        raise PrometheusError(
            f"Prometheus at {base_url}: expected a matrix result, got {data.get('resultType')!r}"
        )
    return group(data.get("result") or [], base_url)


def group(
    result: list[dict[str, object]], base_url: str = ""
) -> dict[tuple[str, str, str], SeriesSamples]:
    """Prometheus series -> ledger series. Several Prometheus series of one holder's counter
    (its activity label changed, the agent's pod moved) are one counter: their samples merge in
    time order. A series without a device UUID or a holder UID is skipped."""
    out: dict[tuple[str, str, str], SeriesSamples] = {}
    for item in result:
        try:
            labels = item["metric"]
            values = item["values"]
            assert isinstance(labels, dict) and isinstance(values, list)
            kind, counter = COUNTERS[labels["__name__"]]
        except (KeyError, TypeError, AssertionError) as exc:
            raise PrometheusError(
                f"Prometheus at {base_url}: malformed series {item!r:.200}"
            ) from exc
        device = labels.get("uuid", "")
        uid_label, name_label = HOLDER_LABELS.get(kind, ("", ""))
        uid = labels.get(uid_label, "") if uid_label else ""
        if not device or (uid_label and not uid):
            continue
        key = (device, kind, uid)
        series = out.get(key)
        if series is None:
            series = out[key] = SeriesSamples(device, kind, uid)
        if uid_label:
            series.namespace = labels.get("namespace", series.namespace)
            series.holder_name = labels.get(name_label, series.holder_name)
        series.node = labels.get("node") or labels.get("instance") or series.node
        series.gpu_model = next(
            (labels[m] for m in MODEL_LABELS if labels.get(m)), series.gpu_model
        )
        series.mig_profile = labels.get("mig_profile") or series.mig_profile
        series.activity = labels.get("activity") or series.activity
        target = series.used if counter == "used" else series.energy
        merge = bool(target)
        try:
            for t, v in values:
                value = float(v)
                if math.isfinite(value):
                    target.append((float(t), value))
        except (TypeError, ValueError) as exc:
            raise PrometheusError(
                f"Prometheus at {base_url}: malformed samples of {labels!r:.200}"
            ) from exc
        if merge:
            target.sort()
    return out
