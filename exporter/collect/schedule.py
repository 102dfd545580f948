"""Which readings each GPU makes in which round: the cadence rules, pure (no NVML, no threads).

The slow tier (ECC, row remapping, retired pages, processes, energy, throttle-time counters,
NVLink errors: about 7.6 ms of NVML time per H100; and a GPM sample pair: 5.2 ms) is due once
per ``--slow-interval``. Were it due for every GPU in the same round, that round would read
eight GPUs' slow tiers at once: 164-168 ms on 8 H100s when NVML serves the whole library
through one queue. So each GPU has a turn in the slow cycle (GPU ``i`` in the rounds where
``round % cycle == i % cycle``): a round reads the slow tier of at most ``ceil(gpus / cycle)``
GPUs. Per-process utilisation (2.2 ms per GPU, asked at most once per driver sampling period)
takes turns the same way. In modelled H100 time a round of 8 GPUs at the default cycle then
carries about 8 x 2.2 ms (fast) + 2 x 12.8 ms (slow turns, GPM included) + 2 x 2.2 ms
(per-process utilisation) = 48 ms (51.5 ms as the NVML stand-in counts a busy 8-GPU round,
docs/benchmarks.md), against 8 x 7.4 ms for the fast tier alone when every round computed
every GPU's GPM pair (82.9 ms counted).

A GPU whose turn passed without a reading (its reader was still busy with a hung call) is read
as soon as its slow reading is two slow intervals old; ``collect_once`` reads every tier.

Start-up: the first snapshot carries every tier of every GPU (no ECC or health gap at start),
yet reading a GPU for the first time costs the most (identity, the NVLink probe, every tier
and GPM's first sample: about 19 ms of modelled NVML per H100, 151.9 ms for 8 in one round).
So the loop reads ``STARTUP_GPUS_PER_ROUND`` GPUs in full per start-up round
(``startup_turn``), back to back, and publishes nothing until the round that reads the last
of them: 2 x 19 = 38 ms a start-up round on H100s, four rounds on 8 GPUs, however many GPUs
or whatever ``--slow-interval``.
"""

from __future__ import annotations

import math

from gpuquota.exporter.collect.tiers import Tier

FAST_ONLY = frozenset((Tier.FAST,))
FAST_AND_SLOW = frozenset((Tier.FAST, Tier.SLOW))
OVERDUE_CYCLES = 2  # a slow reading this many slow intervals old is read whatever the turn
STARTUP_GPUS_PER_ROUND = 2  # GPUs read for the first time (identity, every tier) per round


def cycle_rounds(period: float, interval: float) -> int:
    """Rounds in one cycle of `period` seconds at `interval` (at least 1): the slow tier's
    (``--slow-interval`` rounded to whole rounds, as the old half-interval slack did)."""
    return max(1, round(period / interval))


def ask_cycle_rounds(period: float, interval: float) -> int:
    """Rounds between two questions that must be at least `period` apart (rounded up): per-
    process utilisation, whose driver samples once per period."""
    return max(1, math.ceil(period / interval - 1e-9))


def on_turn(index: int, round_no: int, cycle: int) -> bool:
    """Whether GPU `index` has its turn in round `round_no` of a `cycle`-round cycle."""
    return round_no % cycle == index % cycle


def tiers_due(
    index: int,
    round_no: int,
    cycle: int,
    slow_age: float | None,
    slow_interval: float,
    *,
    full: bool = False,
) -> frozenset[Tier]:
    """The tiers GPU `index` reads in round `round_no`. `slow_age`: seconds since its last
    complete slow reading (None: never read, so everything is due)."""
    if full or slow_age is None or on_turn(index, round_no, cycle):
        return FAST_AND_SLOW
    if slow_age >= OVERDUE_CYCLES * slow_interval:
        return FAST_AND_SLOW
    return FAST_ONLY


def startup_turn(
    count: int, done: set[int], per_round: int = STARTUP_GPUS_PER_ROUND
) -> tuple[int, ...]:
    """The GPUs a start-up round reads in full: the first `per_round` of GPUs 0 .. count-1
    not in `done` (those read in an earlier start-up round); () once every GPU had its turn."""
    if per_round < 1:
        raise ValueError("per_round must be at least 1")
    return tuple(i for i in range(count) if i not in done)[:per_round]
