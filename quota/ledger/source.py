"""The usage ledger's source: the node agents' usage counters, read from Prometheus' HTTP API.

Instant queries of the five counters of the #19 contract (docs/metrics.md) with a range
selector: every raw sample from ``max_gap`` before the window to ``max_gap`` after it (the
samples around the window give its coverage at the edges), grouped per ledger series (device
UUID, holder kind, holder UID). A count first says how many samples there are; a big window is
then asked in slices of time and shards of devices of about 5,000 samples each, so that no
answer takes long to decode (decoding holds the interpreter lock the watch loop needs too);
answers are decoded straight into float pairs (promhttp.matrix_query). Raw samples are what the
increase and coverage rules (ledger/rules.py) need: nothing is extrapolated or resampled by
Prometheus.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field

from gpuquota.quota.promhttp import MatrixSeries, PrometheusError, instant_query, matrix_query

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
# samples per query (about 35 bytes of JSON each): decoding 5,000 holds the interpreter lock for
# a few milliseconds (up to 15 on a loaded 2-core machine)
MAX_SAMPLES_PER_QUERY = 5_000
_second = operator.itemgetter(1)


@dataclass
class SeriesSamples:
    """One ledger series' samples around a window, and its labels (those of its newest
    sample's Prometheus series)."""

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
    unsorted: bool = False  # samples of several Prometheus series interleave: sort them
    newest: float = float("-inf")  # the newest sample's time: its series' labels are kept

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.device_uuid, self.holder_kind, self.holder_uid)


def selector() -> str:
    names = "|".join(COUNTERS)
    return f'{{__name__=~"{names}"}}'


def _shards(count: int) -> list[str]:
    """Selectors splitting the series by the device UUID's last two characters (hex, as
    NVIDIA's UUIDs are): ``count`` shards (1, 4, 16, 64 or 256) and one for the rest."""
    if count <= 1:
        return [""]
    digits = "0123456789abcdef"

    def groups(n: int) -> list[str]:
        size = 16 // n
        return [
            f"[{digits[k * size : (k + 1) * size]}{digits[k * size : (k + 1) * size].upper()}]"
            for k in range(n)
        ]

    last = groups(min(count, 16))
    before = groups(count // 16) if count > 16 else ["[0-9a-fA-F]"]
    out = [f',uuid=~".*{b}{c}"' for b in before for c in last]
    out.append(',uuid!~".*[0-9a-fA-F][0-9a-fA-F]"')
    return out


def fetch_window(
    base_url: str,
    start: int,
    window: int,
    max_gap: int,
    timeout: float = 60.0,
    *,
    max_samples: int = MAX_SAMPLES_PER_QUERY,
) -> dict[tuple[str, str, str], SeriesSamples]:
    """Every ledger series' raw samples in [start - max_gap, start + window + max_gap].

    Asked in pieces of at most about ``max_samples`` samples (slices of time, and shards of
    devices when there are many): decoding an answer holds the interpreter's lock, and a big
    one would hold up the watch loop's thread for as long."""
    lo, hi = start - max_gap, start + window + max_gap
    span = hi - lo
    data = instant_query(base_url, f"sum(count_over_time({selector()}[{span}s]))", hi, timeout)
    try:
        total = float(data["result"][0]["value"][1]) if data.get("result") else 0.0
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise PrometheusError(f"Prometheus at {base_url}: malformed count {data!r:.200}") from exc
    if total <= 0:
        return {}
    pieces = max(1, math.ceil(total / max_samples))
    # devices first (a series asked in several slices repeats its labels), then time
    shards = next((n for n in (1, 4, 16, 64) if pieces <= n), 256)
    slices = min(max(1, math.ceil(pieces / shards)), max(1, span // 15))
    edges = [lo + (span * i) // slices for i in range(slices + 1)]
    out: dict[tuple[str, str, str], SeriesSamples] = {}
    names = "|".join(COUNTERS)
    for shard in _shards(shards):
        for i in range(slices):
            # the first slice reaches back to lo itself (a range excludes its start in
            # Prometheus 3); samples on an edge come twice and are deduplicated
            length = edges[i + 1] - edges[i] + (1 if i == 0 else 0)
            promql = f'{{__name__=~"{names}"{shard}}}[{length}s]'
            group(matrix_query(base_url, promql, edges[i + 1], timeout), into=out)
    for series in out.values():
        if series.unsorted:
            series.used = _sorted_unique(series.used)
            series.energy = _sorted_unique(series.energy)
            series.unsorted = False
    return out


def _sorted_unique(samples: list[tuple[float, float]]) -> list[tuple[float, float]]:
    samples.sort()
    return [s for i, s in enumerate(samples) if i == 0 or s[0] != samples[i - 1][0]]


def group(
    result: list[MatrixSeries],
    into: dict[tuple[str, str, str], SeriesSamples] | None = None,
) -> dict[tuple[str, str, str], SeriesSamples]:
    """Prometheus series -> ledger series. Several Prometheus series of one holder's counter
    (its activity label changed, the agent's pod moved) are one counter: their samples merge in
    time order (``fetch_window`` sorts them where they interleave), and the labels of the one
    with the newest sample are kept. A series of another metric, or without a device UUID or a
    holder UID, is skipped; NaN and infinite values are skipped. Adds to ``into`` when
    given."""
    out: dict[tuple[str, str, str], SeriesSamples] = {} if into is None else into
    for item in result:
        labels = item.metric
        found = COUNTERS.get(labels.get("__name__", ""))
        if found is None:
            continue
        kind, counter = found
        device = labels.get("uuid", "")
        uid_label, name_label = HOLDER_LABELS.get(kind, ("", ""))
        uid = labels.get(uid_label, "") if uid_label else ""
        if not device or (uid_label and not uid):
            continue
        key = (device, kind, uid)
        series = out.get(key)
        if series is None:
            series = out[key] = SeriesSamples(device, kind, uid)
        target = series.used if counter == "used" else series.energy
        pairs = item.values
        # one sum in C says whether every value is finite (a window has millions of samples)
        if pairs and not math.isfinite(sum(map(_second, pairs))):
            pairs = [p for p in pairs if math.isfinite(p[1])]
        if target and pairs and pairs[0][0] <= target[-1][0]:
            # the next slice of the same series repeats the sample on their common edge;
            # anything else (two Prometheus series of one counter) is sorted at the end
            if pairs[0][0] == target[-1][0] and (len(pairs) < 2 or pairs[1][0] > pairs[0][0]):
                pairs = pairs[1:]
            else:
                series.unsorted = True
        target.extend(pairs)
        newest = item.values[-1][0] if item.values else float("-inf")
        if newest >= series.newest:  # the labels of the newest samples win
            series.newest = newest
            if uid_label:
                series.namespace = labels.get("namespace", series.namespace)
                series.holder_name = labels.get(name_label, series.holder_name)
            series.node = labels.get("node") or labels.get("instance") or series.node
            series.gpu_model = next(
                (labels[m] for m in MODEL_LABELS if labels.get(m)), series.gpu_model
            )
            series.mig_profile = labels.get("mig_profile") or series.mig_profile
            series.activity = labels.get("activity") or series.activity
    return out
