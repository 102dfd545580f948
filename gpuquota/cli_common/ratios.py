"""One grammar for the share flags of every gpuquota program (``--idle-threshold``).

A bare number is a ratio in [0, 1] (``0.05``); a number with ``%`` is a percentage (``5%``).
The controller and the report take the same threshold the same way, and a bare number over 1
is refused instead of read as a percentage, so ``0.05`` can never silently mean 0.05 %.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from fractions import Fraction


def parse_ratio(text: str) -> Fraction:
    """``0.05`` or ``5%`` as the fraction 1/20; ValueError naming the value otherwise."""
    raw = str(text).strip()
    percent = raw.endswith("%")
    number_text = raw.removesuffix("%").strip()
    try:
        number = Decimal(number_text)
    except InvalidOperation:
        raise ValueError(f"{text!r} is no ratio (0.05) or percentage (5%)") from None
    if not number.is_finite():
        raise ValueError(f"{text!r} is no ratio (0.05) or percentage (5%)")
    value = Fraction(number) / (100 if percent else 1)
    if not 0 <= value <= 1:
        hint = "" if percent else f" (for a percentage write {number_text}%)"
        raise ValueError(f"{text!r} is outside 0-1 (0%-100%){hint}")
    return value


def ratio_flag() -> Callable[[str], Fraction]:
    """An argparse ``type=`` that reports a bad share as a usage error naming the flag."""

    def parse(text: str) -> Fraction:
        try:
            return parse_ratio(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    parse.__name__ = "ratio"
    return parse
