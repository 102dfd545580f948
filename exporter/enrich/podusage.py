"""``--pod-usage``: per-pod GPU usage, put together from its flags.

The parts: exporter/enrich/cgroup.py (a process's cgroup -> its pod, pure), procfs.py (reads
/proc), podnames.py (V1Pod -> names, pure), poddirectory.py (the API listing and its thread)
and usage.py (the join onto each snapshot, pure). NVML reports PIDs in the exporter's PID
namespace, and ``/proc`` shows only that namespace's processes: both need the host PID
namespace (``hostPID: true``, the pod-usage component in deploy/components/pod-usage). The /proc
root is a flag (``--proc-root``), so tests can point it at a proc tree they build.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuquota.exporter.enrich.poddirectory import PodDirectory, lister_for_node
from gpuquota.exporter.enrich.procfs import ProcReader
from gpuquota.exporter.enrich.usage import PodUsageEnricher

# --- command line ----------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("per-pod usage (needs the host PID namespace)")
    group.add_argument(
        "--pod-usage",
        action="store_true",
        help="publish SM/memory utilisation and framebuffer use per pod per GPU "
        "(gpu_pod_*): needs hostPID, --node-name and read access to this node's pods",
    )
    group.add_argument(
        "--proc-root",
        type=Path,
        default=Path("/proc"),
        metavar="PATH",
        help="where processes' cgroups are read for --pod-usage (default /proc)",
    )


def from_args(
    args: argparse.Namespace, core_api: Callable[[Path | None], Any]
) -> PodUsageEnricher | None:
    """The enricher --pod-usage asks for (None without it). ValueError on bad flags."""
    if not args.pod_usage:
        return None
    if not args.node_name:
        raise ValueError("--pod-usage needs --node-name (or $NODE_NAME)")
    if not args.proc_root.is_dir():
        raise ValueError(f"--proc-root {args.proc_root}: no such folder")
    lister = lister_for_node(core_api(args.kubeconfig), args.node_name)
    return PodUsageEnricher(ProcReader(args.proc_root), PodDirectory(lister))
