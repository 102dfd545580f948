"""The collector's pure rules: which GPU reads which tier in which round (the slow tier spread
over rounds, issue 20) and NVML's units to base units. No NVML, no threads."""

from __future__ import annotations

import math
from collections import Counter
from types import SimpleNamespace

import pytest

from gpuquota.exporter.collect.schedule import (
    FAST_AND_SLOW,
    FAST_ONLY,
    ask_cycle_rounds,
    cycle_rounds,
    on_turn,
    startup_turn,
    tiers_due,
)
from gpuquota.exporter.collect.units import counter_rates, memory_fields, percent_pair, scale


@pytest.mark.parametrize(("gpus", "cycle"), [(8, 5), (8, 4), (8, 1), (4, 5), (16, 5), (1, 3)])
def test_each_gpu_reads_its_slow_tier_once_per_cycle_and_few_share_a_round(
    gpus: int, cycle: int
) -> None:
    per_round: list[list[int]] = []
    for round_no in range(1, 3 * cycle + 1):
        due = [i for i in range(gpus) if tiers_due(i, round_no, cycle, 0.1, 10.0) == FAST_AND_SLOW]
        per_round.append(due)
    assert max(len(r) for r in per_round) == math.ceil(gpus / cycle)
    reads = Counter(i for r in per_round for i in r)
    assert reads == dict.fromkeys(range(gpus), 3)  # three cycles: three slow reads each
    for first, second in zip(per_round, per_round[cycle:], strict=False):
        assert first == second  # the same GPUs a cycle later


@pytest.mark.parametrize(("gpus", "per_round"), [(8, 2), (8, 3), (1, 2), (0, 2), (16, 2)])
def test_start_up_reads_every_gpu_once_a_few_per_round(gpus: int, per_round: int) -> None:
    done: set[int] = set()
    turns = []
    while turn := startup_turn(gpus, done, per_round):
        turns.append(turn)
        done.update(turn)
    assert [i for turn in turns for i in turn] == list(range(gpus))  # each once, in order
    assert all(len(turn) <= per_round for turn in turns)
    assert len(turns) == math.ceil(gpus / per_round)
    assert startup_turn(gpus + 1, done, per_round) == (gpus,)  # a GPU that appeared
    with pytest.raises(ValueError, match="per_round"):
        startup_turn(gpus, set(), 0)


def test_the_slow_tier_is_read_at_once_when_unknown_overdue_or_asked_for() -> None:
    off_turn = 2  # GPU 0 in round 2 of a 5-round cycle
    assert not on_turn(0, off_turn, 5)
    assert tiers_due(0, off_turn, 5, 1.0, 5.0) == FAST_ONLY
    assert tiers_due(0, off_turn, 5, None, 5.0) == FAST_AND_SLOW  # never read
    assert tiers_due(0, off_turn, 5, 1.0, 5.0, full=True) == FAST_AND_SLOW  # collect_once
    assert tiers_due(0, off_turn, 5, 9.9, 5.0) == FAST_ONLY
    assert tiers_due(0, off_turn, 5, 10.0, 5.0) == FAST_AND_SLOW  # missed its turn: overdue


def test_cycles_in_rounds() -> None:
    assert cycle_rounds(1.25, 0.25) == 5  # the default: 5 x --interval
    assert cycle_rounds(60.0, 0.1) == 600
    assert cycle_rounds(1.0, 1.0) == 1  # --slow-interval = --interval: every round
    assert cycle_rounds(1.1, 1.0) == 1
    # per-process utilisation: never asked sooner than once a second
    assert ask_cycle_rounds(1.0, 0.25) == 4
    assert ask_cycle_rounds(1.0, 0.3) == 4
    assert ask_cycle_rounds(1.0, 1.0) == 1
    assert ask_cycle_rounds(1.0, 5.0) == 1


def test_units() -> None:
    assert scale(250_000, 1e-3) == 250.0 and scale(None, 1e-3) is None
    assert percent_pair((97, 40)) == (0.97, 0.40) and percent_pair(None) == (None, None)
    info = SimpleNamespace(total=80, used=30, free=50, reserved=1)
    assert memory_fields(info)["memory_used_bytes"] == 30 and memory_fields(None) == {}


def test_counter_rates() -> None:
    rates = counter_rates((10.0, 1_000, 5_000), (12.0, 3_000, 5_000))
    assert rates == {"pcie_tx_bytes_per_second": 1_000.0, "pcie_rx_bytes_per_second": 0.0}
    none = {"pcie_tx_bytes_per_second": None, "pcie_rx_bytes_per_second": None}
    assert counter_rates(None, (12.0, 3_000, 5_000)) == none  # nothing to compare with
    assert counter_rates((12.0, 1, 1), (12.0, 2, 2)) == none  # no time passed
    wrapped = counter_rates((10.0, 9_000, 5_000), (11.0, 10, 6_000))
    assert wrapped == {"pcie_tx_bytes_per_second": None, "pcie_rx_bytes_per_second": 1_000.0}
    assert counter_rates((10.0, None, 1), (11.0, 5, 2))["pcie_tx_bytes_per_second"] is None
