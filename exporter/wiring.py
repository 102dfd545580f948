"""Builds GPU health checking and the consumers of its verdict from the command line.

exporter/cli.py calls ``add_arguments(parser)`` and, once NVML, the collector, the XID watcher
and the HTTP server exist, ``HealthWiring.from_args(args, ...)``, ``attach(...)`` then
``start()``; on the way out ``stop()``. This is the only module that knows both the health
checker (exporter/health/) and the verdict's consumers, the kubelet device plugin
(exporter/deviceplugin/) and node status: they read the verdict from the checker's board and
health imports neither, so the folders depend one way.
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuquota.cli_common.durations import duration_flag
from gpuquota.exporter.deviceplugin.devices import (
    DEFAULT_PLUGIN_DIR,
    DEFAULT_RESOURCE,
    PluginConfig,
)
from gpuquota.exporter.deviceplugin.preferred import Topology
from gpuquota.exporter.health.checker import HealthChecker, boot_time
from gpuquota.exporter.health.config import HealthConfigError, load_config
from gpuquota.exporter.health.service import HealthService, Routes, Subscribable, XidSource
from gpuquota.exporter.nodestatus.status import TAINT_EFFECT, TAINT_EFFECTS

if TYPE_CHECKING:  # imported when their flags are on: grpc's device plugin stubs are not small
    from gpuquota.exporter.deviceplugin.manager import DevicePluginManager
    from gpuquota.exporter.nodestatus.updater import NodeStatusUpdater


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


class HealthWiring:
    """The health service plus the optional device plugin and node status fed by its verdict."""

    def __init__(
        self,
        service: HealthService,
        plugin_manager: DevicePluginManager | None = None,
        node_status: NodeStatusUpdater | None = None,
    ) -> None:
        self.service = service
        self.plugin_manager = plugin_manager
        self.node_status = node_status
        if node_status is not None:
            service.checker.add_listener(node_status)

    @classmethod
    def from_args(
        cls,
        args: argparse.Namespace,
        topology: Callable[[], Topology] = Topology,
        hostname: str | None = None,
    ) -> HealthWiring:
        """Raises ValueError (with a message naming the flag or file) on bad settings."""
        try:
            config = load_config(args.health_config, quiet_period_s=args.health_quiet_period)
        except HealthConfigError as exc:
            raise ValueError(str(exc)) from None
        checker = HealthChecker(config, booted_at=boot_time())
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
            from gpuquota.exporter.deviceplugin.manager import DevicePluginManager

            manager = DevicePluginManager(
                checker.board, plugin_config, args.device_plugin_dir, topology=topology
            )
        node_status = None
        if args.node_taint or args.node_condition:
            if not args.node_name:
                raise ValueError("--node-taint/--node-condition need --node-name (or $NODE_NAME)")
            from gpuquota.exporter.nodestatus.updater import NodeStatusUpdater

            node_status = NodeStatusUpdater(
                kube_api(args.kubeconfig),
                args.node_name,
                taint=args.node_taint,
                condition=args.node_condition,
                effect=args.node_taint_effect,
                on_fences=checker.restore,
            )
        # the JSON's "node" is the Kubernetes node it speaks for (the one it taints), where known
        service = HealthService(checker, args.node_name or hostname or socket.gethostname())
        return cls(service, manager, node_status)

    def attach(
        self, collector: Subscribable, xid_watcher: XidSource | None, server: Routes | None
    ) -> None:
        self.service.attach(collector, xid_watcher, server)

    def start(self) -> None:
        self.service.start()
        if self.node_status is not None:
            self.node_status.start()
        if self.plugin_manager is not None:
            self.plugin_manager.start()

    def stop(self) -> None:
        if self.plugin_manager is not None:
            self.plugin_manager.stop()
        self.service.stop()
        if self.node_status is not None:
            self.node_status.stop()


class KubeConfigUnavailableError(RuntimeError):
    """No usable Kubernetes API configuration for --node-taint/--node-condition (one line)."""


def kube_api(kubeconfig: Path | None) -> Any:
    """A gpuquota.kube.client.Kube for --node-taint/--node-condition (raw JSON calls)."""
    from gpuquota.kube.client import Kube, KubeConfigError, load

    try:
        return Kube(load(str(kubeconfig) if kubeconfig else None))
    except KubeConfigError as exc:
        raise KubeConfigUnavailableError(
            f"--node-taint/--node-condition need the Kubernetes API: {exc}"
        ) from None


def core_api(kubeconfig: Path | None) -> Any:
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
