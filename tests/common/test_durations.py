"""The one duration grammar shared by every gpuquota flag."""

from __future__ import annotations

import argparse

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuquota.cli_common.durations import (
    Multiple,
    duration_flag,
    duration_or_multiple_flag,
    format_duration,
    parse_duration,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1.5", 1.5),
        ("5", 5.0),
        ("500ms", 0.5),
        ("5s", 5.0),
        ("2m", 120.0),
        ("1h30m", 5400.0),
        ("7d", 604800.0),
        ("2w", 1209600.0),
        (" 1s ", 1.0),
    ],
)
def test_reads_units_and_bare_seconds(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "invalid duration ''"),
        ("fast", "invalid duration 'fast'"),
        ("-1s", "invalid duration '-1s'"),
        ("1 s", "invalid duration '1 s'"),
        ("5y", "invalid duration '5y'"),
        ("0s", "must be positive"),
        ("0", "must be positive"),
    ],
)
def test_refuses_what_is_not_a_positive_duration(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_duration(text)


def test_minimum_is_named_in_the_message() -> None:
    with pytest.raises(ValueError, match="below the minimum of 100ms"):
        parse_duration("50ms", minimum=0.1)
    assert parse_duration("100ms", minimum=0.1) == pytest.approx(0.1)


def test_flag_type_reports_usage_errors() -> None:
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--every", type=duration_flag())
    assert parser.parse_args(["--every", "2m"]).every == 120.0
    with pytest.raises(argparse.ArgumentError, match="invalid duration 'soon'"):
        parser.parse_args(["--every", "soon"])


@given(st.integers(min_value=1, max_value=10**8))
def test_format_reads_back(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


def test_duration_or_multiple() -> None:
    parse = duration_or_multiple_flag()
    assert parse("10x") == Multiple(10.0) and parse("1.5x").of(2.0) == 3.0
    assert parse("30s") == 30.0
    for bad in ("0x", "x", "10y", "-1x"):
        with pytest.raises(argparse.ArgumentTypeError, match="10x"):
            parse(bad)
