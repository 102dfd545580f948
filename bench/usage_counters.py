"""Benchmark: CPU the usage counters (exporter/enrich/ledger.py) add to one collection.

The enricher's own work, apart from NVML and the other enrichers: :func:`advance` and the
snapshot form of its totals, on node shapes like bench.exporter's (``h100x8``: 8 GPUs, one pod
each, GPM; ``a100-mig``: 4 GPUs x 7 MIG instances, 28 pods; ``shared``: 8 GPUs time-sliced by
4 pods each, per-process SM), the energy counter moving every fifth round (the slow tier). Run:

    .venv/bin/python -m bench.usage_counters
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import replace

from gpuquota.exporter.enrich.ledger import LedgerConfig, LedgerEnricher
from gpuquota.exporter.snapshot import (
    DeviceSnapshot,
    GpmMetrics,
    MigInfo,
    NodeSnapshot,
    PodRef,
    PodUsage,
    ProcessUtilization,
)


class _Uids:
    def uid_of(self, namespace: str, name: str) -> str | None:
        return f"uid-{namespace}-{name}"


def _gpu(i: int, **extra: object) -> DeviceSnapshot:
    gpu = DeviceSnapshot(
        index=i,
        uuid=f"GPU-{i:08d}",
        power_watts=500.0,
        energy_joules=0.0,
        gpu_utilization_ratio=0.9,
        gpm=GpmMetrics(sm_active=0.8),
    )
    return replace(gpu, **extra)  # type: ignore[arg-type]


def shape(name: str) -> NodeSnapshot:
    devices: list[DeviceSnapshot] = []
    pods: dict[str, tuple[PodRef, ...]] = {}
    usage: dict[str, tuple[PodUsage, ...]] = {}
    if name == "h100x8":
        devices = [_gpu(i) for i in range(8)]
        pods = {d.uuid: (PodRef("bench", f"pod-{d.index}", "main"),) for d in devices}
    elif name == "a100-mig":
        for i in range(4):
            gpu = _gpu(i, mig_mode_enabled=True, gpm=None)
            devices.append(gpu)
            for m in range(7):
                inst = DeviceSnapshot(
                    index=m,
                    uuid=f"MIG-{i:04d}{m:04d}",
                    mig=MigInfo(gpu.uuid, i, m + 1, 0, "1g.5gb"),
                    gpm=GpmMetrics(sm_active=0.5),
                )
                devices.append(inst)
                if i * 7 + m < 28:
                    pods[inst.uuid] = (PodRef("bench", f"pod-{i * 7 + m}", "main"),)
    elif name == "shared":
        procs = tuple(ProcessUtilization(p, 0.2, 0.1, 0, 0) for p in range(4))
        devices = [_gpu(i, process_utilization=procs) for i in range(8)]
        for d in devices:
            refs = tuple(PodRef("bench", f"pod-{d.index}-{r}", "main") for r in range(4))
            pods[d.uuid] = refs
            usage[d.uuid] = tuple(
                PodUsage("pod", "bench", r.pod, "main", 1, None, 0.2, 0.1, 0.2) for r in refs
            )
    else:
        raise SystemExit(f"unknown shape {name!r}: h100x8, a100-mig, shared")
    return NodeSnapshot(
        "bench", "550", "12.550", 12040, tuple(devices), 0.0, 0.01, pods=pods, pod_usage=usage
    )


def per_collection_us(name: str, rounds: int) -> float:
    """CPU microseconds the enricher takes per collection on ``name``."""
    base = shape(name)
    enricher = LedgerEnricher(_Uids(), _Uids(), LedgerConfig())
    snaps = []
    for r in range(rounds):
        energy = float(r // 5 * 100)
        devices = tuple(
            replace(d, energy_joules=energy) if d.mig is None else d for d in base.devices
        )
        snaps.append(replace(base, devices=devices, collected_at=1000.0 + r * 0.25))
    started = time.process_time()
    for snap in snaps:
        enricher(snap)
    return (time.process_time() - started) / rounds * 1e6


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="h100x8,a100-mig,shared")
    parser.add_argument("--rounds", type=int, default=4000)
    args = parser.parse_args(argv)
    for name in args.shapes.split(","):
        us = per_collection_us(name, args.rounds)
        print(f"{name}: {us:.0f} us CPU per collection = {us / 1000:.3f} s per 1,000 collections")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
