"""Command-line options shared by the `gpuquota` subcommands (database URL, cluster name,
node pool labels, GPU DRA drivers, TCP ports, leader election)."""

from __future__ import annotations

import argparse
import os
import re
import socket
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpuquota.cli_common.durations import whole_seconds_flag
from gpuquota.quota.accounting import DEFAULT_NODE_POOL_LABELS, AccountingConfig
from gpuquota.quota.accounting.rules.claims import DEFAULT_GPU_DRIVERS
from gpuquota.quota.store.db import DEFAULT_URL, ENV_URL

if TYPE_CHECKING:  # its module loads the Kubernetes client, which only two commands need
    from gpuquota.kube.leader import LeaseSettings

ENV_CLUSTER = "GPUQUOTA_CLUSTER"
DEFAULT_CLUSTER = "default"
ENV_NODE_POOL_LABELS = "GPUQUOTA_NODE_POOL_LABELS"
ENV_DRA_DRIVERS = "GPUQUOTA_DRA_DRIVERS"
ENV_PROMETHEUS_CLUSTER_LABEL = "GPUQUOTA_PROMETHEUS_CLUSTER_LABEL"


def add_kube_options(parser: argparse.ArgumentParser) -> None:
    """--kubeconfig and --context: how a cluster component reaches the API server."""
    parser.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig (default: in-cluster, else $KUBECONFIG or ~/.kube/config)",
    )
    parser.add_argument("--context", help="kubeconfig context (default: its current-context)")


def add_db_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        metavar="URL",
        default=os.environ.get(ENV_URL, DEFAULT_URL),
        help=f"SQLAlchemy URL of the store (env {ENV_URL}; default {DEFAULT_URL}); "
        "PostgreSQL: postgresql+psycopg://user:password@host/database",
    )


def cluster_name(text: str) -> str:
    """argparse type: a cluster name is not empty (every stored row carries it)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the cluster name is empty")
    return text


def add_cluster_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cluster",
        metavar="NAME",
        type=cluster_name,
        default=os.environ.get(ENV_CLUSTER, DEFAULT_CLUSTER),
        help=f"cluster name stored with every row (env {ENV_CLUSTER}; default {DEFAULT_CLUSTER})",
    )


def prometheus_label(text: str) -> str:
    """argparse type: a Prometheus label name, or empty (no label)."""
    from gpuquota.quota.promscope import LABEL_NAME

    if text and not LABEL_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a Prometheus label name (letters, digits and _, e.g. cluster)"
        )
    return text


def add_prometheus_cluster_label_option(parser: argparse._ActionsContainer) -> None:
    """--prometheus-cluster-label: the label telling this cluster's series from the others'
    in a Prometheus (Thanos, Mimir, VictoriaMetrics) several clusters share."""
    parser.add_argument(
        "--prometheus-cluster-label",
        metavar="LABEL",
        type=prometheus_label,
        default=os.environ.get(ENV_PROMETHEUS_CLUSTER_LABEL, ""),  # argparse checks it too
        help="the label naming the cluster in a Prometheus (Thanos, Mimir, VictoriaMetrics) "
        "several clusters share, e.g. cluster: its queries then read only the series whose "
        f"label is --cluster (env {ENV_PROMETHEUS_CLUSTER_LABEL}; default: none, every series "
        "is this cluster's)",
    )


def add_node_pool_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--node-pool-label",
        dest="node_pool_labels",
        action="append",
        metavar="LABEL",
        help="node label naming the node's pool; repeat or comma-separate for several, tried "
        f"in order before the built-in ones (env {ENV_NODE_POOL_LABELS}; built-in: "
        f"{', '.join(DEFAULT_NODE_POOL_LABELS)})",
    )


def node_pool_labels(values: Sequence[str] | None) -> tuple[str, ...]:
    """The labels to read a node's pool from, in order: the flag's (else the environment's),
    then the built-in ones. ValueError for an empty or malformed label key."""
    given = values if values else [os.environ.get(ENV_NODE_POOL_LABELS, "")]
    labels: list[str] = []
    for value in given:
        for part in value.split(","):
            label = part.strip()
            if not label:
                if value.strip():
                    raise ValueError(f"--node-pool-label: empty label in {value!r}")
                continue
            if any(c.isspace() for c in label) or label.count("/") > 1:
                raise ValueError(f"--node-pool-label: {label!r} is not a label key")
            if label not in labels:
                labels.append(label)
    return (*labels, *(k for k in DEFAULT_NODE_POOL_LABELS if k not in labels))


def add_dra_drivers_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dra-drivers",
        metavar="NAMES",
        default=None,
        help="comma-separated DRA drivers whose ResourceClaim devices are GPUs and charged "
        f"(env {ENV_DRA_DRIVERS}; default {','.join(DEFAULT_GPU_DRIVERS)})",
    )


def dra_drivers(value: str | None) -> tuple[str, ...]:
    """The GPU DRA drivers: the flag's (else the environment's, else the default). ValueError
    for an empty list or a name that is not a DNS subdomain."""
    text = value if value is not None else os.environ.get(ENV_DRA_DRIVERS)
    if text is None:
        return DEFAULT_GPU_DRIVERS
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise ValueError("--dra-drivers: no driver named")
    for name in names:
        if len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
            raise ValueError(f"--dra-drivers: {name!r} is not a driver name (a DNS subdomain)")
    return tuple(dict.fromkeys(names))


def add_accounting_options(parser: argparse.ArgumentParser) -> None:
    """--node-pool-label and --dra-drivers: what every command that accounts events is told."""
    add_node_pool_option(parser)
    add_dra_drivers_option(parser)


def accounting_options(args: argparse.Namespace) -> tuple[AccountingConfig, tuple[str, ...]]:
    """The accounting configuration and the GPU DRA drivers add_accounting_options' flags (else
    the environment) name. ValueError, naming the flag, for a malformed value."""
    config = AccountingConfig(node_pool_labels=node_pool_labels(args.node_pool_labels))
    return config, dra_drivers(args.dra_drivers)


_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def port_number(text: str) -> int:
    """argparse type: a TCP port, 0 to 65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is outside 0-65535")
    return port


def add_lease_options(parser: argparse.ArgumentParser, name_env: str) -> None:
    """--lease-name, --lease-namespace, --identity and the Lease's timings: how replicas of a
    component elect the one that acts (gpuquota/kube/leader.py). ``name_env`` is the
    environment variable that names the Lease: one per component, so that two components never
    share (and fight over) one Lease."""
    parser.add_argument(
        "--lease-name",
        default=os.environ.get(name_env, ""),
        help=f"elect one acting replica through this Lease (env {name_env}; default: no "
        "election, single replica)",
    )
    parser.add_argument(
        "--lease-namespace",
        default=os.environ.get("POD_NAMESPACE", "default"),
        help="namespace of the Lease (env POD_NAMESPACE; default default)",
    )
    parser.add_argument(
        "--identity",
        default=os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}",
        help="this replica's name in the Lease and in what it records (env POD_NAME; default "
        "host-pid)",
    )
    parser.add_argument(
        "--lease-duration",
        type=whole_seconds_flag(),
        default=15,
        metavar="DURATION",
        help="how long a standby waits before taking an unrenewed Lease (15s)",
    )
    parser.add_argument(
        "--renew-deadline",
        type=whole_seconds_flag(),
        default=10,
        metavar="DURATION",
        help="how long the leader keeps trying to renew before it stops (10s)",
    )
    parser.add_argument(
        "--retry-period",
        type=whole_seconds_flag(),
        default=2,
        metavar="DURATION",
        help="time between Lease attempts (2s)",
    )


def lease_settings(args: argparse.Namespace) -> LeaseSettings:
    """The Lease add_lease_options' flags name (its name is empty: no election)."""
    from gpuquota.kube.leader import LeaseSettings

    return LeaseSettings(
        args.lease_name,
        args.lease_namespace,
        args.identity,
        args.lease_duration,
        args.renew_deadline,
        args.retry_period,
    )
