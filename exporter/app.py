"""The node agent put together: every part of ``gpu-exporter`` built from the parsed flags.

The one place the program is assembled (exporter/cli.py only defines and parses the flags,
starts, stops and maps errors to exit codes). It builds, in the flow's order:

  collect  NvmlApi, the CollectLoop and the XidWatcher (exporter/collect/)
  enrich   pod attribution (pod-resources, DRA slices and claims) and per-pod usage
           (exporter/enrich/), added to the loop as enrichers in that order
  health   the CheckerThread fed by the loop and the XID thread, its VerdictBoard, and the
           verdict's publishers: /health (health/route.py), the device plugin
           (exporter/deviceplugin/), node status (exporter/nodestatus/) and DeviceTaintRules
           (exporter/dra/)
  expose   the Renderer, the ScrapeSource behind the ExporterServer, which reads the latest
           snapshot, the verdict and the publishers' own state (exporter/health/publishing.py)

This is the only module that knows both the checker and its publishers, so health/ imports
none of them. Bad input raises ``UsageError`` (exit 2), an environment the exporter cannot
run in ``SetupError`` (exit 1); either names the flag or file, in one line.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuquota.cli_common.durations import Multiple, format_duration
from gpuquota.exporter.collect.interconnect import read_interconnect
from gpuquota.exporter.collect.loop import CollectLoop
from gpuquota.exporter.collect.nvml import DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND, NvmlApi, NvmlError
from gpuquota.exporter.collect.xid import XidWatcher
from gpuquota.exporter.deviceplugin.devices import PluginConfig
from gpuquota.exporter.deviceplugin.preferred import Topology
from gpuquota.exporter.deviceplugin.topologycache import CachedTopology
from gpuquota.exporter.dra.taints import DeviceTaintPublisher
from gpuquota.exporter.enrich.claimreader import AdminAccessClaims
from gpuquota.exporter.enrich.dra import DraAttribution
from gpuquota.exporter.enrich.ledger import LedgerConfig, LedgerEnricher, UidSource
from gpuquota.exporter.enrich.poddirectory import PodDirectory, lister_for_node
from gpuquota.exporter.enrich.podresources import PodResourcesWatcher
from gpuquota.exporter.enrich.procfs import ProcReader
from gpuquota.exporter.enrich.slices import KINDS, SliceIndex
from gpuquota.exporter.enrich.slicewatcher import SliceWatcher
from gpuquota.exporter.enrich.usage import PodUsageEnricher
from gpuquota.exporter.expose.render import Renderer, RenderOptions
from gpuquota.exporter.expose.scrape import READY_AFTER_INTERVALS, default_liveness_timeout
from gpuquota.exporter.expose.server import ExporterServer
from gpuquota.exporter.expose.webconfig import ReloadingWebConfig, WebConfigError
from gpuquota.exporter.health.checker import CheckerThread, boot_time
from gpuquota.exporter.health.config import RulesConfigError, load_config
from gpuquota.exporter.health.publishing import PublisherStatus
from gpuquota.exporter.health.route import HealthRoute
from gpuquota.exporter.health.view import HEALTH_ROUTES

if TYPE_CHECKING:  # imported when their flags are on: grpc's device plugin stubs are not small
    from gpuquota.exporter.deviceplugin.manager import DevicePluginManager
    from gpuquota.exporter.nodestatus.updater import NodeStatusUpdater

log = logging.getLogger(__name__)

NO_LIBRARY = (
    "cannot load libnvidia-ml.so.1 (NVML): install the NVIDIA driver; on a GPU node in "
    "Kubernetes, mount the driver into the container (NVIDIA container toolkit / GPU "
    "operator); for the demo, `make demo` builds the NVML stand-in "
    "(build/sim/libnvidia-ml.so.1) and runs against it"
)


class UsageError(ValueError):
    """Bad input on the command line or in a file it names (exit 2)."""


class SetupError(RuntimeError):
    """The machine cannot run the exporter as asked (exit 1)."""


class KubeConfigUnavailableError(SetupError):
    """No usable Kubernetes API configuration for a flag that needs the API (one line)."""


# --- health: the checker and the publishers of its verdict -----------------------------------


@dataclass
class CheckerAndPublishers:
    """The checker thread, its board, and the publishers the flags turned on."""

    checker: CheckerThread
    route: HealthRoute
    plugin_manager: DevicePluginManager | None = None
    node_status: NodeStatusUpdater | None = None


def build_health(
    args: argparse.Namespace,
    topology: Callable[[], Topology] = Topology,
    hostname: str | None = None,
) -> CheckerAndPublishers:
    """UsageError (naming the flag or file) on bad settings; KubeConfigUnavailableError when
    node status needs an API it cannot configure."""
    try:
        config = load_config(args.health_config, quiet_period_s=args.health_quiet_period)
    except RulesConfigError as exc:
        raise UsageError(str(exc)) from None
    checker = CheckerThread(config, booted_at=boot_time())
    manager = None
    if args.device_plugin:
        try:
            plugin_config = PluginConfig(
                resource_name=args.resource_name,
                replicas=args.time_slicing_replicas,
                cdi=args.cdi,
            )
        except ValueError as exc:
            raise UsageError(f"--resource-name/--time-slicing-replicas: {exc}") from None
        if not args.device_plugin_dir.is_dir():
            raise UsageError(f"--device-plugin-dir {args.device_plugin_dir}: no such folder")
        from gpuquota.exporter.deviceplugin.manager import DevicePluginManager

        manager = DevicePluginManager(
            checker.board, plugin_config, args.device_plugin_dir, topology=topology
        )
    node_status = None
    if args.node_taint or args.node_condition:
        if not args.node_name:
            raise UsageError("--node-taint/--node-condition need --node-name (or $NODE_NAME)")
        from gpuquota.exporter.nodestatus.updater import NodeStatusUpdater

        node_status = NodeStatusUpdater(
            kube_api(args.kubeconfig, "--node-taint/--node-condition need"),
            args.node_name,
            taint=args.node_taint,
            condition=args.node_condition,
            effect=args.node_taint_effect,
            on_fences=checker.restore,
        )
        checker.add_listener(node_status)
    route = HealthRoute(checker.board, args.node_name or hostname or socket.gethostname())
    return CheckerAndPublishers(checker, route, manager, node_status)


# --- DRA: slices and claims for attribution, the verdict as DeviceTaintRules -----------------


@dataclass
class DraParts:
    attribution: DraAttribution
    watcher: SliceWatcher
    taints: DeviceTaintPublisher | None = None


def build_dra(args: argparse.Namespace) -> DraParts | None:
    """None when DRA support is off. ``--dra auto`` (the default) turns attribution on where
    the exporter can reach the Kubernetes API (in a pod, or with --kubeconfig) and knows its
    node name; without RBAC for resourceslices it then says so once and attribution stays on
    the device-plugin path. DeviceTaintRules are opt-in (``--dra-device-taints``): they write
    cluster-scoped objects and need the deploy/components/dra RBAC. UsageError naming the
    flag on bad settings, KubeConfigUnavailableError when the API cannot be configured."""
    drivers = [d.strip() for d in args.dra_drivers.split(",") if d.strip()]
    if not drivers:
        raise UsageError("--dra-drivers: give at least one DRA driver name")
    if args.dra == "off":
        if args.dra_device_taints:
            raise UsageError("--dra-device-taints needs DRA support (not --dra off)")
        return None
    asked_for = args.dra == "on" or args.dra_device_taints
    if asked_for:
        if not args.node_name:
            raise UsageError("--dra on/--dra-device-taints need --node-name (or $NODE_NAME)")
    elif not (args.node_name and (args.kubeconfig or os.environ.get("KUBERNETES_SERVICE_HOST"))):
        return None  # auto, and no API server or node name to follow slices with
    try:
        kube = kube_api(
            args.kubeconfig,
            "--dra needs",
            {kind: f"spec.nodeName={args.node_name}" for kind in KINDS},
        )
    except KubeConfigUnavailableError as exc:
        if asked_for:
            raise
        # auto: a pod without a service account token, say; device plugins still attribute
        log.info("DRA attribution is off: no usable Kubernetes credentials (%s)", exc)
        return None
    index = SliceIndex(drivers)
    watcher = SliceWatcher(kube, index, args.node_name, asked_for=asked_for)
    attribution = DraAttribution(index, watcher)
    index.on_problem = attribution.count_problem
    attribution.admin = AdminAccessClaims(kube)
    taints = None
    if args.dra_device_taints:
        taints = DeviceTaintPublisher(kube, index, args.node_name, effect=args.dra_taint_effect)
    return DraParts(attribution, watcher, taints)


# --- per-pod usage ---------------------------------------------------------------------------


def build_pod_usage(
    args: argparse.Namespace, core: Callable[[Path | None, str], Any] | None = None
) -> PodUsageEnricher | None:
    """The enricher --pod-usage asks for (None without it). NVML reports PIDs in the
    exporter's PID namespace and /proc shows only that namespace's processes: both need the
    host PID namespace (``hostPID: true``, deploy/components/pod-usage)."""
    if not args.pod_usage:
        return None
    if not args.node_name:
        raise UsageError("--pod-usage needs --node-name (or $NODE_NAME)")
    if not args.proc_root.is_dir():
        raise UsageError(f"--proc-root {args.proc_root}: no such folder")
    lister = lister_for_node(
        (core or core_api)(args.kubeconfig, "--pod-usage needs"), args.node_name
    )
    return PodUsageEnricher(ProcReader(args.proc_root), PodDirectory(lister))


# --- pods on failed GPUs ----------------------------------------------------------------------


def build_remediation(
    args: argparse.Namespace, pods: PodResourcesWatcher | None, health: CheckerAndPublishers
) -> Any:
    """The opt-in PodRemediator (exporter/remediation/) for --pod-condition / --evict-pods, or
    None; UsageError naming the flag on settings it cannot run with."""
    if args.evict_dry_run and not args.evict_pods:
        raise UsageError("--evict-dry-run only makes sense with --evict-pods")
    if not (args.pod_condition or args.evict_pods):
        return None
    if pods is None:
        raise UsageError(
            "--pod-condition/--evict-pods need pod attribution (a --pod-resources-socket): "
            "it says which pods hold which GPU"
        )
    from gpuquota.exporter.remediation.remediator import PodRemediator, RemediationConfig

    config = RemediationConfig(
        condition=args.pod_condition,
        evict=args.evict_pods,
        dry_run=args.evict_dry_run,
        max_evictions=args.evict_max,
        window_s=args.evict_window,
        after_s=args.evict_after,
    )
    remediator = PodRemediator(
        kube_api(args.kubeconfig, "--pod-condition/--evict-pods need"),
        pods.mapping,
        health.checker.board.verdict,
        config,
    )
    health.checker.add_listener(remediator)
    return remediator


# --- the usage ledger's counters --------------------------------------------------------------


def build_ledger(
    args: argparse.Namespace,
    pods: PodResourcesWatcher | None,
    pod_usage: PodUsageEnricher | None,
    dra: DraParts | None,
) -> LedgerEnricher | None:
    """The usage counters (issue 19): on with pod attribution (holders) and --pod-usage (its
    pod directory names each pod's UID, its per-process usage splits shared GPUs); claim
    UIDs come from the DRA claim reader. None otherwise (said once)."""
    if pods is None:
        return None
    if pod_usage is None:
        log.info(
            "usage counters (gpu_pod_used_seconds_total, gpu_pod_energy_joules_total...) are "
            "off: they need --pod-usage, whose pod directory names the pods' UIDs"
        )
        return None
    directory = pod_usage.directory
    pod_uids: UidSource | None = directory if isinstance(directory, PodDirectory) else None
    claim_uids = dra.attribution.admin if dra is not None else None
    config = LedgerConfig(max_gap_s=max(60.0, 10 * args.interval))
    return LedgerEnricher(pod_uids, claim_uids, config)


# --- the whole program -----------------------------------------------------------------------


@dataclass
class App:
    """Every part of a running exporter; ``start`` and ``stop`` in the flow's order."""

    api: NvmlApi
    collector: CollectLoop
    xid: XidWatcher
    health: CheckerAndPublishers
    server: ExporterServer
    dra: DraParts | None = None
    pods: PodResourcesWatcher | None = None
    pod_usage: PodUsageEnricher | None = None
    ledger: LedgerEnricher | None = None
    remediation: Any = None  # exporter/remediation/remediator.PodRemediator
    _started: list[Any] = field(default_factory=list)

    def publisher_status(self) -> PublisherStatus:
        """The publishers' own state of this moment, rendered beside the verdict."""
        manager = self.health.plugin_manager
        taints = self.dra.taints if self.dra is not None else None
        writers = [w for w in (self.health.node_status, taints, self.remediation) if w is not None]
        return PublisherStatus(
            device_plugin=manager.registrations() if manager is not None else None,
            api_writers={w.name: w.status() for w in writers},
            dra_taint_rules=taints.published if taints is not None else None,
            dra_taint_errors_total=taints.errors_total if taints is not None else None,
        )

    def start(self) -> None:
        """The XID thread and the checker first, then the publishers and the enrichers'
        threads (pod attribution before the first collection, so it is attributed), then
        the loop and the server."""
        health, dra = self.health, self.dra
        parts: list[Any] = [self.xid, health.checker, health.node_status, health.plugin_manager]
        if dra is not None:
            parts += [dra.attribution.admin, dra.watcher, dra.taints]
        parts += [self.pods, self.remediation, self.pod_usage, self.collector, self.server]
        for part in parts:
            if part is not None:
                part.start()
                self._started.append(part)

    def stop(self) -> None:
        """The server first (no scrape sees a half-stopped exporter), the rest in reverse."""
        order: list[Any] = [self.server, self.health.plugin_manager, self.health.checker]
        order += [self.health.node_status]
        if self.dra is not None:
            order += [self.dra.taints, self.dra.watcher, self.dra.attribution.admin]
        order += [self.collector, self.remediation, self.pods, self.pod_usage, self.xid]
        for part in order:
            if part is not None and any(part is p for p in self._started):
                began = time.monotonic()
                part.stop()
                log.debug("stopped %s in %.2fs", type(part).__name__, time.monotonic() - began)
        self._started.clear()
        self.api.shutdown()


def build(args: argparse.Namespace) -> App:
    """The whole exporter from its parsed flags, nothing started; NVML is initialised and
    shut down again when a later part cannot be built."""
    compat = frozenset().union(*args.compat) if args.compat else frozenset()
    # the node label: the node's name in Kubernetes, else this host's (as the collector's)
    node = args.node_name or args.hostname or os.environ.get("NODE_NAME") or socket.gethostname()
    renderer = Renderer(RenderOptions(compat=compat, pod_labels=args.pod_labels, node=node))
    web_config: ReloadingWebConfig | None = None
    if args.web_config_file:
        try:
            web_config = ReloadingWebConfig(args.web_config_file)
        except WebConfigError as exc:
            raise UsageError(str(exc)) from None
    if args.slow_interval is not None and args.slow_interval < args.interval:
        raise UsageError(
            f"--slow-interval {format_duration(args.slow_interval)} is shorter than "
            f"--interval {format_duration(args.interval)}"
        )
    liveness = liveness_timeout(args.liveness_timeout, args.interval)
    api = NvmlApi()
    start_nvml(api)
    try:
        return _build_on(api, args, renderer, web_config, liveness)
    except BaseException:
        api.shutdown()
        raise


def _build_on(
    api: NvmlApi,
    args: argparse.Namespace,
    renderer: Renderer,
    web_config: ReloadingWebConfig | None,
    liveness: float,
) -> App:
    collector = CollectLoop(
        api,
        interval=args.interval,
        slow_interval=args.slow_interval,
        hostname=args.hostname or os.environ.get("NODE_NAME") or socket.gethostname(),
    )
    xid = XidWatcher(api)
    collector.xid = xid
    health = build_health(
        args, topology=CachedTopology(lambda: read_interconnect(api)), hostname=collector.hostname
    )
    dra = build_dra(args)  # after health: its errors are reported first
    pods = None
    if args.pod_resources_socket:
        pods = PodResourcesWatcher(
            Path(args.pod_resources_socket),
            interval=args.pod_resources_interval,
            dra=dra.attribution if dra is not None else None,
        )
        collector.add_enricher(pods.enrich)
    remediation = build_remediation(args, pods, health)
    pod_usage = build_pod_usage(args)  # after pod attribution: it reads the same processes
    if pod_usage is not None:
        collector.add_enricher(pod_usage)
    ledger = build_ledger(args, pods, pod_usage, dra)  # last: it reads both
    if ledger is not None:
        collector.add_enricher(ledger)
    host, port = args.listen
    try:
        server = ExporterServer(
            collector,
            renderer,
            host=host,
            port=port,
            web_config=web_config,
            liveness_timeout=liveness,
        )
    except OSError as exc:
        where = f"{host or '*'}:{port}"
        if exc.errno == errno.EADDRINUSE:
            raise SetupError(f"cannot listen on {where}: the port is already in use") from None
        raise SetupError(f"cannot listen on {where}: {exc.strerror}") from None
    app = App(api, collector, xid, health, server, dra, pods, pod_usage, ledger, remediation)
    # the checker's inputs: every snapshot and every XID event
    collector.subscribe(health.checker.on_snapshot)
    xid.add_listener(health.checker.on_xid)
    if dra is not None and dra.taints is not None:
        health.checker.add_listener(dra.taints)
        dra.taints.on_fences = health.checker.restore  # our rules of the last run, at start
    # what a scrape reads beside the snapshot: the verdict and the publishers' own state
    for path in HEALTH_ROUTES:
        server.add_route(path, health.route.json_route)
    server.source.set_verdict_source(health.checker.board.verdict)
    server.source.set_publisher_source(app.publisher_status)
    return app


def liveness_timeout(value: float | Multiple | None, interval: float) -> float:
    """--liveness-timeout in seconds; it must leave room for the readiness limit."""
    if value is None:
        return default_liveness_timeout(interval)
    seconds = value.of(interval) if isinstance(value, Multiple) else value
    shortest = READY_AFTER_INTERVALS * interval
    if seconds < shortest:
        raise UsageError(
            f"--liveness-timeout {format_duration(seconds)} is shorter than "
            f"{READY_AFTER_INTERVALS} x --interval ({format_duration(shortest)}): "
            "the exporter would be restarted between two healthy collections"
        )
    return seconds


def start_nvml(api: NvmlApi) -> None:
    """nvmlInit and check there is a GPU, turning failures into one clear message."""
    try:
        api.init()
    except NvmlError as exc:
        if exc.code == LIBRARY_NOT_FOUND:
            raise SetupError(NO_LIBRARY) from None
        if exc.code == DRIVER_NOT_LOADED:
            raise SetupError(
                "NVML is installed but the NVIDIA kernel driver is not loaded on this node"
            ) from None
        raise SetupError(f"NVML failed to initialise: {exc.message}") from None
    try:
        count = api.device_count()
    except NvmlError as exc:
        api.shutdown()
        raise SetupError(f"NVML cannot count GPUs: {exc.message}") from None
    if count == 0:
        api.shutdown()
        raise SetupError("NVML reports no GPUs on this node; nothing to export")


# --- the Kubernetes API, for the flags that need it ------------------------------------------


def kube_api(
    kubeconfig: Path | None,
    needed_by: str = "--node-taint/--node-condition need",
    field_selectors: dict[str, str] | None = None,
) -> Any:
    """A gpuquota.kube.client.Kube (raw JSON calls); ``needed_by`` ("--dra needs") starts the
    error's message."""
    from gpuquota.kube.client import Kube
    from gpuquota.kube.rest import KubeConfigError, load

    try:
        config = load(str(kubeconfig) if kubeconfig else None)
    except KubeConfigError as exc:
        raise KubeConfigUnavailableError(f"{needed_by} the Kubernetes API: {exc}") from None
    return Kube(config, field_selectors=field_selectors or {})


def core_api(kubeconfig: Path | None, needed_by: str = "--pod-usage needs") -> Any:
    """The Kubernetes API for --pod-usage's pod list: a gpuquota.kube.client.Kube (raw JSON,
    no generated models); ``needed_by`` as for kube_api. A list answers within 10 s or is
    tried again on the directory's next turn."""
    from gpuquota.kube.client import Timeouts

    kube = kube_api(kubeconfig, needed_by)
    kube.timeouts = Timeouts(read=10.0)
    return kube
