"""`gpuquota controller`: watch pods, quotas, namespaces and nodes; keep GPU use in the store.

Lists and watches the Kubernetes API (kubeconfig or in-cluster), applies every event through
the accounting rules, and writes allocation intervals, node capacity, namespace labels and
quota samples to the store in batches. With --lease-name, replicas elect one writer through a
coordination.k8s.io Lease. Metrics on --metrics-port.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from fractions import Fraction
from types import FrameType
from typing import Any

from prometheus_client import start_http_server

from gpuquota.cli_common import exitcodes
from gpuquota.cli_common.durations import duration_flag, whole_seconds_flag
from gpuquota.cli_common.ratios import ratio_flag
from gpuquota.kube import client as kubeapi
from gpuquota.kube.leader import check, elect
from gpuquota.quota.accounting.accountant import Accountant
from gpuquota.quota.accounting.rules.pods import raw_prefilter
from gpuquota.quota.controller.loop import Controller, Settings, StartupError
from gpuquota.quota.controller.metrics import ControllerMetrics
from gpuquota.quota.fleet.ingest import turn as fleet_turn
from gpuquota.quota.ledger.ingest import LedgerProcess, LedgerSettings, catch_up_warning
from gpuquota.quota.ledger.ingest import check as check_ledger
from gpuquota.quota.options import (
    accounting_options,
    add_accounting_options,
    add_cluster_option,
    add_db_option,
    add_kube_options,
    add_lease_options,
    add_prometheus_cluster_label_option,
    lease_settings,
    port_number,
)
from gpuquota.quota.promhttp import PrometheusError, check_url
from gpuquota.quota.store.db import StoreError, StoreUnavailableError, open_store

log = logging.getLogger(__name__)

EXIT_ERROR = exitcodes.BAD_INPUT
EXIT_LOST_LEASE = exitcodes.ENVIRONMENT
EXIT_UNAVAILABLE = exitcodes.ENVIRONMENT  # the API server or the database does not answer


EXAMPLES = """\
examples:
  gpuquota controller --kubeconfig ~/.kube/config --db sqlite:///gpuquota.db --migrate
  gpuquota controller --db postgresql+psycopg://gpuquota@db/gpuquota --cluster prod-eu1 \\
      --lease-name gpuquota-controller --lease-namespace gpuquota
  gpuquota controller --flush-interval 10s --read-timeout 2m --node-pool-label node-pool
  gpuquota controller --db sqlite:///gpuquota.db --ledger-prometheus-url http://prometheus:9090

durations: 500ms, 5s, 2m, 1h30m, 7d, or a bare number of seconds.
""" + exitcodes.help_text()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EXAMPLES
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_kube_options(parser)
    add_db_option(parser)
    add_cluster_option(parser)
    parser.add_argument(
        "--migrate", action="store_true", help="bring the store's schema up to date first"
    )
    add_lease_options(parser, "GPUQUOTA_LEASE_NAME")
    parser.add_argument(
        "--flush-interval",
        type=duration_flag(),
        default=5.0,
        metavar="DURATION",
        help="write to the store at least this often (5s)",
    )
    parser.add_argument(
        "--flush-every", type=int, default=1000, metavar="N", help="...or every N events (1000)"
    )
    parser.add_argument(
        "--metrics-port",
        type=port_number,
        default=9402,
        help="Prometheus metrics port; 0 turns them off (9402)",
    )
    parser.add_argument(
        "--metrics-address", default="0.0.0.0", help="address the metrics server binds (0.0.0.0)"
    )
    parser.add_argument(
        "--read-timeout",
        type=duration_flag(),
        default=90.0,
        metavar="DURATION",
        help="read timeout of lists and other calls (90s); a watch's is --watch-timeout plus "
        "a tenth: a quiet watch is normal, the server ends it at --watch-timeout and TCP "
        "keepalive finds a dead connection",
    )
    parser.add_argument(
        "--watch-timeout",
        type=whole_seconds_flag(),
        default=300,
        metavar="DURATION",
        help="timeoutSeconds asked of the server per watch (5m)",
    )
    parser.add_argument(
        "--startup-timeout",
        type=duration_flag(),
        default=30.0,
        metavar="DURATION",
        help="give up (exit 1) when the API server cannot be listed for this long (30s)",
    )
    parser.add_argument("--page-size", type=int, default=500, help="objects per list page (500)")
    add_accounting_options(parser)
    add_ledger_options(parser)


def add_ledger_options(parser: argparse.ArgumentParser) -> None:
    """The usage ledger's flags (docs/accounting.md, "The usage ledger")."""
    group = parser.add_argument_group(
        "usage ledger",
        "ingest the node agents' usage counters from Prometheus into the store (leader only)",
    )
    group.add_argument(
        "--ledger-prometheus-url",
        default=os.environ.get("GPUQUOTA_LEDGER_PROMETHEUS_URL", ""),
        metavar="URL",
        help="Prometheus holding the node agents' counters (env GPUQUOTA_LEDGER_PROMETHEUS_URL; "
        "default: no ledger)",
    )
    add_prometheus_cluster_label_option(group)
    seconds = whole_seconds_flag()
    group.add_argument(
        "--ledger-window",
        type=seconds,
        default=3600,
        metavar="DURATION",
        help="window length; must divide a day (1h)",
    )
    group.add_argument(
        "--ledger-delay",
        type=seconds,
        default=300,
        metavar="DURATION",
        help="ingest a window this long after it closes, for the last scrapes to land (5m)",
    )
    group.add_argument(
        "--ledger-lookback",
        type=_zero_or(seconds),
        default=3600,
        metavar="DURATION",
        help="when a window closes, ingest the windows that closed this long before it again, "
        "for late samples (1h; a multiple of --ledger-window)",
    )
    group.add_argument(
        "--ledger-backfill",
        type=seconds,
        default=7 * 86400,
        metavar="DURATION",
        help="after downtime, catch up at most this much (7d; within Prometheus' retention)",
    )
    group.add_argument(
        "--ledger-max-gap",
        type=seconds,
        default=60,
        metavar="DURATION",
        help="samples further apart than this leave the time between them uncovered (1m)",
    )
    group.add_argument(
        "--ledger-rollup-after",
        type=_never_or(_zero_or(seconds)),
        default=86400,
        metavar="DURATION",
        help="roll each day's window rows up into one row per holder and device once the "
        "day ended this long ago and is past --ledger-lookback (1d; 'never' keeps them all)",
    )
    group.add_argument(
        "--ledger-rollup-tz",
        default="UTC",
        metavar="ZONE",
        help="the time zone whose days are rolled up: the one reports are run in (their --tz), "
        "so that a month's days are whole rows (UTC; e.g. Europe/Berlin)",
    )
    group.add_argument(
        "--idle-threshold",
        type=ratio_flag(),
        default=Fraction(5, 100),
        metavar="RATIO",
        help="an allocation whose activity stays under this is idle: a ratio (0.05) or a "
        "percentage (5%%), as the report's flag (default 5%%)",
    )
    group.add_argument(
        "--idle-for",
        type=seconds,
        default=3600,
        metavar="DURATION",
        help="...for at least this long of ingested windows (1h)",
    )
    group.add_argument(
        "--relapse-within",
        type=seconds,
        default=86400,
        metavar="DURATION",
        help="fleet history: a GPU fenced again this soon after its release relapsed (1d)",
    )


def _zero_or(parse: Callable[[str], int]) -> Callable[[str], int]:
    """A duration flag that also takes 0 (none)."""

    def zero_or(text: str) -> int:
        return 0 if text.strip() in ("0", "0s") else parse(text)

    zero_or.__name__ = "duration"
    return zero_or


def _never_or(parse: Callable[[str], int]) -> Callable[[str], int | None]:
    """A duration flag that also takes 'never' (None)."""

    def never_or(text: str) -> int | None:
        return None if text.strip() == "never" else parse(text)

    never_or.__name__ = "duration"
    return never_or


def ledger_settings(args: argparse.Namespace) -> LedgerSettings | None:
    """The ledger's settings from the flags, None when it is off; ValueError naming the flag."""
    if not args.ledger_prometheus_url:
        return None
    try:
        check_url(args.ledger_prometheus_url, "--ledger-prometheus-url")
    except PrometheusError as exc:
        raise ValueError(str(exc)) from None
    settings = LedgerSettings(
        args.ledger_prometheus_url,
        window=args.ledger_window,
        delay=args.ledger_delay,
        lookback=args.ledger_lookback,
        backfill=args.ledger_backfill,
        max_gap=args.ledger_max_gap,
        idle_threshold=float(args.idle_threshold),
        idle_for=args.idle_for,
        rollup_after=args.ledger_rollup_after,
        rollup_tz=args.ledger_rollup_tz,
        relapse_within=args.relapse_within,
        cluster_label=args.prometheus_cluster_label,
    )
    problem = check_ledger(settings)
    if problem:
        raise ValueError(problem)
    many = catch_up_warning(settings)
    if many:
        log.warning("%s", many)
    return settings


def _fail(message: str, status: int = EXIT_ERROR) -> int:
    print(f"gpuquota controller: error: {message}", file=sys.stderr)
    return status


def serve_metrics(
    port: int, address: str, metrics: ControllerMetrics, readiness: Callable[[], tuple[bool, str]]
) -> None:
    """/metrics and /readyz (200 when ``readiness`` says ready, else 503 and why) on one
    port, in daemon threads."""
    httpd, _thread = start_http_server(port, address, registry=metrics.registry)
    metrics_app = httpd.get_app()
    assert metrics_app is not None

    def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/readyz":
            return metrics_app(environ, start_response)
        ready, why = readiness()
        status = "200 OK" if ready else "503 Service Unavailable"
        start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
        return [f"{why}\n".encode()]

    httpd.set_app(app)


def _reach(kube: kubeapi.Kube, timeout: float) -> str | None:
    """None once GET /version answers, else why not after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            log.info("API server %s, version %s", kube.host, kube.version())
            return None
        except Exception as exc:  # any failure to reach it: report the last one
            reason = str(getattr(exc, "reason", None) or exc).strip().splitlines()
            if time.monotonic() > deadline:
                why = reason[0] if reason else type(exc).__name__
                return f"cannot reach the Kubernetes API server at {kube.host}: {why}"
        time.sleep(0.5)


def run(args: argparse.Namespace) -> int:
    if (
        args.flush_interval <= 0
        or args.flush_every < 1
        or args.read_timeout <= 0
        or args.page_size < 1
    ):
        return _fail(
            "--flush-interval, --flush-every, --read-timeout and --page-size must be positive"
        )
    try:
        config, drivers = accounting_options(args)
        ledger = ledger_settings(args)
    except ValueError as exc:
        return _fail(str(exc))
    lease = lease_settings(args)
    if args.lease_name and (problem := check(lease)):
        return _fail(problem)
    try:
        api = kubeapi.load(args.kubeconfig, args.context)
    except kubeapi.KubeConfigError as exc:
        return _fail(str(exc))
    # StoreError: one line from gpuquota.quota.cli
    store = open_store(args.db, migrate=args.migrate)
    metrics = ControllerMetrics()
    current: list[Controller] = []
    ingesters: list[LedgerProcess] = []
    leading = threading.Event()

    def readiness() -> tuple[bool, str]:
        """Ready: a standby waiting for the lease, or a leader that knows the present (every
        kind proven current and watched); not during start-up, after a restart until every
        kind is proven, or during a relist."""
        if args.lease_name and not leading.is_set():
            return True, "standby: waiting for the lease"
        if not current:
            return False, "starting"
        lagging = current[-1].lagging()
        if current[-1].current():
            return True, "current"
        return False, "not current: " + (", ".join(lagging) or "the first lists")

    if args.metrics_port:
        try:
            serve_metrics(args.metrics_port, args.metrics_address, metrics, readiness)
        except OSError as exc:
            return _fail(
                f"metrics port {args.metrics_address}:{args.metrics_port}: {exc.strerror or exc}"
            )
        log.info(
            "metrics on http://%s:%d/metrics, readiness on /readyz",
            args.metrics_address,
            args.metrics_port,
        )
    timeouts = kubeapi.Timeouts(read=args.read_timeout, watch=args.watch_timeout)
    # pods that request no GPU and name no claim are most of a cluster: not even decoded
    prefilter = raw_prefilter(config)
    kube = kubeapi.Kube(
        api,
        timeouts,
        page_size=args.page_size,
        raw_filters={"Pod": prefilter} if prefilter else None,
    )
    settings = Settings(args.flush_every, args.flush_interval, args.startup_timeout)

    stopping = threading.Event()
    done = threading.Event()
    outcome: dict[str, object] = {}

    def lead() -> None:
        try:
            metrics.leader.set(1)
            leading.set()
            accountant = Accountant(
                store, args.cluster, config, holder=args.identity, dra_drivers=drivers
            )
            controller = Controller(kube, accountant, metrics, settings)
            current.append(controller)
            if stopping.is_set():
                return
            if ledger is not None:  # its own process and connection, beside the watch loop
                # the fleet history (issue 29) rides on the ledger's windows and process
                ingester = LedgerProcess(args.db, args.cluster, ledger, turns=(fleet_turn,))
                ingesters.append(ingester)
                metrics.ledger.read_from(lambda: ingester.facts)
                ingester.start()
            controller.run()
        except (StartupError, StoreError) as exc:
            outcome["error"] = str(exc)
            outcome["unavailable"] = isinstance(exc, (StartupError, StoreUnavailableError))
        except BaseException as exc:
            outcome["error"] = f"{type(exc).__name__}: {exc}"
            log.exception("controller failed")
        finally:
            for ingester in ingesters:
                ingester.stop()
            metrics.ledger.read_from(lambda: None)
            metrics.leader.set(0)
            leading.clear()
            done.set()

    def lost() -> None:
        if not stopping.is_set():
            log.error(
                "lost the lease %s/%s: stopping so as not to write beside a new leader",
                lease.namespace,
                lease.name,
            )
            outcome["lost"] = True
        for ingester in ingesters:  # no ledger writes beside a new leader either
            ingester.request_stop()
        for c in current:
            c.stop()
        done.set()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        stopping.set()
        for c in current:
            c.stop()
        if not current:
            done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if args.lease_name:
        # a standby never lists; make sure it can reach the API server before waiting on it
        problem = _reach(kube, args.startup_timeout)
        if problem:
            store.close()
            return _fail(problem, EXIT_UNAVAILABLE)
        elect(lease, lead, lost)
    else:
        threading.Thread(target=lead, name="controller", daemon=True).start()
    while not done.wait(0.5):
        pass
    for c in current:
        c.stop()
    store.close()
    if "error" in outcome:
        code = _fail(
            str(outcome["error"]), EXIT_UNAVAILABLE if outcome.get("unavailable") else EXIT_ERROR
        )
    else:
        code = EXIT_LOST_LEASE if outcome.get("lost") else 0
    if args.lease_name:
        # the election library's renew thread cannot be stopped; everything is written and
        # closed, so leave without waiting for it (or racing it during interpreter shutdown)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
