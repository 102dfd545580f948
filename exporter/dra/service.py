"""Wires DRA node support into ``gpu-exporter``: flags, the slice watcher, the taint publisher.

exporter/cli.py calls ``add_arguments(parser)``, then ``DraService.from_args(args)`` (None when
DRA support is off), hands ``service.attribution`` to the pod-resources watcher, attaches the
health checker and starts/stops it. ``--dra auto`` (the default) turns attribution on wherever
the exporter can reach the Kubernetes API (in a pod, or with --kubeconfig) and knows its node
name; without RBAC for resourceslices it then says so once and attribution stays on the
device-plugin path. DeviceTaintRules are opt-in (``--dra-device-taints``): they write
cluster-scoped objects and need the deploy/components/dra RBAC.
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any, Protocol

from gpuquota.exporter.dra.slices import DEFAULT_DRIVERS, KINDS, SliceIndex, SliceWatcher
from gpuquota.exporter.dra.taints import EFFECTS, DeviceTaintPublisher
from gpuquota.exporter.enrich.dra import DraAttribution
from gpuquota.exporter.enrich.dra_claims import AdminAccessClaims
from gpuquota.exporter.health.engine import Fence

log = logging.getLogger(__name__)


class _Listenable(Protocol):
    def add_listener(self, listener: Any) -> None: ...
    def restore(self, fences: list[Fence], timeout: float = ...) -> None: ...


def add_arguments(parser: argparse.ArgumentParser) -> None:
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


class DraService:
    def __init__(
        self,
        attribution: DraAttribution,
        watcher: SliceWatcher,
        publisher: DeviceTaintPublisher | None = None,
    ) -> None:
        self.attribution = attribution
        self.watcher = watcher
        self.publisher = publisher

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> DraService | None:
        """None when DRA support is off; ValueError (naming the flag) on bad settings,
        DraKubeConfigError when the Kubernetes API it needs cannot be configured."""
        drivers = [d.strip() for d in args.dra_drivers.split(",") if d.strip()]
        if not drivers:
            raise ValueError("--dra-drivers: give at least one DRA driver name")
        if args.dra == "off":
            if args.dra_device_taints:
                raise ValueError("--dra-device-taints needs DRA support (not --dra off)")
            return None
        if args.dra == "on" or args.dra_device_taints:
            if not args.node_name:
                raise ValueError("--dra on/--dra-device-taints need --node-name (or $NODE_NAME)")
        elif not (
            args.node_name and (args.kubeconfig or os.environ.get("KUBERNETES_SERVICE_HOST"))
        ):
            return None  # auto, and no API server or node name to follow slices with
        try:
            kube = _kube(args.kubeconfig, args.node_name)
        except DraKubeConfigError as exc:
            if args.dra != "auto" or args.dra_device_taints:
                raise
            # auto: a pod without a service account token, say; device plugins still attribute
            log.info("DRA attribution is off: no usable Kubernetes credentials (%s)", exc)
            return None
        index = SliceIndex(drivers)
        asked_for = args.dra == "on" or args.dra_device_taints
        watcher = SliceWatcher(kube, index, args.node_name, asked_for=asked_for)
        attribution = DraAttribution(index, watcher)
        index.on_problem = attribution.count_problem
        attribution.admin = AdminAccessClaims(kube)
        publisher = None
        if args.dra_device_taints:
            publisher = DeviceTaintPublisher(
                kube, index, args.node_name, effect=args.dra_taint_effect
            )
            attribution.taints = publisher
        return cls(attribution, watcher, publisher)

    def attach(self, checker: _Listenable) -> None:
        if self.publisher is not None:
            checker.add_listener(self.publisher)
            self.publisher.on_fences = checker.restore  # our rules of the last run, at start

    def start(self) -> None:
        if self.attribution.admin is not None:
            self.attribution.admin.start()
        self.watcher.start()
        if self.publisher is not None:
            self.publisher.start()

    def stop(self) -> None:
        if self.publisher is not None:
            self.publisher.stop()
        self.watcher.stop()
        if self.attribution.admin is not None:
            self.attribution.admin.stop()


class DraKubeConfigError(RuntimeError):
    """No usable Kubernetes API configuration for --dra on/--dra-device-taints (one line)."""


def _kube(kubeconfig: Any, node_name: str) -> Any:
    from gpuquota.kube.client import Kube, KubeConfigError, load

    try:
        api = load(str(kubeconfig) if kubeconfig else None)
    except KubeConfigError as exc:
        raise DraKubeConfigError(f"--dra needs the Kubernetes API: {exc}") from None
    selector = f"spec.nodeName={node_name}"
    return Kube(api, field_selectors=dict.fromkeys(KINDS, selector))
