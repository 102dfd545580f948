"""`gpuquota remediate`: act centrally on the pods of GPUs the node agents fenced (off by default).

The node agents decide (their Node condition and taint, their DeviceTaintRules); this one
component, with its own ServiceAccount (deploy/components/remediation), marks the pods holding
a GPU that needs a reset or a reboot with the condition GPUUnhealthy (--condition) and evicts
them through the Eviction API (--evict): each checked again just before (same UID, same node,
still holding the fenced device), with the UID as the eviction's precondition; at most
--evict-max evictions per --evict-window across the cluster, counted in the store so it holds
across restarts; nothing at all while more than --breaker-share of the GPU nodes report at
once. Every act is a row in the store (`gpuquota gpus --serial S` shows them) and an Event
on the pod. --dry-run asks the API server what it would do (dryRun=All) and changes nothing.
With --lease-name, replicas elect the one that acts through a coordination.k8s.io Lease, as
the controller's do (gpuquota/kube/leader.py); a dry run elects through a Lease of its own,
the name with ``-dry-run`` added, so a preview never takes turns with the real remediation.
docs/health.md, "Pods on a failed GPU".
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from dataclasses import replace
from fractions import Fraction
from types import FrameType

from prometheus_client import start_http_server

from gpuquota.cli_common import exitcodes
from gpuquota.cli_common.durations import duration_flag, format_duration
from gpuquota.cli_common.ratios import ratio_flag
from gpuquota.kube import client as kubeapi
from gpuquota.kube import rest
from gpuquota.kube.client import Kube, Timeouts
from gpuquota.kube.leader import LeaseSettings, check, elect
from gpuquota.quota.options import (
    add_cluster_option,
    add_db_option,
    add_kube_options,
    add_lease_options,
    lease_settings,
    port_number,
)
from gpuquota.quota.remediation.metrics import RemediationMetrics
from gpuquota.quota.remediation.record import Ledger
from gpuquota.quota.remediation.remediator import NotLeadingError, Remediator, Settings
from gpuquota.quota.remediation.rules import Breaker
from gpuquota.quota.store.db import open_store
from gpuquota.quota.store.vocabulary import MAX_EVICT_WINDOW_S

log = logging.getLogger(__name__)

MAX_EVICTIONS = 10_000  # per window, fleet-wide: more is no limit at all, and a typo
LEASE_ENV = "GPUQUOTA_REMEDIATE_LEASE_NAME"  # not the controller's: the two never share one
# a dry run's Lease is the name with this added: were it the real replicas' own, a preview
# holding it would stop the real remediation (and a real replica never takes such a name)
DRY_RUN_LEASE_SUFFIX = "-dry-run"
EVICT_DEFAULTS = {"evict_max": 1, "evict_window": 600.0, "evict_after": 60.0}
EVICT_FLAGS = {"evict_max": "--evict-max", "evict_window": "--evict-window",
               "evict_after": "--evict-after"}  # fmt: skip

EXAMPLES = """\
examples:
  gpuquota remediate --db postgresql+psycopg://gpuquota@db/gpuquota --condition
  gpuquota remediate --condition --evict --evict-max 2 --evict-window 30m
  gpuquota remediate --evict --dry-run --once     # what would the API server say now?
  gpuquota remediate --condition --lease-name gpuquota-remediate --lease-namespace gpuquota

durations: 500ms, 5s, 2m, 1h30m, 7d, or a bare number of seconds.
""" + exitcodes.help_text()


class UsageError(ValueError):
    """Settings that do nothing, or cannot be right: exit 2."""


def _count(text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= MAX_EVICTIONS:
        raise argparse.ArgumentTypeError(f"{text!r}: give 1 to {MAX_EVICTIONS}")
    return value


def _nodes(text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= 1_000_000:
        raise argparse.ArgumentTypeError(f"{text!r}: give 1 to 1000000")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EXAMPLES
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_kube_options(parser)
    add_db_option(parser)
    add_cluster_option(parser)
    what = parser.add_argument_group("what to do (nothing unless asked)")
    what.add_argument(
        "--condition",
        action="store_true",
        help="set the pod condition GPUUnhealthy on pods holding a GPU that needs a reset or "
        "reboot, and clear it once the fence lifts",
    )
    what.add_argument(
        "--evict",
        action="store_true",
        help="evict those pods through the Eviction API (PodDisruptionBudgets honoured)",
    )
    what.add_argument(
        "--dry-run",
        action="store_true",
        help="decide, ask the API server what it would do (dryRun=All: admission, "
        "preconditions, PodDisruptionBudgets) and record its answer (store rows, log lines, "
        "an eviction budget of its own); change nothing in the cluster and write no Event. "
        f"Elects through the Lease --lease-name plus {DRY_RUN_LEASE_SUFFIX}",
    )
    evict = parser.add_argument_group("eviction (with --evict)")
    evict.add_argument(
        "--evict-max",
        type=_count,
        metavar="N",
        help=f"evictions per --evict-window across the cluster, 1 to {MAX_EVICTIONS} (default 1)",
    )
    evict.add_argument(
        "--evict-window",
        type=duration_flag(),
        metavar="DURATION",
        help="the sliding window of --evict-max, at most "
        f"{format_duration(MAX_EVICT_WINDOW_S)} (default 10m)",
    )
    evict.add_argument(
        "--evict-after",
        type=duration_flag(minimum=0.0),
        metavar="DURATION",
        help="evict only once the GPU has been fenced this long (default 1m)",
    )
    breaker = parser.add_argument_group("circuit breaker")
    breaker.add_argument(
        "--breaker-share",
        type=ratio_flag(),
        default=Fraction(1, 5),
        metavar="RATIO",
        help="stop every action while more than this share of the GPU nodes report unhealthy "
        "GPUs at once (default 20%%)",
    )
    breaker.add_argument(
        "--breaker-min-nodes",
        type=_nodes,
        default=2,
        metavar="N",
        help="...and at least this many (default 2: one node alone never trips it)",
    )
    run_group = parser.add_argument_group("running")
    run_group.add_argument(
        "--interval",
        type=duration_flag(minimum=0.1),
        default=10.0,
        metavar="DURATION",
        help="time between rounds (default 10s)",
    )
    run_group.add_argument("--once", action="store_true", help="one round, then exit")
    run_group.add_argument(
        "--metrics-port",
        type=port_number,
        default=9403,
        help="Prometheus metrics port; 0 turns them off (9403)",
    )
    run_group.add_argument(
        "--metrics-address", default="0.0.0.0", help="address the metrics server binds (0.0.0.0)"
    )
    add_lease_options(parser, LEASE_ENV)  # replicas elect the one that acts, as the controller's


def settings_of(args: argparse.Namespace) -> Settings:
    """The settings, or UsageError for flags that would do nothing or cannot hold."""
    if not (args.condition or args.evict):
        raise UsageError(
            "nothing to do: give --condition (mark pods on fenced GPUs), --evict (evict them), "
            "or both"
        )
    given = [EVICT_FLAGS[k] for k in EVICT_DEFAULTS if getattr(args, k) is not None]
    if given and not args.evict:
        raise UsageError(f"{', '.join(given)} only make(s) sense with --evict")
    try:
        breaker = Breaker(args.breaker_share, args.breaker_min_nodes)
    except ValueError as exc:
        raise UsageError(f"--breaker-share: {exc}") from None
    value = {
        k: d if getattr(args, k) is None else getattr(args, k) for k, d in EVICT_DEFAULTS.items()
    }
    if value["evict_window"] > MAX_EVICT_WINDOW_S:  # db prune keeps this much: no more
        raise UsageError(
            f"--evict-window: at most {format_duration(MAX_EVICT_WINDOW_S)} (`gpuquota db "
            "prune` keeps the eviction rows of that long, and no longer window could be kept)"
        )
    if args.lease_name and (problem := check(lease_settings(args))):
        raise UsageError(problem)
    if args.lease_name.endswith(DRY_RUN_LEASE_SUFFIX) and not args.dry_run:
        raise UsageError(
            f"--lease-name {args.lease_name}: a name ending in {DRY_RUN_LEASE_SUFFIX} is a dry "
            "run's Lease (--dry-run adds it to the name given); give the real replicas' name"
        )
    return Settings(
        condition=args.condition,
        evict=args.evict,
        dry_run=args.dry_run,
        max_evictions=int(value["evict_max"]),
        window_s=float(value["evict_window"]),
        after_s=float(value["evict_after"]),
        breaker=breaker,
        instance=args.identity,
    )


def lease_of(args: argparse.Namespace) -> LeaseSettings:
    """The Lease this instance elects through: a dry run's is a Lease of its own."""
    lease = lease_settings(args)
    if args.dry_run and lease.name:
        return replace(lease, name=lease.name + DRY_RUN_LEASE_SUFFIX)
    return lease


def _fail(message: str, status: int = exitcodes.BAD_INPUT) -> int:
    print(f"gpuquota remediate: error: {message}", file=sys.stderr)
    return status


def run(args: argparse.Namespace) -> int:
    try:
        settings = settings_of(args)
    except UsageError as exc:
        return _fail(str(exc))
    try:
        api = rest.load(args.kubeconfig, args.context)
        if args.lease_name:  # the election's Lease lock uses the official client's default
            kubeapi.load(args.kubeconfig, args.context)
    except (rest.KubeConfigError, kubeapi.KubeConfigError) as exc:
        return _fail(str(exc))
    store = open_store(args.db)  # StoreError: one line from gpuquota.quota.cli
    metrics = RemediationMetrics()
    if args.metrics_port:
        try:
            start_http_server(args.metrics_port, args.metrics_address, registry=metrics.registry)
        except OSError as exc:
            store.close()
            return _fail(
                f"metrics port {args.metrics_address}:{args.metrics_port}: {exc.strerror or exc}"
            )
    kube = Kube(api, Timeouts())
    lease = lease_of(args)
    stopping = threading.Event()  # a signal, or the Lease lost: no round starts
    leading = threading.Event()  # set while this replica holds the Lease (always without one)
    done = threading.Event()
    outcome = {"code": exitcodes.OK}

    def lead() -> None:
        """The rounds, while this replica leads: a fresh Remediator, so that what it knows
        comes from the store (the previous leader's rows), never from an earlier term."""
        leading.set()
        metrics.leader.set(1)
        remediator = Remediator(
            kube, Ledger(store, args.cluster), settings, metrics,
            may_act=lambda: leading.is_set() and not stopping.is_set(),
        )  # fmt: skip
        try:
            while not stopping.is_set():
                try:
                    remediator.round()
                except NotLeadingError as exc:
                    log.warning("%s", exc)
                    break
                except Exception as exc:  # the API server or the store failed: next round
                    metrics.round_errors.inc()
                    log.error("round failed: %s", exc)
                    if args.once:
                        outcome["code"] = exitcodes.ENVIRONMENT
                        break
                if args.once:
                    break
                stopping.wait(args.interval)
        finally:
            metrics.leader.set(0)
            done.set()

    def lost() -> None:
        leading.clear()  # before anything else: the round in flight writes nothing more
        if not stopping.is_set():
            log.error(
                "lost the lease %s/%s: stopping so as not to act beside a new leader",
                lease.namespace, lease.name,
            )  # fmt: skip
            outcome["code"] = exitcodes.ENVIRONMENT
        stopping.set()
        done.set()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        stopping.set()
        if not leading.is_set():
            done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info(
        "remediating pods on fenced GPUs: condition %s, evict %s%s, at most %d per %.0fs%s",
        settings.condition, settings.evict, " (dry run)" if settings.dry_run else "",
        settings.max_evictions, settings.window_s,
        f", electing through the Lease {lease.namespace}/{lease.name}" if lease.name else "",
    )  # fmt: skip
    if args.lease_name:
        elect(lease, lead, lost)
    else:
        threading.Thread(target=lead, name="remediate", daemon=True).start()
    while not done.wait(0.5):
        pass
    stopping.set()
    code = outcome["code"]
    if args.lease_name:
        # the election's renew thread cannot be stopped (as the controller's); a round still
        # in flight may be inside a store call: leave without waiting for either
        store.close()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    store.close()
    return code
