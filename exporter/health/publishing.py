"""The publishers' own state: how the verdict's consumers are doing, read when scraped.

The device plugin (its kubelet registrations), node status and DeviceTaintRules (their API
writes) are consumers of the verdict, not steps of the collection: their state never goes
into a snapshot. exporter/app.py reads it from them on every scrape into one immutable
``PublisherStatus``, which exporter/expose/scrape.py hands the renderer beside the snapshot and
the verdict (the ``gpuquota_exporter_device_plugin_registered``, ``_api_write_*`` and
``_dra_taint_*`` rows read it). Values only: nothing here imports a publisher.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ApiWriterStatus:
    """How one of the exporter's Kubernetes API writers is doing (exporter/listener_thread.py)."""

    consecutive_failures: int  # failed writes since the last success (0: fine)
    failures_total: int  # failed writes since the exporter started
    last_success: float | None  # unix time of the last successful write (None: none yet)


@dataclass(frozen=True, slots=True)
class PublisherStatus:
    """Compared by value: the renderer renders again only when it changed."""

    # resource -> registered with the running kubelet (None: no --device-plugin)
    device_plugin: dict[str, bool] | None = None
    # API writer ("node-status", "dra-taints") -> how its writes go; empty when none is on
    api_writers: dict[str, ApiWriterStatus] = field(default_factory=dict)
    dra_taint_rules: int | None = None  # DeviceTaintRules in place now (None: taints off)
    dra_taint_errors_total: int | None = None  # failed attempts to update them
