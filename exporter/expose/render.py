"""Turns a NodeSnapshot (and the health verdict and publishers' state beside it) into the
Prometheus text exposition, following the metric table.

The render step of collect -> enrich -> render. The snapshot, the verdict and the publishers'
own state (exporter/health/publishing.py) come from independent producers (the collector, the
health checker, the verdict's publishers) and are never merged: the table's verdict rows read
the ``NodeHealth``, its publisher rows the ``PublisherStatus``, every other row the snapshot. Two outputs come from the
same table walk (``series``):

* ``Renderer.exposition(snapshot, verdict)``: text format 0.0.4 bytes for /metrics. Each
  device's label string is built once per snapshot and reused by every row, and the bytes are
  cached per (snapshot, verdict generation), so concurrent scrapes render once.
* ``series``: the same families as (spec, rows), which exporter/expose/promcollector.py's
  ``SnapshotCollector`` hands to another prometheus_client registry (its own module, so the
  exporter itself never imports prometheus_client: about 2 MB resident it does not use).

The exposition is written here rather than by prometheus_client's ``generate_latest`` because
the dcgm compat rows need dcgm-exporter's exact names, and prometheus_client renames every
counter to end in ``_total``.
"""

from __future__ import annotations

import gzip
import math
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from gpuquota.exporter.expose import history, metrics
from gpuquota.exporter.expose.metrics import MetricSpec, Scope
from gpuquota.exporter.health.publishing import PublisherStatus
from gpuquota.exporter.health.verdict import NodeHealth
from gpuquota.exporter.snapshot import DeviceSnapshot, NodeSnapshot, PodRef

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

LabelPairs = tuple[tuple[str, str], ...]
# What a rendering is for: the snapshot, the verdict's generation, the publishers' state.
CacheKey = tuple[NodeSnapshot, int | None, PublisherStatus | None]
L = TypeVar("L")  # how label prefixes are held: pairs, or pre-rendered text


@dataclass(frozen=True, slots=True)
class RenderOptions:
    compat: frozenset[str] = frozenset()  # e.g. {"dcgm"}
    pod_labels: bool = False  # put namespace/pod/container on every per-device series
    node: str | None = None  # metrics.NODE_LABEL's value on every native gpu_* series


def escape_label_value(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def _pairs_text(pairs: LabelPairs) -> str:
    return ",".join(f'{k}="{escape_label_value(v)}"' for k, v in pairs)


def _holders(snapshot: NodeSnapshot, uuid: str) -> tuple[PodRef, ...]:
    # A container holding two time-sliced replicas of one GPU is still one holder.
    return tuple(dict.fromkeys(snapshot.pods.get(uuid, ())))


def native_labels(device: DeviceSnapshot) -> LabelPairs:
    """The labels on every per-device series: gpu and uuid, plus the MIG instance's own."""
    if device.mig is None:
        return (("gpu", str(device.index)), ("uuid", device.uuid))
    return (
        ("gpu", str(device.mig.parent_index)),
        ("uuid", device.uuid),
        ("gpu_instance_id", str(device.mig.gpu_instance_id)),
        ("mig_profile", device.mig.profile),
    )


def dcgm_labels(device: DeviceSnapshot, snapshot: NodeSnapshot) -> LabelPairs:
    """dcgm-exporter's labels: MIG instances are named by their parent GPU plus GPU_I_*."""
    parent = device
    if device.mig is not None:
        parent_uuid = device.mig.parent_uuid
        parent = next((d for d in snapshot.devices if d.uuid == parent_uuid), device)
    minor = parent.minor_number
    pairs: LabelPairs = (
        ("gpu", str(device.mig.parent_index if device.mig else device.index)),
        ("UUID", device.mig.parent_uuid if device.mig else device.uuid),
        ("pci_bus_id", parent.pci_bus_id or ""),
        ("device", "" if minor is None else f"nvidia{minor}"),
        ("modelName", parent.name or ""),
        ("Hostname", snapshot.hostname),
        ("DCGM_FI_DRIVER_VERSION", snapshot.driver_version or ""),
    )
    if device.mig is not None:
        pairs += (
            ("GPU_I_PROFILE", device.mig.profile),
            ("GPU_I_ID", str(device.mig.gpu_instance_id)),
        )
    return pairs


def _pod_pairs(ref: PodRef) -> LabelPairs:
    return (("namespace", ref.namespace), ("pod", ref.pod), ("container", ref.container))


def _dcgm_dra_pairs(snapshot: NodeSnapshot, uuid: str, ref: PodRef) -> LabelPairs:
    """dcgm-exporter's labels for a holder whose device came through a DRA claim."""
    for c in snapshot.claims.get(uuid, ()):
        if (c.namespace, c.pod, c.container) == (ref.namespace, ref.pod, ref.container):
            return (
                ("dra_claim_name", c.claim),
                ("dra_claim_namespace", c.claim_namespace),
                ("dra_device_name", c.device),
                ("dra_driver_name", c.driver),
                ("dra_pool_name", c.pool),
            )
    return ()


@dataclass(frozen=True, slots=True)
class _DeviceLabels(Generic[L]):
    """Label prefixes of one device for one snapshot, each a list of one or more variants."""

    identity: list[L]  # IDENTITY rows: never multiplied by pods
    device: list[L]  # DEVICE rows: one variant per pod holder with --pod-labels
    dcgm: list[L]  # dcgm rows: dcgm's labels, plus pod/namespace/container (and dra_*) if held


def _device_labels(
    device: DeviceSnapshot,
    snapshot: NodeSnapshot,
    options: RenderOptions,
    convert: Callable[[LabelPairs], L],
    node: LabelPairs = (),
) -> _DeviceLabels[L]:
    base = native_labels(device) + node
    holders = _holders(snapshot, device.uuid)
    identity = [convert(base)]
    per_device = identity
    if options.pod_labels and holders:
        per_device = [convert(base + _pod_pairs(ref)) for ref in holders]
    dcgm: list[L] = []
    if "dcgm" in options.compat:
        dbase = dcgm_labels(device, snapshot)
        pairs = [
            dbase + _pod_pairs(ref) + _dcgm_dra_pairs(snapshot, device.uuid, ref) for ref in holders
        ] or [dbase]
        dcgm = [convert(p) for p in pairs]
    return _DeviceLabels(identity=identity, device=per_device, dcgm=dcgm)


# One row's samples: (label prefixes, the row's own label values, value).
RowSamples = Iterator[tuple[list[L], tuple[str, ...], float]]


def walk(
    snapshot: NodeSnapshot,
    verdict: NodeHealth | None,
    options: RenderOptions,
    table: list[MetricSpec],
    convert: Callable[[LabelPairs], L],
    publishers: PublisherStatus | None = None,
    changes: Mapping[str, int] | None = None,
) -> Iterator[tuple[MetricSpec, RowSamples[L]]]:
    """The transformation step: every row of ``table`` with its samples, in table order.

    Each device's label prefixes are built (and passed through ``convert``) once per
    snapshot; a sample is emitted once per prefix (one per pod holder with --pod-labels).
    Verdict rows have series only for devices the verdict (None: no health checking) names,
    publisher rows only with the publishers' state (None: not given), the history change
    counter's row only for devices ``changes`` counts (``history_changes``).
    """
    node: LabelPairs = ((metrics.NODE_LABEL, options.node),) if options.node else ()
    labels = [_device_labels(d, snapshot, options, convert, node) for d in snapshot.devices]
    no_prefix = [convert(())]
    node_prefix = [convert(node)]

    def row(spec: MetricSpec) -> RowSamples[L]:
        prefix = node_prefix if metrics.carries_node(spec) else no_prefix
        if spec.read_publishers is not None:
            if publishers is not None:
                for values, value in spec.read_publishers(publishers):
                    yield prefix, values, value
            return
        if spec.scope is Scope.NODE:
            assert spec.read_node is not None
            for values, value in spec.read_node(snapshot):
                yield prefix, values, value
            return
        for device, device_labels in zip(snapshot.devices, labels, strict=True):
            if spec.compat == "dcgm":
                prefixes = device_labels.dcgm
            elif spec.scope is Scope.IDENTITY:
                prefixes = device_labels.identity
            else:
                prefixes = device_labels.device
            if spec.read_changes is not None:
                count = changes.get(device.uuid) if changes is not None else None
                if count is not None:
                    for values, value in spec.read_changes(device, count):
                        yield prefixes, values, value
                continue
            if spec.read_verdict is not None:
                health = verdict.get(device.uuid) if verdict is not None else None
                if health is not None:
                    for values, value in spec.read_verdict(health):
                        yield prefixes, values, value
                continue
            assert spec.read_device is not None
            for values, value in spec.read_device(device, snapshot):
                yield prefixes, values, value

    for spec in table:
        yield spec, row(spec)


def series(
    snapshot: NodeSnapshot,
    verdict: NodeHealth | None,
    options: RenderOptions,
    table: list[MetricSpec],
    publishers: PublisherStatus | None = None,
    counter: history.ChangeCounter | None = None,
) -> Iterator[tuple[MetricSpec, Iterator[tuple[LabelPairs, float]]]]:
    """Every row with its series as full label pairs and value, in table order; the history
    change counter's row with ``counter`` (the caller's, kept across renderings)."""
    changes = (
        None
        if counter is None
        else history_changes(counter, snapshot, verdict, options, table, publishers)
    )

    def pairs(
        spec: MetricSpec, samples: RowSamples[LabelPairs]
    ) -> Iterator[tuple[LabelPairs, float]]:
        for prefixes, values, value in samples:
            extra = tuple(zip(spec.labels, values, strict=True))
            for prefix in prefixes:
                yield prefix + extra, value

    rows = walk(snapshot, verdict, options, table, _identity, publishers, changes)
    for spec, samples in rows:
        yield spec, pairs(spec, samples)


def history_changes(
    counter: history.ChangeCounter,
    snapshot: NodeSnapshot,
    verdict: NodeHealth | None,
    options: RenderOptions,
    table: list[MetricSpec],
    publishers: PublisherStatus | None = None,
) -> dict[str, int]:
    """This rendering's history change counts (exporter/expose/history.py), from the very
    series of ``table``'s history rows it renders, written as it writes them; ``counter``
    takes them. Made before the rendering, so that its count goes out with the values it
    was made from."""
    rows = [spec for spec in table if spec.history and spec.compat is None]
    rendered = (
        (spec.name, full, format_value(value))
        for spec, samples in walk(snapshot, verdict, options, rows, _identity, publishers)
        for prefixes, values, value in samples
        for full in (prefix + tuple(zip(spec.labels, values, strict=True)) for prefix in prefixes)
    )
    return counter.update(history.fingerprints(rendered))


def _identity(pairs: LabelPairs) -> LabelPairs:
    return pairs


class Renderer:
    """Renders snapshots with fixed options; caches the bytes of the latest (snapshot, verdict)."""

    def __init__(
        self, options: RenderOptions = RenderOptions(), table: list[MetricSpec] | None = None
    ) -> None:
        unknown = options.compat - metrics.COMPAT_MODES
        if unknown:
            raise ValueError(f"unknown compat mode(s): {', '.join(sorted(unknown))}")
        self.options = options
        self.table = metrics.rows(options.compat) if table is None else table
        self._lock = threading.Lock()
        self._cached_for: CacheKey | None = None
        self._cached: bytes = b""
        self._cached_gzip: bytes | None = None
        # gpu_history_changes_total: counted over this renderer's renderings, in their order
        self._changes = history.ChangeCounter()

    def exposition(
        self,
        snapshot: NodeSnapshot,
        verdict: NodeHealth | None = None,
        *,
        gzipped: bool = False,
        publishers: PublisherStatus | None = None,
    ) -> bytes:
        """The text exposition of ``snapshot`` with ``verdict`` (or its gzip); rendered (and
        compressed) once however many scrapes ask.

        The cache key is the snapshot's identity (the collector publishes a new object per
        collection, never a changed one) and the verdict's generation (the health board
        publishes a new generation on every change): no value comparison. A renderer serves
        the verdicts of one health checker, whose generations never repeat. Bytes already
        rendered for a newer snapshot answer a request for an older one (``_covers``). The
        publishers' state is compared by value (a few numbers; it changes rarely).
        """
        key = (snapshot, None if verdict is None else verdict.generation, publishers)
        with self._lock:
            cached = self._cached_for
            if not _covers(cached, key):
                self._cached = self.render(snapshot, verdict, publishers=publishers)
                self._cached_gzip = None
                self._cached_for = key
            if not gzipped:
                return self._cached
            if self._cached_gzip is None:
                self._cached_gzip = gzip.compress(self._cached, compresslevel=1)
            return self._cached_gzip

    def peek(
        self,
        snapshot: NodeSnapshot,
        verdict: NodeHealth | None = None,
        *,
        gzipped: bool = False,
        publishers: PublisherStatus | None = None,
    ) -> bytes | None:
        """The cached bytes ``exposition`` would return, or None where it would have to render
        or compress (or another thread is rendering now): never renders, never waits."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            generation = None if verdict is None else verdict.generation
            if not _covers(self._cached_for, (snapshot, generation, publishers)):
                return None
            return self._cached_gzip if gzipped else self._cached
        finally:
            self._lock.release()

    def render(
        self,
        snapshot: NodeSnapshot,
        verdict: NodeHealth | None = None,
        *,
        publishers: PublisherStatus | None = None,
    ) -> bytes:
        out: list[str] = []
        extra_text: dict[tuple[tuple[str, ...], tuple[str, ...]], str] = {}
        changes = history_changes(
            self._changes, snapshot, verdict, self.options, self.table, publishers
        )
        rows = walk(snapshot, verdict, self.options, self.table, _pairs_text, publishers, changes)
        for spec, samples in rows:
            name = spec.name
            lines: list[str] = []
            for prefixes, values, value in samples:
                extra = ""
                if values:
                    key = (spec.labels, values)
                    extra = extra_text.get(key, "")
                    if not extra:
                        extra = extra_text[key] = _pairs_text(
                            tuple(zip(spec.labels, values, strict=True))
                        )
                number = format_value(value)
                for prefix in prefixes:
                    text = f"{prefix},{extra}" if prefix and extra else prefix or extra
                    lines.append(f"{name}{{{text}}} {number}\n" if text else f"{name} {number}\n")
            if lines:
                out.append(f"# HELP {name} {escape_help(spec.help)}\n# TYPE {name} {spec.type}\n")
                out.extend(lines)
        return "".join(out).encode()


def _covers(cached: CacheKey | None, wanted: CacheKey) -> bool:
    """Whether the bytes rendered for ``cached`` (snapshot, verdict generation, publishers'
    state) answer a scrape of ``wanted``: the same snapshot and generation or newer ones, with
    the same publishers' state. A scrape that took the
    latest snapshot just before the collector published the next one gets the newer bytes
    already rendered instead of rendering an older snapshot again (and pushing the newer one
    out of the one-slot cache)."""
    if cached is None:
        return False
    have, have_generation, have_publishers = cached
    snapshot, generation, publishers = wanted
    if have_publishers != publishers:
        return False
    if have is not snapshot and have.collected_at <= snapshot.collected_at:
        return False
    if have_generation == generation:
        return True
    return have_generation is not None and generation is not None and have_generation > generation
