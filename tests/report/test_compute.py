"""Pure report arithmetic: pro-rata pricing, physical equivalents, exact rounding, idle spread."""

from __future__ import annotations

import dataclasses
from datetime import UTC
from fractions import Fraction
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuquota.quota.report.allocations import UsageRow
from gpuquota.quota.report.capacity import CapacityRow
from gpuquota.quota.report.compute import (
    OTHER,
    aggregate,
    fold_top,
    round_half_up,
    spread_idle,
    sub_windows,
)
from gpuquota.quota.report.idle import idle
from gpuquota.quota.report.ratecard import parse
from tests.report.conftest import A100, H100, exact_physical

CARD = parse(
    {
        "default_rate": 1,
        "models": {H100: [{"rate": 4}, {"rate": 2, "from": "1970-01-01T01:00:00Z"}]},
        "mig_fractions": {"1g.10gb": 0.125},
    }
)


def row(
    keys: tuple[str | None, ...],
    seconds: tuple[int, ...],
    *,
    units: int = 1,
    physical: float | None = None,
    model: str | None = H100,
    resource: str = "nvidia.com/gpu",
    est: int = 0,
) -> UsageRow:
    return UsageRow(
        keys,
        resource,
        model,
        units,
        float(units) if physical is None else physical,
        seconds,
        est,
        1,
        1 if est else 0,
        share=exact_physical(units, physical) / units,
    )


def test_split_rows_charge_each_pod_its_share_exactly() -> None:
    """A shared DRA claim's seconds split among 3 pods (split=3): each pod's group gets a
    third of the raw and physical seconds, cost and estimate, exactly; rows add up."""
    edges = [0, 3600, 7200]
    rows = [
        dataclasses.replace(row((pod,), (100, 1), units=1, physical=3 / 7, est=101), split=3)
        for pod in ("a", "b", "c")
    ]
    report = aggregate(["pod"], rows, edges, CARD)
    for g in report.groups:
        assert g.raw_seconds == Fraction(101, 3)
        assert g.physical_seconds == Fraction(3, 7) * Fraction(101, 3)
        assert g.cost == (Fraction(3, 7) * 100 * 4 + Fraction(3, 7) * 2) / 3 / 3600
        assert g.estimated_raw_seconds == Fraction(101, 3)
    assert sum(g.raw_seconds for g in report.groups) == 101
    shown = [round_half_up(g.raw_seconds * 1000) for g in report.groups]
    assert shown == [33_667] * 3  # each third rounds alike; the total 101_000 is within 3 x 0.5


def test_sub_windows_keep_only_inner_cuts() -> None:
    assert sub_windows(10, 20, [5, 10, 15, 20, 25], [12, 15]) == [10, 12, 15, 20]


def test_cost_uses_the_rate_in_force_in_each_sub_window() -> None:
    edges = [0, 3600, 7200]
    report = aggregate(["namespace"], [row(("ml",), (3600, 1800), units=2)], edges, CARD)
    (g,) = report.groups
    assert g.raw_seconds == 2 * 5400
    assert g.physical_seconds == 2 * 5400
    assert g.cost == 2 * 4 + 1 * 2  # 2 GPUs: 1 h at 4, then half an hour at 2
    assert report.unpriced_models == []


def test_unknown_models_fall_back_to_default_and_are_listed() -> None:
    report = aggregate(
        ["namespace"],
        [row(("ml",), (3600,), model="NVIDIA-L4"), row(("ml",), (3600,), model=None)],
        [0, 3600],
        CARD,
    )
    assert report.groups[0].cost == 2
    assert report.unpriced_models == ["(unknown model)", "NVIDIA-L4"]


def test_mig_fraction_from_card_prices_and_physical_stays_the_stores() -> None:
    mig = row(
        ("ml",), (7200,), units=3, physical=3 / 7, resource="nvidia.com/mig-1g.10gb", model=A100
    )
    other = row(
        ("web",), (7200,), units=3, physical=3 / 7, resource="nvidia.com/mig-1g.5gb", model=A100
    )
    shared = row(("ai",), (7200,), units=1, physical=0.25, model=A100)
    report = aggregate(["namespace"], [mig, other, shared], [0, 7200], CARD)
    by = {g.keys[0]: g for g in report.groups}
    # the card prices a 1g.10gb instance as 0.125 of a GPU; physically it stays 1/7
    assert by["ml"].physical_seconds == Fraction(3, 7) * 7200
    assert by["ml"].priced_seconds == Fraction(3, 8) * 7200
    assert by["ml"].cost == Fraction(3, 8) * 2  # A100 at the default rate 1
    assert by["web"].physical_seconds == Fraction(3, 7) * 7200  # 0.428571... recovered exactly
    assert by["web"].priced_seconds == by["web"].physical_seconds
    assert by["ai"].physical_seconds == 1800
    assert by["web"].raw_seconds == 3 * 7200
    plain = {g.keys[0]: g for g in aggregate(["namespace"], [mig], [0, 7200], None).groups}
    assert plain["ml"].physical_seconds == by["ml"].physical_seconds
    assert plain["ml"].priced_seconds == plain["ml"].physical_seconds


def test_estimated_usage_is_counted() -> None:
    report = aggregate(["namespace"], [row(("ml",), (100,), est=100, units=2)], [0, 100], None)
    assert report.estimated_intervals == 1
    assert report.groups[0].estimated_raw_seconds == 200


def test_idle_is_allocatable_minus_allocated_per_sub_window_and_priced() -> None:
    cap = [CapacityRow(H100, "p", "nvidia.com/gpu", 2, 2.0, (3600, 3600))]
    # busy 2 GPUs in the first hour, nothing in the second
    used = [UsageRow((H100, "p"), "nvidia.com/gpu", H100, 2, 2.0, (3600, 0), 0, 1, 0)]
    (r,) = idle(cap, used, [0, 3600, 7200], CARD)
    assert r.allocatable_seconds == 4 * 3600
    assert r.allocated_seconds == 2 * 3600
    assert r.idle_seconds == 2 * 3600
    assert r.idle_cost == 2 * 2  # idle in the second hour, priced at 2


def test_spread_idle_adds_up_exactly() -> None:
    rows = [row((n,), (s,)) for n, s in (("a", 1000), ("b", 2000), ("c", 1))]
    report = aggregate(["namespace"], rows, [0, 3600], CARD)
    report.idle = idle(
        [CapacityRow(H100, "p", "nvidia.com/gpu", 3, 3.0, (3600,))], [], [0, 3600], CARD
    )
    for how in ("proportional", "even"):
        spread_idle(report, how)
        assert sum(g.idle_seconds or 0 for g in report.groups) == 3 * 3600
        assert sum(g.idle_cost or 0 for g in report.groups) == report.idle[0].idle_cost
    assert report.groups[0].idle_seconds == Fraction(3 * 3600, 3)  # even: a third each


def test_fold_top_keeps_totals() -> None:
    rows = [row((f"ns{i}",), (100 * (i + 1),)) for i in range(5)]
    report = aggregate(["namespace"], rows, [0, 3600], CARD)
    before = report.physical_total
    fold_top(report, 2)
    assert [g.keys[0] for g in report.groups] == ["ns4", "ns3", OTHER]
    assert report.physical_total == before
    assert report.groups[-1].raw_seconds == 100 + 200 + 300


def test_the_same_value_rounds_alike_whatever_its_neighbours() -> None:
    """One rounding rule (docs/report.md): each figure from its own exact value, halves up;
    two rows with the same seconds print the same figure (largest-remainder rounding of a
    column gave 0.34, 0.33, 0.33 for three equal thirds)."""
    assert [round_half_up(Fraction(1, 3) * 100)] * 3 == [33, 33, 33]
    assert round_half_up(Fraction(5, 2)) == 3
    assert round_half_up(Fraction(-5, 2)) == -3
    assert round_half_up(Fraction(249, 100)) == 2


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.fractions(min_value=0, max_value=10_000, max_denominator=3600), min_size=1, max_size=30
    ),
    st.integers(min_value=0, max_value=3),
)
def test_a_rounded_total_is_within_the_rounding_of_its_rows(
    values: list[Fraction], decimals: int
) -> None:
    scale = 10**decimals
    rounded = [round_half_up(v * scale) for v in values]
    total = round_half_up(sum(values, Fraction(0)) * scale)
    for v, r in zip(values, rounded, strict=True):
        assert abs(v * scale - r) <= Fraction(1, 2)
    assert abs(total - sum(rounded)) <= Fraction(len(values) + 1, 2)


def test_chart_draws_other_in_its_own_grey(tmp_path: Path) -> None:
    from gpuquota.quota.report import chart
    from gpuquota.quota.report.compute import OTHER, Group, Report
    from gpuquota.quota.report.period import Period

    groups = [
        Group((f"ns-{i:02d}",), physical_seconds=Fraction(100 - i), series=[Fraction(3600)])
        for i in range(12)
    ]
    report = Report(("namespace",), groups, priced=False, currency=None, bucket_edges=[0, 3600])
    fold_top(report, 10)  # ten groups and --top's (other)
    assert report.groups[-1].keys == (OTHER,)
    path = tmp_path / "c.svg"
    chart.require().draw(report, Period(0, 3600, UTC), path)
    svg = path.read_text()
    assert chart.OTHER_COLOUR in svg  # (other) is grey ...
    colours = [chart.colours_for(f"ns-{i:02d}", i) for i in range(10)]
    assert len(set(colours)) == 10  # ... and no two groups share a colour
    assert chart.colours_for(OTHER, 0) == chart.OTHER_COLOUR


def test_rate_card_models_that_match_nothing_are_listed() -> None:
    """Issue 18 (fails on 6c36c52): a misspelt model in the card priced nothing, silently."""
    report = aggregate(["namespace"], [row(("ml",), (3600,), model="NVIDIA-L4")], [0, 3600], CARD)
    assert report.unmatched_card_models == sorted(CARD.models)
    used = aggregate(["namespace"], [row(("ml",), (3600,))], [0, 3600], CARD)
    assert used.unmatched_card_models == sorted(set(CARD.models) - {used_model()})


def used_model() -> str:
    return row(("ml",), (1,)).gpu_model or ""
