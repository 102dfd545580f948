"""Wires health checking and the device plugin into ``gpu-exporter``: flags, start, stop.

exporter/cli.py calls ``add_arguments(parser)`` and, once NVML, the collector, the XID watcher
and the HTTP server exist, ``HealthService.from_args(args, ...)`` then ``start()``; on the
way out ``stop()``. Everything here is glue: the rules live in exporter/health/rules.py, the
device plugin in exporter/deviceplugin/.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from exporter.deviceplugin.devices import DEFAULT_RESOURCE, PluginConfig
from exporter.deviceplugin.manager import DEFAULT_PLUGIN_DIR, DevicePluginManager
from exporter.deviceplugin.preferred import Topology
from exporter.health.checker import HealthChecker, XidLike
from exporter.health.config import HealthConfigError, load_config
from exporter.health.nodestatus import NodeStatusUpdater
from exporter.health.view import HEALTH_ROUTES, node_json
from exporter.snapshot import NodeSnapshot
from gpuquota.durations import duration_flag

log = logging.getLogger(__name__)

Response = tuple[int, str, bytes]


class _Subscribable(Protocol):
    def subscribe(self, callback: Callable[[NodeSnapshot], None]) -> None: ...


class _XidSource(Protocol):
    def add_listener(self, callback: Callable[[Any], None]) -> None: ...


class _Routes(Protocol):
    def add_route(self, path: str, route: Callable[[], Response]) -> None: ...
    def add_snapshot_view(self, view: Callable[[NodeSnapshot], NodeSnapshot]) -> None: ...


def _replicas(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
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
        "--node-condition",
        action="store_true",
        help="set the node condition GPUUnhealthy while a GPU is unhealthy",
    )
    group.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME"),
        help="this node's name in Kubernetes (default $NODE_NAME) for --node-taint/--node-condition",
    )
    group.add_argument("--kubeconfig", type=Path, default=None,
                       help="kubeconfig for --node-taint/--node-condition (default: in-cluster config)")  # fmt: skip


class HealthService:
    def __init__(
        self,
        checker: HealthChecker,
        hostname: str,
        plugin_manager: DevicePluginManager | None = None,
        node_status: NodeStatusUpdater | None = None,
    ) -> None:
        self.checker = checker
        self.hostname = hostname
        self.plugin_manager = plugin_manager
        self.node_status = node_status
        if node_status is not None:
            checker.add_listener(node_status)

    @classmethod
    def from_args(
        cls,
        args: argparse.Namespace,
        topology: Callable[[], Topology] = Topology,
        hostname: str | None = None,
    ) -> HealthService:
        """Raises ValueError (with a message naming the flag or file) on bad settings."""
        try:
            config = load_config(args.health_config, quiet_period_s=args.health_quiet_period)
        except HealthConfigError as exc:
            raise ValueError(str(exc)) from None
        checker = HealthChecker(config)
        manager = None
        if args.device_plugin:
            try:
                plugin_config = PluginConfig(
                    resource_name=args.resource_name,
                    replicas=args.time_slicing_replicas,
                    cdi=args.cdi,
                )
            except ValueError as exc:
                raise ValueError(f"--resource-name/--time-slicing-replicas: {exc}") from None
            if not args.device_plugin_dir.is_dir():
                raise ValueError(f"--device-plugin-dir {args.device_plugin_dir}: no such folder")
            manager = DevicePluginManager(
                checker.board, plugin_config, args.device_plugin_dir, topology=topology
            )
        node_status = None
        if args.node_taint or args.node_condition:
            if not args.node_name:
                raise ValueError("--node-taint/--node-condition need --node-name (or $NODE_NAME)")
            node_status = NodeStatusUpdater(
                _core_api(args.kubeconfig),
                args.node_name,
                taint=args.node_taint,
                condition=args.node_condition,
            )
        return cls(checker, hostname or socket.gethostname(), manager, node_status)

    def attach(
        self, collector: _Subscribable, xid_watcher: _XidSource | None, server: _Routes | None
    ) -> None:
        """Listen to the collector and the XID thread; add the JSON routes to the HTTP server."""
        collector.subscribe(self.checker.on_snapshot)
        if xid_watcher is not None:
            xid_watcher.add_listener(self._on_xid)
        if server is not None:
            for path in HEALTH_ROUTES:
                server.add_route(path, self.json_route)
            server.add_snapshot_view(self.snapshot_view)

    def snapshot_view(self, snapshot: NodeSnapshot) -> NodeSnapshot:
        """Join the verdict of this moment onto a snapshot about to be rendered as metrics."""
        if not self.checker.board.ready:
            return snapshot
        return replace(snapshot, health=self.checker.current())

    def _on_xid(self, event: XidLike) -> None:
        self.checker.on_xid(event)

    def json_route(self) -> Response:
        if not self.checker.board.ready:
            return (
                503,
                "text/plain; charset=utf-8",
                b"no health verdict yet (waiting for the first collection)\n",
            )
        body = json.dumps(node_json(self.checker.current(), self.hostname), indent=1).encode()
        return 200, "application/json", body + b"\n"

    def start(self) -> None:
        self.checker.start()
        if self.node_status is not None:
            self.node_status.start()
        if self.plugin_manager is not None:
            self.plugin_manager.start()

    def stop(self) -> None:
        if self.plugin_manager is not None:
            self.plugin_manager.stop()
        self.checker.stop()
        if self.node_status is not None:
            self.node_status.stop()


class KubeConfigUnavailableError(RuntimeError):
    """No usable Kubernetes API configuration for --node-taint/--node-condition (one line)."""


def _core_api(kubeconfig: Path | None) -> Any:
    from kubernetes import client, config

    try:
        if kubeconfig is not None:
            config.load_kube_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        else:
            try:
                config.load_incluster_config()  # type: ignore[no-untyped-call]
            except config.ConfigException:
                config.load_kube_config()  # type: ignore[no-untyped-call]
    except (config.ConfigException, OSError) as exc:
        where = f"kubeconfig {kubeconfig}" if kubeconfig else "no in-cluster config and kubeconfig"
        reason = " ".join(str(getattr(exc, "strerror", None) or exc).split())
        raise KubeConfigUnavailableError(
            f"--node-taint/--node-condition need the Kubernetes API: {where}: {reason}"
        ) from None
    return client.CoreV1Api()
