"""The usage ledger's source: the node agents' usage counters, read from Prometheus' HTTP API.

Instant queries of the five counters of the #19 contract (docs/metrics.md) with a range
selector: every raw sample from ``max_gap`` before the window to ``max_gap`` after it (the
samples around the window give its coverage at the edges), grouped per ledger series (device
UUID, holder kind, holder UID). A big window is asked in pieces of about 5,000 samples each
(quota/prompieces.py), so that no answer takes long to decode (decoding holds the interpreter
lock the watch loop needs too). Raw samples are what the increase and coverage rules (ledger/rules.py) need:
nothing is extrapolated or resampled by Prometheus.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field

from gpuquota.quota import prompieces
from gpuquota.quota.promhttp import MatrixSeries
from gpuquota.quota.prompieces import MAX_SAMPLES_PER_QUERY
from gpuquota.quota.promscope import Scope

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
    # where each Prometheus series' samples lie in used / energy: (its labels, from, to)
    used_runs: list[tuple[frozenset[tuple[str, str]], int, int]] = field(default_factory=list)
    energy_runs: list[tuple[frozenset[tuple[str, str]], int, int]] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.device_uuid, self.holder_kind, self.holder_uid)


def fetch_window(
    base_url: str,
    start: int,
    window: int,
    max_gap: int,
    timeout: float = 60.0,
    *,
    max_samples: int = MAX_SAMPLES_PER_QUERY,
    scope: Scope | None = None,
) -> dict[tuple[str, str, str], SeriesSamples]:
    """Every ledger series' raw samples in [start - max_gap, start + window + max_gap] (of
    ``scope``'s cluster only, when the store holds several: quota/promscope.py).

    Asked in pieces of at most about ``max_samples`` samples (quota/prompieces.py): decoding
    an answer holds the interpreter's lock, and a big one would hold up the watch loop's
    thread for as long."""
    lo, hi = start - max_gap, start + window + max_gap
    out: dict[tuple[str, str, str], SeriesSamples] = {}
    for piece in prompieces.pieces(
        base_url, tuple(COUNTERS), lo, hi, timeout, max_samples=max_samples, scope=scope
    ):
        group(piece, into=out)
    for series in out.values():
        settle(series, max_gap)
    return out


def settle(series: SeriesSamples, max_gap: float) -> None:
    """Puts the samples of a series that several Prometheus series fed in time order, following
    one Prometheus series at a time (:func:`one_at_a_time`)."""
    if series.unsorted:
        series.used = one_at_a_time(series.used, series.used_runs, max_gap)
        series.energy = one_at_a_time(series.energy, series.energy_runs, max_gap)
        series.unsorted = False
    series.used_runs, series.energy_runs = [], []


def one_at_a_time(
    samples: list[tuple[float, float]],
    runs: list[tuple[frozenset[tuple[str, str]], int, int]],
    max_gap: float,
) -> list[tuple[float, float]]:
    """The samples of several Prometheus series of one counter, one series at a time: while an
    agent rolls out with a surge, the old and the new agent both export the holder's counter,
    each its own process's (it restarts from 0), and going back and forth between their values
    would count every step back as a counter reset (the whole counter again).

    The series still there at the end (its last sample within ``max_gap`` of the newest one of
    all) that began last is followed wherever it has samples; each other series, in the same
    order, only before the first sample of every series followed before it. So the old agent
    is followed until the new one's first sample, whose value counts from 0 as any restart
    does (at most the seconds both agents measured); the new one is followed throughout a
    window whose samples begin while both still ran, whichever was scraped first, and in a
    window both outlast, so that the next window's baseline (this one's end value) is the new
    agent's. Series that follow one another (a changed activity label) come out whole, in
    time order, as before."""
    by_series: dict[frozenset[tuple[str, str]], list[tuple[float, float]]] = {}
    for labels, lo, hi in runs:
        by_series.setdefault(labels, []).extend(samples[lo:hi])
    parts = [prompieces.sorted_unique(part) for part in by_series.values() if part]
    newest = max((part[-1][0] for part in parts), default=0.0)
    parts.sort(key=lambda part: (part[-1][0] >= newest - max_gap, part[0][0]), reverse=True)
    out: list[tuple[float, float]] = []
    until = math.inf  # the earliest first sample of the series followed before this one
    for part in parts:
        out.extend(pair for pair in part if pair[0] < until)
        until = min(until, part[0][0])
    return prompieces.sorted_unique(out)


def group(
    result: list[MatrixSeries],
    into: dict[tuple[str, str, str], SeriesSamples] | None = None,
) -> dict[tuple[str, str, str], SeriesSamples]:
    """Prometheus series -> ledger series. Several Prometheus series of one holder's counter
    (its activity label changed, the agent's pod moved) are one counter: their samples merge in
    time order (``fetch_window`` settles them where they interleave: one Prometheus series at a
    time, :func:`one_at_a_time`), and the labels of the one
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
        runs = series.used_runs if counter == "used" else series.energy_runs
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
        runs.append((frozenset(labels.items()), len(target), len(target) + len(pairs)))
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
