"""GetPreferredAllocation: among the available devices, the set with the best interconnect.

Pure. The topology comes from NVML (NVLink peers and the PCIe common ancestor of each GPU
pair, see ``NvmlApi.topology``); here it is only numbers:

* each NVLink between two GPUs is worth far more than any PCIe relation, so a set joined by
  NVLink always wins over one that is not;
* among equal NVLink counts, GPUs behind the same PCIe switch beat GPUs across the CPU
  interconnect (the NVML topology level, lower is closer);
* two time-sliced replicas of the same GPU in one container give nothing, so replicas are
  spread over distinct GPUs first and only doubled up when there are not enough GPUs;
* time-sliced pods share a GPU's time, so among sets with the same interconnect the least
  shared GPUs come first: a GPU's replicas in use are those ``gpu_of`` names (every replica of
  the resource) that are not available. A one-replica request has no interconnect to weigh, so
  load alone picks its GPU: pods asking one replica each fill the GPUs in turn instead of all
  stacking on the lowest-index GPU while others idle (seen through the kubelet stand-in,
  issue 31); a multi-GPU container still gets its NVLink first.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from math import comb

NVLINK_WEIGHT = 1000
PCIE_LEVEL_MAX = 60  # NVML topology levels are 0 (same board) .. 50 (across CPU sockets)
EXHAUSTIVE_LIMIT = 20_000  # candidate sets; C(16, 8) = 12870 fits


@dataclass(frozen=True, slots=True)
class Topology:
    """Pairwise interconnect between physical GPUs, keyed by sorted (uuid, uuid)."""

    nvlinks: Mapping[tuple[str, str], int] = field(default_factory=dict)
    pcie_level: Mapping[tuple[str, str], int] = field(default_factory=dict)
    numa_node: Mapping[str, int] = field(default_factory=dict)  # GPU uuid -> NUMA node

    def score(self, a: str, b: str) -> int:
        key = (a, b) if a <= b else (b, a)
        links = self.nvlinks.get(key, 0)
        level = self.pcie_level.get(key)
        pcie = PCIE_LEVEL_MAX - level if level is not None else 0
        return links * NVLINK_WEIGHT + pcie


class PreferenceError(ValueError):
    """The request cannot be satisfied as asked (sizes or IDs inconsistent)."""


def _set_score(gpus: Sequence[str], topology: Topology) -> int:
    return sum(topology.score(a, b) for a, b in combinations(gpus, 2))


def _choose_gpus(
    fixed: list[str],
    candidates: list[str],
    extra: int,
    topology: Topology,
    in_use: Mapping[str, int],
) -> list[str]:
    """``fixed`` plus ``extra`` of ``candidates``: the best interconnect, then the fewest
    replicas in use, then the lowest index."""
    if extra <= 0:
        return fixed
    if comb(len(candidates), extra) <= EXHAUSTIVE_LIMIT:
        best: tuple[str, ...] = ()
        best_key: tuple[int, int] | None = None
        for combo in combinations(candidates, extra):
            key = (_set_score([*fixed, *combo], topology), -sum(in_use.get(g, 0) for g in combo))
            if best_key is None or key > best_key:
                best, best_key = combo, key
        return [*fixed, *best]
    chosen = list(fixed)
    left = list(candidates)
    for _ in range(extra):
        pick = max(
            left,
            key=lambda g: (
                sum(topology.score(g, c) for c in chosen),
                -in_use.get(g, 0),
                -left.index(g),
            ),
        )
        chosen.append(pick)
        left.remove(pick)
    return chosen


def preferred_allocation(
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    gpu_of: Mapping[str, str],
    topology: Topology,
) -> list[str]:
    """Device IDs to allocate: ``size`` of ``available``, including every ``must_include``.

    ``gpu_of`` maps each device ID to its physical GPU UUID and fixes the GPU order (the
    order of its keys' first appearance); IDs it does not know are refused.
    """
    if size <= 0:
        raise PreferenceError(f"allocation size must be positive, got {size}")
    if len(set(available)) != len(available):
        raise PreferenceError("available device IDs contain duplicates")
    unknown = [d for d in [*available, *must_include] if d not in gpu_of]
    if unknown:
        raise PreferenceError(f"unknown device ID(s): {', '.join(sorted(set(unknown)))}")
    missing = [d for d in must_include if d not in available]
    if missing:
        raise PreferenceError(
            f"must-include device(s) not among the available ones: {', '.join(missing)}"
        )
    if len(set(must_include)) > size:
        raise PreferenceError(
            f"{len(set(must_include))} must-include devices exceed the allocation size {size}"
        )
    if size > len(available):
        raise PreferenceError(
            f"allocation size {size} exceeds the {len(available)} available devices"
        )

    order = {gpu: n for n, gpu in enumerate(dict.fromkeys(gpu_of.values()))}
    by_gpu: dict[str, list[str]] = {}
    for device_id in sorted(available, key=lambda d: (order[gpu_of[d]], d)):
        by_gpu.setdefault(gpu_of[device_id], []).append(device_id)

    picked: list[str] = list(dict.fromkeys(must_include))
    fixed = list(dict.fromkeys(gpu_of[d] for d in picked))
    candidates = [g for g in by_gpu if g not in fixed]
    distinct = min(size, len(by_gpu))
    free = {gpu: len(ids) for gpu, ids in by_gpu.items()}
    in_use = {gpu: n - free[gpu] for gpu, n in Counter(gpu_of.values()).items() if gpu in free}
    gpus = _choose_gpus(fixed, candidates, distinct - len(fixed), topology, in_use)

    # One device per chosen GPU first, then double up on the chosen GPUs round-robin.
    for gpu in gpus:
        if len(picked) >= size:
            break
        if not any(gpu_of[d] == gpu for d in picked):
            picked.append(next(d for d in by_gpu[gpu] if d not in picked))
    while len(picked) < size:
        progressed = False
        for gpu in gpus:
            spare = [d for d in by_gpu[gpu] if d not in picked]
            if spare and len(picked) < size:
                picked.append(spare[0])
                progressed = True
        if not progressed:  # the chosen GPUs ran out of replicas: take any other
            picked.extend(
                [
                    d
                    for d in sorted(available, key=lambda d: (order[gpu_of[d]], d))
                    if d not in picked
                ][: size - len(picked)]
            )
    return picked
