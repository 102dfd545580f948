"""``gpu-exporter``: the per-node agent's command line.

Wires collect -> enrich -> render: NVML (NvmlApi) -> Collector (+ XidWatcher) -> enrichers ->
Renderer -> ExporterServer. Every problem the exporter cannot run with (a bad flag, a bad web
config, the port in use, no NVML library, no GPUs) ends it with one line on stderr naming the
problem and a non-zero exit status: 2 for bad input, 1 for the environment.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from gpuquota.cli_common import exitcodes
from gpuquota.cli_common.commandline import OneLineParser, add_version
from gpuquota.cli_common.durations import (
    Multiple,
    duration_flag,
    duration_or_multiple_flag,
    format_duration,
)
from gpuquota.exporter.collect.loop import CollectLoop as Collector
from gpuquota.exporter.collect.nvml import DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND, NvmlApi, NvmlError
from gpuquota.exporter.collect.xid import XidWatcher
from gpuquota.exporter.deviceplugin.nvmltopology import CachedTopology
from gpuquota.exporter.dra import service as dra_service
from gpuquota.exporter.enrich import podusage
from gpuquota.exporter.enrich.podresources import DEFAULT_SOCKET, PodResourcesWatcher
from gpuquota.exporter.expose import metrics
from gpuquota.exporter.expose.render import Renderer, RenderOptions
from gpuquota.exporter.expose.server import (
    READY_AFTER_INTERVALS,
    ExporterServer,
    default_liveness_timeout,
)
from gpuquota.exporter.expose.webconfig import ReloadingWebConfig, WebConfigError
from gpuquota.exporter.wiring import HealthWiring, KubeConfigUnavailableError, core_api
from gpuquota.exporter.wiring import add_arguments as add_health_arguments

log = logging.getLogger("gpu-exporter")

PROG = "gpu-exporter"
MIN_INTERVAL_S = 0.1
SWITCH_INTERVAL_S = 0.0005

NO_LIBRARY = (
    "cannot load libnvidia-ml.so.1 (NVML): install the NVIDIA driver; on a GPU node in "
    "Kubernetes, mount the driver into the container (NVIDIA container toolkit / GPU "
    "operator); for the demo, `make demo` builds the NVML stand-in "
    "(build/sim/libnvidia-ml.so.1) and runs against it"
)


EXAMPLES = """\
examples:
  gpu-exporter                                   # :9400, NVML read every 1s, pods from the kubelet
  gpu-exporter --listen 127.0.0.1:9400 --interval 500ms --pod-labels
  gpu-exporter --compat dcgm --web.config.file /etc/gpu-exporter/web.yaml
  gpu-exporter --node-condition --node-taint --node-name "$NODE_NAME"
  gpu-exporter --dra on --dra-device-taints --node-name "$NODE_NAME"   # a DRA node
  gpu-exporter --pod-usage --node-name "$NODE_NAME"   # per-pod GPU use (needs hostPID)
  eval "$(python -m gpuquota.sim.nvml /tmp/node.state env)"; gpu-exporter --pod-resources-socket ''
                                                 # against the NVML stand-in (docs/sim.md)

durations: 500ms, 5s, 2m, 1h30m, 7d, or a bare number of seconds.
""" + exitcodes.help_text()


class UsageError(Exception):
    """Bad input on the command line or in a file it names (exit 2)."""


class SetupError(Exception):
    """The machine cannot run the exporter as asked (exit 1)."""


def parse_listen(text: str) -> tuple[str, int]:
    """':9400', '0.0.0.0:9400', '[::]:9400', 'localhost:0' -> (host, port)."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise argparse.ArgumentTypeError(
            f"invalid listen address {text!r} (use [host]:port, e.g. :9400)"
        )
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port_text)


def parse_compat(text: str) -> frozenset[str]:
    modes = frozenset(part.strip() for part in text.split(",") if part.strip())
    unknown = sorted(modes - metrics.COMPAT_MODES)
    if unknown or not modes:
        raise argparse.ArgumentTypeError(
            f"invalid compat mode {text!r} (choose from {', '.join(sorted(metrics.COMPAT_MODES))})"
        )
    return modes


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=PROG,
        description="Per-node GPU exporter: NVML metrics for Prometheus, with pod attribution.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_version(parser)
    parser.add_argument(
        "--listen",
        type=parse_listen,
        default=("", 9400),
        metavar="[HOST]:PORT",
        help="address to serve /metrics on (default :9400)",
    )
    parser.add_argument(
        "--interval",
        type=duration_flag(minimum=MIN_INTERVAL_S),
        default=1.0,
        metavar="DURATION",
        help="how often NVML is read, e.g. 1s, 500ms (default 1s)",
    )
    parser.add_argument(
        "--slow-interval",
        type=duration_flag(minimum=MIN_INTERVAL_S),
        default=None,
        metavar="DURATION",
        help="how often the slow tier is read: ECC, row remapping, retired pages, processes, "
        "energy and throttle-time counters (default 5 x --interval; docs/metrics.md says "
        "each metric's tier)",
    )
    parser.add_argument(
        "--liveness-timeout",
        type=duration_or_multiple_flag(),
        default=None,
        metavar="DURATION|Nx",
        help="/healthz fails (so the kubelet restarts the exporter) when no collection has "
        "finished for this long, e.g. 30s or 10x (ten intervals); default 10x, at least 10s",
    )
    parser.add_argument(
        "--compat",
        type=parse_compat,
        action="append",
        default=[],
        metavar="MODE",
        help="also emit another exporter's metric names; 'dcgm' = dcgm-exporter's defaults",
    )
    parser.add_argument(
        "--pod-labels",
        action="store_true",
        help="put namespace/pod/container on every per-GPU series (one series per holder)",
    )
    parser.add_argument(
        "--web.config.file",
        dest="web_config_file",
        metavar="PATH",
        help="exporter-toolkit web config (TLS, basic auth)",
    )
    parser.add_argument(
        "--hostname",
        default=None,
        help="node name for the Hostname label of --compat dcgm (default: $NODE_NAME, as the "
        "downward API sets it, else this host's name)",
    )
    add_health_arguments(parser)
    dra_service.add_arguments(parser)
    podusage.add_arguments(parser)
    parser.add_argument(
        "--pod-resources-socket",
        default=str(DEFAULT_SOCKET),
        metavar="PATH",
        help="kubelet pod-resources API socket for pod attribution; '' turns attribution off "
        f"(default {DEFAULT_SOCKET})",
    )
    parser.add_argument(
        "--pod-resources-interval",
        type=duration_flag(minimum=MIN_INTERVAL_S),
        default=5.0,
        metavar="DURATION",
        help="how often the kubelet is asked which pods hold which GPUs (default 5s)",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log verbosity (default info)",
    )
    return parser


def _fail(message: str, status: int) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # The event loop answering scrapes gives up the GIL on every socket call and must win it
    # back from the collect thread, which reads NVML and renders: Python's default 5 ms
    # switch interval then lands in the scrape latency (bench/scrape.py: p99 about halved).
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return run(args)
    except UsageError as exc:
        return _fail(str(exc), 2)
    except SetupError as exc:
        return _fail(str(exc), 1)


def run(args: argparse.Namespace) -> int:
    compat = frozenset().union(*args.compat) if args.compat else frozenset()
    renderer = Renderer(RenderOptions(compat=compat, pod_labels=args.pod_labels))
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
    collector = Collector(
        api,
        interval=args.interval,
        slow_interval=args.slow_interval,
        hostname=args.hostname or os.environ.get("NODE_NAME") or socket.gethostname(),
    )
    xid = XidWatcher(api)
    collector.xid = xid
    try:
        health = HealthWiring.from_args(
            args, topology=CachedTopology(api), hostname=collector.hostname
        )
    except ValueError as exc:
        api.shutdown()
        raise UsageError(str(exc)) from None
    except KubeConfigUnavailableError as exc:
        api.shutdown()
        raise SetupError(str(exc)) from None
    # after health: its errors (the node-status flags' API access) are reported first
    try:
        dra = dra_service.DraService.from_args(args)
    except ValueError as exc:
        api.shutdown()
        raise UsageError(str(exc)) from None
    except dra_service.DraKubeConfigError as exc:
        api.shutdown()
        raise SetupError(str(exc)) from None
    pods: PodResourcesWatcher | None = None
    if args.pod_resources_socket:
        pods = PodResourcesWatcher(
            Path(args.pod_resources_socket),
            interval=args.pod_resources_interval,
            dra=dra.attribution if dra is not None else None,
        )
        collector.add_enricher(pods.enrich)
    try:  # after pod attribution: per-pod usage reads the same round's processes
        pod_usage = podusage.from_args(args, core_api)
    except ValueError as exc:
        api.shutdown()
        raise UsageError(str(exc)) from None
    except KubeConfigUnavailableError as exc:
        api.shutdown()
        reason = str(exc).partition(": ")[2]
        raise SetupError(f"--pod-usage needs the Kubernetes API: {reason}") from None
    if pod_usage is not None:
        collector.add_enricher(pod_usage)
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
        api.shutdown()
        where = f"{host or '*'}:{port}"
        if exc.errno == errno.EADDRINUSE:
            raise SetupError(f"cannot listen on {where}: the port is already in use") from None
        raise SetupError(f"cannot listen on {where}: {exc.strerror}") from None

    health.attach(collector, xid, server)
    if health.plugin_manager is not None:  # its kubelet registration, for an alert
        collector.add_enricher(health.plugin_manager.enrich)
    if dra is not None:
        dra.attach(health.service.checker)
    for writer in (health.node_status, dra.publisher if dra is not None else None):
        if writer is not None:  # its API writes (failures, last success) as metrics
            collector.add_enricher(writer.enrich)

    stopping = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    xid.start()
    health.start()
    if dra is not None:
        dra.start()
    if pods is not None:
        pods.start()  # before the first collection, so it is attributed
    if pod_usage is not None:
        pod_usage.start()
    collector.start()
    server.start()
    bound_host, bound_port = server.address
    log.info(
        "serving %s://%s:%d/metrics for %d GPU(s), collecting every %s",
        server.scheme,
        bound_host or "*",
        bound_port,
        api.device_count(),
        format_duration(collector.interval),
    )
    try:
        stopping.wait()
    finally:
        server.stop()
        health.stop()
        if dra is not None:
            dra.stop()
        collector.stop()
        if pods is not None:
            pods.stop()
        if pod_usage is not None:
            pod_usage.stop()
        xid.stop()
        api.shutdown()
    return 0


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


if __name__ == "__main__":
    sys.exit(main())
