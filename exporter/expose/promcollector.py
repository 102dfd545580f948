"""``SnapshotCollector``: the exporter's metric families as a prometheus_client custom
collector, for embedding them in another prometheus_client registry.

Apart from exporter/expose/render.py so that the exporter process, which writes its exposition itself,
never imports prometheus_client.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gpuquota.exporter.expose import history, metrics
from gpuquota.exporter.expose.render import RenderOptions, series
from gpuquota.exporter.health.publishing import PublisherStatus
from gpuquota.exporter.health.verdict import NodeHealth
from gpuquota.exporter.snapshot import NodeSnapshot

DEFAULT_OPTIONS = RenderOptions()


class SnapshotCollector(Collector):
    """prometheus_client custom collector over the latest snapshot of ``source`` (and the
    latest verdict of ``verdict_source``, if given)."""

    def __init__(
        self,
        source: Callable[[], NodeSnapshot | None],
        options: RenderOptions = DEFAULT_OPTIONS,
        verdict_source: Callable[[], NodeHealth | None] | None = None,
        publisher_source: Callable[[], PublisherStatus] | None = None,
    ) -> None:
        self._source = source
        self._verdict_source = verdict_source
        self._publisher_source = publisher_source
        self._options = options
        self._table = metrics.rows(options.compat)
        self._changes = history.ChangeCounter()  # over this collector's collections

    def collect(self) -> Iterator[Metric]:
        snapshot = self._source()
        if snapshot is None:
            return
        verdict = self._verdict_source() if self._verdict_source is not None else None
        publishers = self._publisher_source() if self._publisher_source is not None else None
        for spec, rows in series(
            snapshot, verdict, self._options, self._table, publishers, self._changes
        ):
            name = spec.name
            if spec.type == "counter" and name.endswith("_total"):
                name = name[: -len("_total")]
            family = Metric(name, spec.help, spec.type)
            for pairs, value in rows:
                family.add_sample(spec.name, dict(pairs), value)
            if family.samples:
                yield family
