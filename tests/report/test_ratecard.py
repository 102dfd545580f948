"""Rate card loading and strict validation: every problem is one line naming file and key."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from gpuquota.quota.report.ratecard import RateCardError, load
from tests.report.conftest import A100, H100, ts

ROOT = Path(__file__).resolve().parents[2]

GOOD = f"""
currency: EUR
default_rate: 1.5
models:
  {H100}:
    - rate: 4.10
    - {{rate: 3.60, from: 2026-10-15}}
    - {{rate: 3.00, from: "2026-11-01T12:00:00+01:00"}}
  {A100}: 2
mig_fractions:
  1g.10gb: 0.125
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ratecard.yaml"
    path.write_text(text)
    return path


def test_rates_in_force_over_time(tmp_path: Path) -> None:
    card = load(write(tmp_path, GOOD))
    assert card.currency == "EUR"
    assert card.rate(H100, ts("2026-10-14T23:59:59")) == (Fraction("4.10"), False)
    assert card.rate(H100, ts("2026-10-15T00:00:00")) == (Fraction("3.60"), False)
    assert card.rate(H100, ts("2026-11-01T11:00:00")) == (Fraction("3.00"), False)
    assert card.rate(A100, 0) == (Fraction(2), False)
    assert card.rate("NVIDIA-L4", 0) == (Fraction("1.5"), True)
    assert card.rate(None, 0) == (Fraction("1.5"), True)
    assert card.boundaries(ts("2026-10-01T00:00:00"), ts("2026-11-01T00:00:00")) == [
        ts("2026-10-15T00:00:00")
    ]
    assert card.mig_fraction("nvidia.com/mig-1g.10gb") == Fraction(1, 8)
    assert card.mig_fraction("nvidia.com/mig-2g.20gb") is None
    assert card.mig_fraction("nvidia.com/gpu") is None


def test_usage_before_the_first_dated_rate_uses_the_default(tmp_path: Path) -> None:
    card = load(
        write(
            tmp_path, f"default_rate: 1\nmodels:\n  {H100}:\n    - {{rate: 5, from: 2026-10-01}}\n"
        )
    )
    assert card.rate(H100, ts("2026-09-30T23:00:00")) == (Fraction(1), True)
    assert card.rate(H100, ts("2026-10-01T00:00:00")) == (Fraction(5), False)


def test_dates_follow_the_cards_timezone(tmp_path: Path) -> None:
    card = load(
        write(
            tmp_path,
            f"default_rate: 1\ntimezone: Europe/Berlin\nmodels:\n  {H100}:\n    - rate: 1\n    - {{rate: 2, from: 2026-10-15}}\n",
        )
    )
    assert card.rate(H100, ts("2026-10-14T22:00:00"))[0] == 2


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        ("- 1\n- 2\n", "", "mapping at the top level"),
        ("currency: USD\n", "default_rate", "missing"),
        ("default_rate: cheap\n", "default_rate", "expected a number"),
        ("default_rate: -1\n", "default_rate", "negative"),
        ("default_rate: .nan\n", "default_rate", "finite"),
        ("default_rate: 1\nrates: {}\n", "rates", "unknown key"),
        ("default_rate: 1\nmodels: [a]\n", "models", "mapping"),
        ("default_rate: 1\nmodels:\n  X: []\n", "models.X", "empty"),
        (
            "default_rate: 1\nmodels:\n  X:\n    - {rate: 1}\n    - {rate: 2}\n",
            "models.X[1].from",
            "missing",
        ),
        ("default_rate: 1\nmodels:\n  X:\n    - {price: 1}\n", "models.X[0].price", "unknown key"),
        (
            "default_rate: 1\nmodels:\n  X:\n    - {from: 2026-01-01}\n",
            "models.X[0].rate",
            "missing",
        ),
        (
            "default_rate: 1\nmodels:\n  X:\n    - {rate: 1, from: someday}\n",
            "models.X[0].from",
            "expected a date",
        ),
        (
            "default_rate: 1\nmodels:\n  X:\n    - {rate: 1, from: 2026-02-01}\n    - {rate: 2, from: 2026-01-01}\n",
            "models.X[1].from",
            "increase",
        ),
        ("default_rate: 1\nmig_fractions:\n  big: 0.5\n", "mig_fractions.big", "MIG profile"),
        ("default_rate: 1\nmig_fractions:\n  1g.10gb: 1.5\n", "mig_fractions.1g.10gb", "(0, 1]"),
        ("default_rate: 1\ntimezone: Nowhere/Land\n", "timezone", "unknown time zone"),
        # issue 27 (fail on 4b1b947: 1e400 loaded, then `--json` crashed converting it)
        ("default_rate: 1e400\n", "default_rate", "beyond 1,000,000,000"),
        ("default_rate: 1\nenergy_price_per_kwh: 2e9\n", "energy_price_per_kwh", "beyond"),
        ("default_rate: [1\n", "line 2", "invalid YAML"),
        # issue 18 (fail on 6c36c52: a duplicate was accepted, last wins; a bad date named
        # "document", no key path)
        (
            "default_rate: 1\nmodels:\n  X: 1\n  Y: 2\n  X: 3\n",
            "models.X",
            "duplicate key (lines 3 and 5)",
        ),
        ("default_rate: 1\ndefault_rate: 2\n", "default_rate", "duplicate key"),
        (
            "default_rate: 1\nmodels:\n  X:\n    - {rate: 1}\n    - {rate: 2, from: 2026-13-01}\n",
            "models.X[1].from",
            "invalid date '2026-13-01': month must be in 1..12",
        ),
    ],
)
def test_malformed_cards_name_file_key_and_problem(
    tmp_path: Path, text: str, key: str, problem: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(RateCardError) as info:
        load(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: {key}" if key else f"{path}: ")
    assert problem in message


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(RateCardError, match="cannot read"):
        load(tmp_path / "absent.yaml")


def test_documented_example_loads() -> None:
    card = load(ROOT / "docs" / "examples" / "ratecard.yaml")
    assert card.models and card.default_rate > 0
