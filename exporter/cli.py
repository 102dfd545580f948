"""``gpu-exporter``: the per-node agent's command line: its flags, parsing, start, stop, exit codes.

exporter/app.py builds the program from the parsed flags. Every problem the exporter cannot run
with (a bad flag, a bad web config, the port in use, no NVML library, no GPUs) ends it with one
line on stderr naming the problem and a non-zero exit status: 2 for bad input (``UsageError``),
1 for the environment (``SetupError``).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from gpuquota.cli_common import exitcodes
from gpuquota.cli_common.commandline import OneLineParser, add_version
from gpuquota.cli_common.durations import duration_flag, duration_or_multiple_flag, format_duration
from gpuquota.exporter import app as program
from gpuquota.exporter.app import SetupError, UsageError, liveness_timeout
from gpuquota.exporter.deviceplugin.devices import DEFAULT_PLUGIN_DIR, DEFAULT_RESOURCE
from gpuquota.exporter.dra.taintrules import EFFECTS
from gpuquota.exporter.enrich.devicecheckpoint import DEFAULT_CHECKPOINT
from gpuquota.exporter.enrich.podresources import DEFAULT_SOCKET
from gpuquota.exporter.enrich.slices import DEFAULT_DRIVERS
from gpuquota.exporter.expose import metrics
from gpuquota.exporter.nodestatus.status import TAINT_EFFECT, TAINT_EFFECTS

__all__ = ["SetupError", "UsageError", "build_parser", "liveness_timeout", "main", "run"]

log = logging.getLogger("gpu-exporter")

PROG = "gpu-exporter"
MIN_INTERVAL_S = 0.1
SWITCH_INTERVAL_S = 0.0005

EXAMPLES = """\
examples:
  gpu-exporter                                   # :9400, NVML read every 1s, pods from the kubelet
  gpu-exporter --listen 127.0.0.1:9400 --interval 500ms --pod-labels
  gpu-exporter --compat dcgm --web.config.file /etc/gpu-exporter/web.yaml
  gpu-exporter --node-condition --node-taint --node-name "$NODE_NAME"
  gpu-exporter --dra on --dra-device-taints --node-name "$NODE_NAME"   # a DRA node
  gpu-exporter --pod-usage                         # per-pod GPU use (needs hostPID)
  eval "$(python -m gpuquota.sim.nvml /tmp/node.state env)"; gpu-exporter --pod-resources-socket ''
                                                 # against the NVML stand-in (docs/sim.md)

durations: 500ms, 5s, 2m, 1h30m, 7d, or a bare number of seconds.
""" + exitcodes.help_text()


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
        "energy and throttle-time counters, and GPM's averages, which span it (default 5 x "
        "--interval; docs/metrics.md says each metric's tier)",
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
    add_remediation_arguments(parser)
    add_dra_arguments(parser)
    add_pod_usage_arguments(parser)
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
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="log debug messages (--log-level debug), and show the traceback of an unexpected "
        "error",
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
    level = "DEBUG" if args.verbose else args.log_level.upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return run(args)
    except UsageError as exc:
        return _fail(str(exc), 2)
    except SetupError as exc:
        return _fail(str(exc), 1)
    except Exception as exc:  # one line, as --help's exit status says; -v shows the traceback
        if args.verbose:
            raise
        return _fail(f"unexpected {type(exc).__name__}: {exc} (run with -v for details)", 1)


def run(args: argparse.Namespace) -> int:
    """Builds the exporter (exporter/app.py), runs it until SIGTERM or SIGINT, stops it."""
    exporter = program.build(args)
    stopping = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        exporter.start()
        bound_host, bound_port = exporter.server.address
        log.info(
            "serving %s://%s:%d/metrics for %d GPU(s), collecting every %s",
            exporter.server.scheme,
            bound_host or "*",
            bound_port,
            exporter.api.device_count(),
            format_duration(exporter.collector.interval),
        )
        stopping.wait()
    finally:
        exporter.stop()
    return 0


def _replicas(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_health_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("GPU health and kubelet device plugin (docs/health.md)")
    group.add_argument(
        "--health-config",
        type=Path,
        metavar="FILE",
        help="YAML overrides of the XID and condition tables",
    )
    group.add_argument(
        "--health-quiet-period",
        type=duration_flag(),
        metavar="DURATION",
        help="an XID or error-counter increase stops counting against a device after "
        "this long without a repeat, e.g. 5m (default 5m, or the config file's)",
    )
    group.add_argument(
        "--device-plugin",
        action="store_true",
        help="serve the kubelet device plugin API (v1beta1) with this health as its source",
    )
    group.add_argument(
        "--device-plugin-dir",
        type=Path,
        default=DEFAULT_PLUGIN_DIR,
        metavar="DIR",
        help="folder holding kubelet.sock and the plugin sockets (default %(default)s)",
    )
    group.add_argument(
        "--resource-name",
        default=DEFAULT_RESOURCE,
        help="extended resource for full GPUs (default %(default)s); MIG instances are "
        "<domain>/mig-<profile>",
    )
    group.add_argument(
        "--time-slicing-replicas",
        type=_replicas,
        default=1,
        metavar="N",
        help="advertise each full GPU N times (<UUID>::<n>) for time-slicing",
    )
    group.add_argument(
        "--cdi",
        action="store_true",
        help="Allocate answers with CDI device names (nvidia.com/gpu=<uuid>)",
    )
    group.add_argument(
        "--node-taint",
        action="store_true",
        help="taint the node gpuquota.io/gpu-unhealthy:NoSchedule while a GPU is unhealthy",
    )
    group.add_argument(
        "--node-taint-effect",
        choices=TAINT_EFFECTS,
        default=TAINT_EFFECT,
        help="effect of that taint; NoExecute also evicts the pods on the node and needs "
        "'NoExecute' in the node admission policy's allowedEffects (docs/health.md) "
        "(default %(default)s)",
    )
    group.add_argument(
        "--node-condition",
        action="store_true",
        help="set the node condition GPUUnhealthy while a GPU is unhealthy",
    )
    group.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME"),
        help="this node's name in Kubernetes (default $NODE_NAME) for --node-taint/--node-condition "
        "and --dra",
    )
    group.add_argument("--kubeconfig", type=Path, default=None,
                       help="kubeconfig for --node-taint/--node-condition and --dra (default: in-cluster config)")  # fmt: skip


# pod remediation moved to the cluster component `gpuquota remediate` (issue 35): the flags that
# turned it on in the agent are refused by name, never ignored (a silent no-op would leave pods
# on broken GPUs while the operator believes they are handled)
MOVED_FLAGS = (
    ("--pod-condition", 0),
    ("--evict-pods", 0),
    ("--evict-dry-run", 0),
    ("--evict-max", "?"),
    ("--evict-window", "?"),
    ("--evict-after", "?"),
)
MOVED_MESSAGE = (
    "{flag}: pod remediation is no longer done by the node agent, which only publishes its "
    "verdict (--node-condition, --node-taint, DeviceTaintRules): run the cluster component "
    '`gpuquota remediate` (deploy/components/remediation; docs/health.md, "Pods on a failed '
    'GPU") with --condition / --evict instead'
)


class _Moved(argparse.Action):
    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        parser.error(MOVED_MESSAGE.format(flag=option_string or self.dest))


def add_remediation_arguments(parser: argparse.ArgumentParser) -> None:
    """The agent's former pod-remediation flags, refused with where remediation went."""
    for flag, nargs in MOVED_FLAGS:
        parser.add_argument(flag, action=_Moved, nargs=nargs, help=argparse.SUPPRESS)


def add_dra_arguments(parser: argparse.ArgumentParser) -> None:
    """DRA flags; --node-name and --kubeconfig are shared with the health group."""
    group = parser.add_argument_group("Dynamic Resource Allocation (docs/operations.md)")
    group.add_argument(
        "--dra",
        choices=("auto", "on", "off"),
        default="auto",
        help="attribute GPUs held through DRA ResourceClaims by following this node's "
        "ResourceSlices; auto: when the Kubernetes API and the node name are known "
        "(default %(default)s)",
    )
    group.add_argument(
        "--dra-drivers",
        default=",".join(sorted(DEFAULT_DRIVERS)),
        metavar="NAME[,NAME]",
        help="DRA drivers whose devices are GPUs (default %(default)s)",
    )
    group.add_argument(
        "--dra-device-taints",
        action="store_true",
        help="publish the health verdict as DeviceTaintRules on unhealthy DRA devices",
    )
    group.add_argument(
        "--dra-taint-effect",
        choices=EFFECTS,
        default="NoSchedule",
        help="effect of those taints; NoExecute also evicts the pods using the device "
        "(default %(default)s)",
    )


def add_pod_usage_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("per-pod usage (needs the host PID namespace)")
    group.add_argument(
        "--pod-usage",
        action="store_true",
        help="publish SM/memory utilisation and framebuffer use per pod per GPU "
        "(gpu_pod_*): needs hostPID and pod attribution; pods are named from the kubelet's "
        "pod-resources answer and device checkpoint, with no API access to pods",
    )
    group.add_argument(
        "--device-checkpoint",
        default=str(DEFAULT_CHECKPOINT),
        metavar="PATH",
        help="the kubelet's device checkpoint, read for --pod-usage to name the pods holding "
        "device-plugin GPUs; '' names them by pod_uid only (default %(default)s)",
    )
    group.add_argument(
        "--proc-root",
        type=Path,
        default=Path("/proc"),
        metavar="PATH",
        help="where processes' cgroups are read for --pod-usage (default /proc)",
    )


if __name__ == "__main__":
    sys.exit(main())
