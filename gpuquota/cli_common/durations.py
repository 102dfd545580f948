"""One duration grammar for every command-line flag of every gpuquota program.

Prometheus-style units that may be combined ('500ms', '5s', '2m', '1h30m', '7d', '2w'), or a
bare number of seconds ('1.5'), so `gpu-exporter --interval 1s`, `gpuquota controller
--flush-interval 5s` and `gpuquota report --last 7d` read the same way.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

UNIT_SECONDS: dict[str, float] = {
    "ms": 0.001,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    "w": 604800.0,
}
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_PARTS = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d|w))+")
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
EXAMPLES = "e.g. 500ms, 5s, 2m, 1h30m, 7d"
MAX_SECONDS = 100 * 52 * 604800.0  # a hundred years: anything longer is a typo


def parse_duration(text: str, *, minimum: float = 0.0) -> float:
    """Seconds in ``text``; ValueError naming the text when it is not a positive duration."""
    cleaned = text.strip()
    if _NUMBER.fullmatch(cleaned):
        seconds = float(cleaned)
    elif _PARTS.fullmatch(cleaned):
        seconds = sum(float(n) * UNIT_SECONDS[unit] for n, unit in _PART.findall(cleaned))
    else:
        raise ValueError(f"invalid duration {text!r} ({EXAMPLES})")
    if not math.isfinite(seconds) or seconds > MAX_SECONDS:
        raise ValueError(f"duration {text!r} is too long (at most {format_duration(MAX_SECONDS)})")
    if seconds <= 0:
        raise ValueError(f"duration {text!r} must be positive")
    if seconds < minimum:
        raise ValueError(f"duration {text!r} is below the minimum of {format_duration(minimum)}")
    return seconds


def duration_flag(minimum: float = 0.0) -> Callable[[str], float]:
    """An argparse ``type=`` that reports a bad duration as a usage error naming the flag."""

    def parse(text: str) -> float:
        try:
            return parse_duration(text, minimum=minimum)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    parse.__name__ = "duration"  # argparse names the type in its messages
    return parse


def whole_seconds_flag() -> Callable[[str], int]:
    """Like duration_flag, for values the Kubernetes API takes as integer seconds."""

    def parse(text: str) -> int:
        try:
            seconds = parse_duration(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc
        if not seconds.is_integer():
            raise argparse.ArgumentTypeError(f"duration {text!r} must be whole seconds")
        return int(seconds)

    parse.__name__ = "duration"
    return parse


def format_duration(seconds: float) -> str:
    """The shortest spelling parse_duration reads back: 0.1 -> '100ms', 90 -> '1m30s'."""
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    out = []
    rest = seconds
    for unit in ("w", "d", "h", "m"):
        count, rest = divmod(rest, UNIT_SECONDS[unit])
        if count:
            out.append(f"{count:g}{unit}")
    if rest or not out:
        out.append(f"{rest:g}s")
    return "".join(out)


@dataclass(frozen=True)
class Multiple:
    """A duration given as a multiple of another (``10x`` = ten times the interval)."""

    factor: float

    def of(self, seconds: float) -> float:
        return self.factor * seconds


_MULTIPLE = re.compile(r"(\d+(?:\.\d+)?)x")


def duration_or_multiple_flag(minimum: float = 0.0) -> Callable[[str], float | Multiple]:
    """An argparse ``type=`` for a duration ('30s') or a multiple of another one ('10x')."""

    def parse(text: str) -> float | Multiple:
        found = _MULTIPLE.fullmatch(text.strip())
        if found:
            factor = float(found.group(1))
            if factor <= 0:
                raise argparse.ArgumentTypeError(f"multiple {text!r} must be positive, e.g. 10x")
            return Multiple(factor)
        try:
            return parse_duration(text, minimum=minimum)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{exc}, or a multiple such as 10x") from exc

    parse.__name__ = "duration"
    return parse
