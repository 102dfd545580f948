"""The fleet history's source: the node agents' identity, health and error series, read from
Prometheus' (or VictoriaMetrics') HTTP API the way the usage ledger reads its counters
(quota/prompieces.py: raw samples of a range selector, nothing extrapolated, asked in pieces
of a few thousand samples), and turned into readings (fleet/rules.py), piece by piece.

Only the GPUs that changed in the window are read sample by sample: PromQL finds them
(quota/fleet/changes.py), and each of the others is one quiet reading over the window
(``Reading.until``), which gives the history every sample would give. ``recall`` asks, for
a board silent since before the window, its agent's XID counters and start time at its last
reading, so that a counter's increase across a silence of any length is counted.

A reading is one scrape of one agent about one GPU: its ``gpu_info`` sample (serial, model,
PCI bus id, driver and VBIOS versions, with the agent's node) and the samples of the same
agent, GPU and time of ``gpu_health_state``, ``gpu_health_reason``,
``gpu_health_since_timestamp_seconds``, ``gpu_device_state`` and the memory counters. GPUs
without a serial (NVML answered none) are tracked by their UUID, prefixed ``uuid:``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpuquota.exporter.expose import metrics
from gpuquota.quota import promhttp, prompieces
from gpuquota.quota.fleet import changes
from gpuquota.quota.fleet.rules import Identity, Prior, Reading, XidSeries
from gpuquota.quota.promhttp import MatrixSeries
from gpuquota.quota.prompieces import MAX_SAMPLES_PER_QUERY
from gpuquota.quota.promscope import Scope

INFO = "gpu_info"
STATE = "gpu_health_state"
REASON = "gpu_health_reason"
SINCE = "gpu_health_since_timestamp_seconds"
DEVICE_STATE = "gpu_device_state"
XID = "gpu_xid_errors_total"
START = changes.START  # per agent, no uuid: the counters' epoch
# memory counters and flags kept as history: metric -> the label that splits it
COUNTERS: dict[str, str | None] = {
    "gpu_ecc_aggregate_errors_total": "type",
    "gpu_remapped_rows_total": "cause",
    "gpu_row_remap_pending": None,
    "gpu_row_remap_failure": None,
    "gpu_retired_pages_total": "cause",
    "gpu_retired_pages_pending": None,
}
# what the history reads: the exporter's history rows (they are what its change counter
# counts, exporter/expose/history.py); the names above are each one of them
GPU_METRICS = metrics.HISTORY
METRICS = (*GPU_METRICS, START)
# the longest query asked with UUIDs or instances in a regular expression (VictoriaMetrics
# refuses queries over 16 KB by default, -search.maxQueryLen; a count repeats the selector
# once per metric)
QUERY_BYTES = 14_000
MANY_BUSY = 1_000  # over this many busy GPUs and
MOSTLY_BUSY = 0.25  # this share of the fleet, every sample is asked for
RECALLED = 200  # silent boards recalled per query (about 45 characters of UUID each)


def node_of(labels: dict[str, str]) -> str:
    """The agent's node: its ``node`` label, else the scrape target (as the ledger does)."""
    return labels.get("node") or labels.get("instance") or ""


@dataclass
class _Agent:
    """What one agent said about one GPU, by sample time."""

    info: dict[int, dict[str, str]] = field(default_factory=dict)
    state: dict[int, str] = field(default_factory=dict)
    reasons: dict[int, set[tuple[str, str]]] = field(default_factory=dict)
    since: dict[int, int] = field(default_factory=dict)
    lost: dict[int, bool] = field(default_factory=dict)
    counters: dict[str, dict[int, float]] = field(default_factory=dict)  # by counter, time


def fetch(
    base_url: str,
    start: int,
    window: int,
    max_gap: int,
    timeout: float = 60.0,
    *,
    max_samples: int = MAX_SAMPLES_PER_QUERY,
    by_changes: bool = True,
    scope: Scope | None = None,
) -> tuple[list[Reading], list[XidSeries]]:
    """Readings and XID series of [start - max_gap, start + window + max_gap], asked in
    pieces of about ``max_samples`` samples (quota/prompieces.py) and added up piece by
    piece: no answer is big, and none is held longer than it takes to read it. With
    ``by_changes`` (the default) only the busy GPUs' samples are asked, and each quiet GPU
    is one reading over the window (quota/fleet/changes.py); the history is the same.
    ``scope``: one cluster's series of a store that holds several (quota/promscope.py)."""
    lo, hi = start - max_gap, start + window + max_gap
    readings = Readings()
    found = (
        changes.find(base_url, GPU_METRICS, lo, hi, max_gap, timeout, scope) if by_changes else None
    )
    if found is not None and len(found[0]) > max(MANY_BUSY, MOSTLY_BUSY * (len(found[0]) + len(found[1]))):  # fmt: skip
        found = None  # many GPUs changed: every sample in shards beats UUIDs by the hundred
    if found is None:
        for piece in prompieces.pieces(
            base_url, METRICS, lo, hi, timeout, max_samples=max_samples, scope=scope
        ):
            readings.add(piece)
        return readings.result()
    busy, quiet = found
    uuids = sorted({uuid for uuid, _, _ in busy})
    for group in changes.groups(uuids, QUERY_BYTES // (len(GPU_METRICS) + 1)):
        _fetch_gpus(base_url, group, lo, hi, timeout, max_samples, readings, scope)
    instances = sorted({instance for _, _, instance in busy})
    for regex in changes.regexes(instances, QUERY_BYTES // 2):
        matchers = f',instance=~"{regex}"'
        for piece in prompieces.pieces(
            base_url,
            (START,),
            lo,
            hi,
            timeout,
            max_samples=max_samples,
            matchers=matchers,
            scope=scope,
        ):
            readings.add(piece)
    got, xids = readings.result()
    identities: dict[tuple[str | None, ...], Identity] = {}
    for q in quiet:
        got.append(_quiet_reading(q, start - 1, start + window, identities))
    return got, xids


def _fetch_gpus(
    base_url: str,
    uuids: list[str],
    lo: int,
    hi: int,
    timeout: float,
    max_samples: int,
    readings: Readings,
    scope: Scope | None = None,
) -> None:
    """Every sample of the GPUs ``uuids`` in [lo, hi] into ``readings``: counted, then asked
    in runs of UUIDs of about ``max_samples`` samples each (their share of the count). A
    set of UUIDs is a cheap matcher for the store (its index finds them by value), where
    prompieces' shards by the UUID's last characters make it match every UUID it holds
    against a pattern; a run of one GPU over ``max_samples`` is asked in slices of time."""
    matchers = f',uuid=~"{changes.alternatives(uuids)}"'
    total = prompieces.count_samples(base_url, GPU_METRICS, lo, hi, timeout, matchers, scope)
    if total <= 0:
        return
    runs = min(len(uuids), math.ceil(total / max_samples))
    for i in range(runs):
        run = uuids[len(uuids) * i // runs : len(uuids) * (i + 1) // runs]
        share = total * len(run) / len(uuids)
        matchers = f',uuid=~"{changes.alternatives(run)}"'
        asked = prompieces.queries(GPU_METRICS, lo, hi, share, max_samples, matchers, False)
        for promql, at in asked:
            readings.add(promhttp.matrix_query(base_url, promql, at, timeout, scope))


def _identity(
    uuid: str,
    node: str,
    info: dict[str, str],
    identities: dict[tuple[str | None, ...], Identity],
) -> Identity:
    """The board's identity in a reading, shared by every reading with the same one."""
    fields = (
        uuid,
        node,
        info.get("pci_bus_id") or None,
        info.get("model") or None,
        info.get("driver_version") or None,
        info.get("vbios_version") or None,
    )
    identity = identities.get(fields)
    if identity is None:
        identity = identities[fields] = Identity(*fields)
    return identity


def _quiet_reading(
    q: changes.Quiet, t: int, until: int, identities: dict[tuple[str | None, ...], Identity]
) -> Reading:
    info = q.info
    uuid = info.get("uuid", "")
    identity = _identity(uuid, node_of(info), info, identities)
    serial = info.get("serial") or f"uuid:{uuid}"
    return Reading(t=t, serial=serial, identity=identity, state=q.state, lost=q.lost, until=until)


def recall(
    base_url: str,
    priors: dict[str, Prior],
    lo: int,
    timeout: float = 60.0,
    scope: Scope | None = None,
) -> None:
    """For each board last observed before ``lo`` (silent since, at least until the
    fetch), its agent's XID counters and start time at that last reading, from the
    time-series store, into its prior (``xids_then``, ``started_then``): what its
    counters said before the silence, whatever its length."""
    by_time: dict[int, list[Prior]] = {}
    for prior in priors.values():
        if prior.last_observed is not None and prior.last_observed < lo and prior.identity:
            by_time.setdefault(prior.last_observed, []).append(prior)
    for at, boards in sorted(by_time.items()):
        for i in range(0, len(boards), RECALLED):
            chunk = boards[i : i + RECALLED]
            uuids = changes.alternatives(sorted({p.identity.uuid for p in chunk if p.identity}))
            # the samples of that very scrape (a second wide: readings are to the second)
            promql = f'{{__name__=~"{INFO}|{XID}|{START}",uuid=~"{uuids}|"}}[1s]'
            said = promhttp.matrix_query(base_url, promql, at + 0.5, timeout, scope)
            for prior in chunk:
                assert prior.identity is not None
                uuid, node = prior.identity.uuid, prior.identity.node
                xids: dict[str, float] = {}
                kept = False  # the store still holds that reading (its gpu_info)
                for item in said:
                    labels = item.metric
                    if node_of(labels) != node or not item.values:
                        continue
                    name, value = labels.get("__name__"), item.values[-1][1]
                    if name == START:
                        prior.started_then = value
                    elif labels.get("uuid") != uuid:
                        continue
                    elif name == INFO:
                        kept = True
                    elif math.isfinite(value):
                        xids[labels.get("xid", "?")] = value
                # a counter absent from a reading the store still holds was at zero; a reading
                # it no longer holds says nothing (its counters after the silence: a baseline)
                prior.xids_then = xids if kept else None


def readings_of(result: list[MatrixSeries]) -> tuple[list[Reading], list[XidSeries]]:
    """The readings and XID series of one answer."""
    readings = Readings()
    readings.add(result)
    return readings.result()


class Readings:
    """Readings added up from the answers of the pieces of a window (prompieces.pieces):
    whatever the pieces, ``result`` is what one answer of the whole window gives. A
    series comes in a piece per time slice, and a sample on the edge of two slices in both:
    the agents' samples are kept by time (the same sample twice is one), and the XID
    counters' samples are sorted and each time kept once."""

    def __init__(self) -> None:
        self._agents: dict[tuple[str, str], _Agent] = {}
        # one Prometheus series (its labels) -> its finite samples so far
        self._xids: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = {}
        # each agent's (node's) start time by sample time
        self._starts: dict[str, dict[int, float]] = {}

    def add(self, result: list[MatrixSeries]) -> None:
        for item in result:
            self._add(item)

    def _add(self, item: MatrixSeries) -> None:
        labels = item.metric
        name = labels.get("__name__", "")
        if name == START:
            said = self._starts.setdefault(node_of(labels), {})
            said.update((round(t), v) for t, v in item.values if math.isfinite(v))
            return
        uuid = labels.get("uuid", "")
        if not uuid.startswith("GPU-"):
            return  # MIG instances are parts of their GPU's board
        if name == XID:
            series = tuple(sorted(labels.items()))
            kept = self._xids.setdefault(series, [])
            kept.extend((t, v) for t, v in item.values if math.isfinite(v))
            return
        agent = self._agents.setdefault((uuid, node_of(labels)), _Agent())
        samples = [(round(t), v) for t, v in item.values if math.isfinite(v)]
        if name == INFO:
            for t, _ in samples:
                agent.info[t] = labels
        elif name == STATE:
            for t, v in samples:
                if v == 1:
                    agent.state[t] = labels.get("state", "")
        elif name == REASON:
            pair = (labels.get("reason", ""), labels.get("action", "none"))
            for t, v in samples:
                if v == 1:
                    agent.reasons.setdefault(t, set()).add(pair)
        elif name == SINCE:
            for t, v in samples:
                agent.since[t] = int(v)
        elif name == DEVICE_STATE:
            if labels.get("state") == "lost":
                for t, v in samples:
                    agent.lost[t] = v == 1
        elif name in COUNTERS:
            split = COUNTERS[name]
            counter = f"{name}:{labels.get(split, '')}" if split else name
            agent.counters.setdefault(counter, {}).update(samples)

    def result(self) -> tuple[list[Reading], list[XidSeries]]:
        """The readings by agent (UUID, node) and time, and the XID series by agent, code
        and labels. Readings with the same identity share it, and consecutive readings of an
        agent with the same counters share their dict (a window of a big cluster has a
        reading per GPU and scrape: hundreds of thousands). Once only: takes what was added."""
        readings = []
        identities: dict[tuple[str | None, ...], Identity] = {}
        for key in sorted(self._agents):
            uuid, node = key
            agent = self._agents.pop(key)
            starts = self._starts.get(node, {})
            previous: dict[str, float] = {}
            for t, info in sorted(agent.info.items()):
                serial = info.get("serial") or f"uuid:{uuid}"
                identity = _identity(uuid, node, info, identities)
                counters = {c: by_t[t] for c, by_t in agent.counters.items() if t in by_t}
                if counters == previous:
                    counters = previous
                previous = counters
                readings.append(
                    Reading(
                        t=t,
                        serial=serial,
                        identity=identity,
                        state=agent.state.get(t, "unknown"),
                        reasons=tuple(sorted(agent.reasons.get(t, ()))),
                        since=agent.since.get(t),
                        lost=agent.lost.get(t, False),
                        counters=counters,
                        started=starts.get(t),
                    )
                )
        xids = []
        for series, samples in self._xids.items():
            labels = dict(series)
            uuid, node = labels["uuid"], node_of(labels)
            pairs = tuple((round(t), v) for t, v in prompieces.sorted_unique(samples))
            xids.append((series, XidSeries(uuid, node, labels.get("xid", "?"), pairs)))
        xids.sort(key=lambda x: (x[1].uuid, x[1].node, x[1].code, x[0]))
        return readings, [x for _, x in xids]
