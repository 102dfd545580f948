"""Rate card: the price of a physical GPU-hour per GPU model over time, the share of a GPU-hour
a MIG profile is priced as, and a default rate. Prices only: nothing in a card changes a
measurement (physical GPU-hours, share, efficiency, idle; docs/report.md). Loaded from YAML and validated strictly: every problem names the file, the
key path and what is wrong.

Example::

    currency: USD
    default_rate: 2.00            # per physical GPU-hour, for models not listed
    timezone: UTC                 # zone of the effective dates below (default UTC)
    models:
      NVIDIA-H100-80GB-HBM3:
        - rate: 4.10              # in force from the start of time...
        - {rate: 3.60, from: 2026-10-15}   # ...until this date, then 3.60
      NVIDIA-L4: 0.80             # shorthand: one rate, always
    mig_fractions:                # GPU-hour share one MIG instance is priced as (default: its
                                  # physical share, N/7); never changes physical GPU-hours
      1g.10gb: 0.125
    energy_price_per_kwh:         # price of a kWh of GPU energy (the usage ledger's joules)
      - rate: 0.30
      - {rate: 0.25, from: 2026-10-15}
    carbon_g_per_kwh: 350         # grid carbon intensity, g CO2e per kWh (same forms)
    focus:                        # the FOCUS export's identity and tags (focus_settings.py)
      billing_account_id: acme-gpu-fleet
      tags: [team, cost-center]
"""

from __future__ import annotations

import bisect
import datetime as dt
import re
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml

from gpuquota.cli_common.yamltext import yaml_position, yaml_problem
from gpuquota.quota.accounting.rules.shares import mig_override
from gpuquota.quota.report import focus_settings

_TOP_KEYS = {
    "currency",
    "default_rate",
    "timezone",
    "models",
    "mig_fractions",
    "energy_price_per_kwh",
    "carbon_g_per_kwh",
    "focus",
}
_ENTRY_KEYS = {"rate", "from"}
# the largest number a card may hold (a GPU-hour, a kWh, g CO2e per kWh)
MAX_NUMBER = 1_000_000_000
_MIG_PROFILE = re.compile(r"^\d+g\.\d+gb(\+me)?$")


class RateCardError(ValueError):
    """A rate card that cannot be used; str() is one line: file, key path, problem."""

    def __init__(self, path: str, key: str, problem: str) -> None:
        super().__init__(f"{path}: {key}: {problem}" if key else f"{path}: {problem}")


@dataclass(frozen=True)
class RatePeriod:
    start: int | None  # unix seconds; None: since the start of time
    rate: Fraction  # per physical GPU-hour


@dataclass(frozen=True)
class RateCard:
    currency: str
    default_rate: Fraction
    models: dict[str, tuple[RatePeriod, ...]] = field(default_factory=dict)
    mig_fractions: dict[str, Fraction] = field(default_factory=dict)
    # price of a kWh of GPU energy, and grid carbon intensity (g CO2e per kWh), over time;
    # empty: the card prices no energy / gives no carbon figure
    energy_prices: tuple[RatePeriod, ...] = ()
    carbon_intensity: tuple[RatePeriod, ...] = ()
    # the FOCUS export's billing account, provider names and tag labels (its flags win)
    focus: focus_settings.FocusSettings = field(default_factory=focus_settings.FocusSettings)

    def boundaries(self, lo: int, hi: int) -> list[int]:
        """Rate changes strictly inside [lo, hi): usage must be split there."""
        points = {p.start for periods in self.models.values() for p in periods}
        points |= {p.start for p in (*self.energy_prices, *self.carbon_intensity)}
        return sorted(t for t in points if t is not None and lo < t < hi)

    def energy_price(self, at: int) -> Fraction | None:
        """Price of a kWh at ``at``; None where the card prices no energy then."""
        return _in_force(self.energy_prices, at)

    def carbon(self, at: int) -> Fraction | None:
        """g CO2e per kWh at ``at``; None where the card gives none then."""
        return _in_force(self.carbon_intensity, at)

    def rate(self, model: str | None, at: int) -> tuple[Fraction, bool]:
        """Rate in force for ``model`` at ``at``, and whether it is the default fallback."""
        periods = self.models.get(model or "")
        if not periods:
            return self.default_rate, True
        starts = [p.start if p.start is not None else -(2**62) for p in periods]
        i = bisect.bisect_right(starts, at) - 1
        if i < 0:
            return self.default_rate, True
        return periods[i].rate, False

    def mig_fraction(self, resource_name: str, mig_profile: str | None = None) -> Fraction | None:
        """The share of a GPU-hour the card prices one MIG instance as, if it sets one (a
        price, never its physical share): the profile is in the resource name (mixed
        strategy: nvidia.com/mig-1g.10gb) or, on single-strategy nodes where every
        nvidia.com/gpu is one instance, recorded beside it."""
        found = mig_override(resource_name, mig_profile, self.mig_fractions)
        return None if found is None else Fraction(found)


def _in_force(periods: tuple[RatePeriod, ...], at: int) -> Fraction | None:
    starts = [p.start if p.start is not None else -(2**62) for p in periods]
    i = bisect.bisect_right(starts, at) - 1
    return periods[i].rate if i >= 0 else None


def load(path: str | Path) -> RateCard:
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise RateCardError(name, "", f"cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise RateCardError(name, "", f"not a YAML text file: {exc.reason}") from exc
    try:
        node = yaml.compose(text, Loader=_Loader)
        if node is not None:
            _no_duplicate_keys(node, name, "")
        doc = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        where = yaml_position(exc) or "document"
        raise RateCardError(
            name, where, f"invalid YAML: {yaml_problem(exc, position=False)}"
        ) from exc
    return parse(doc, name)


class _Loader(yaml.SafeLoader):
    """YAML's safe subset with dates left as text: `from: 2026-13-01` then reaches _instant,
    which names its key path, instead of failing inside the YAML parser with no path."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _no_duplicate_keys(node: yaml.Node, name: str, path: str) -> None:
    """YAML lets a repeated key silently win; in a price list that is a wrong bill."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value)
            where = f"{path}.{key}" if path else key
            if key in seen:
                raise RateCardError(
                    name,
                    where,
                    f"duplicate key (lines {seen[key]} and {key_node.start_mark.line + 1}): "
                    "YAML would keep the last silently",
                )
            seen[key] = key_node.start_mark.line + 1
            _no_duplicate_keys(value_node, name, where)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _no_duplicate_keys(item, name, f"{path}[{i}]")


def parse(doc: Any, name: str = "<ratecard>") -> RateCard:
    if not isinstance(doc, dict):
        raise RateCardError(name, "", "expected a mapping at the top level")
    unknown = sorted(set(map(str, doc)) - _TOP_KEYS)
    if unknown:
        raise RateCardError(name, unknown[0], f"unknown key (expected one of {sorted(_TOP_KEYS)})")
    if "default_rate" not in doc:
        raise RateCardError(name, "default_rate", "missing (the rate for models not listed)")
    currency = doc.get("currency", "USD")
    if not isinstance(currency, str) or not currency.strip():
        raise RateCardError(name, "currency", "expected a non-empty string such as USD")
    tz_name = doc.get("timezone", "UTC")
    try:
        tz = ZoneInfo(str(tz_name))
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise RateCardError(name, "timezone", f"unknown time zone {tz_name!r}") from exc
    default_rate = _rate(doc["default_rate"], name, "default_rate")
    models_doc = doc.get("models") or {}
    if not isinstance(models_doc, dict):
        raise RateCardError(name, "models", "expected a mapping of GPU model to rate(s)")
    models: dict[str, tuple[RatePeriod, ...]] = {}
    for model, spec in models_doc.items():
        models[str(model)] = _periods(spec, name, f"models.{model}", tz)
    mig_doc = doc.get("mig_fractions") or {}
    if not isinstance(mig_doc, dict):
        raise RateCardError(name, "mig_fractions", "expected a mapping of MIG profile to fraction")
    mig: dict[str, Fraction] = {}
    for profile, value in mig_doc.items():
        key = f"mig_fractions.{profile}"
        if not _MIG_PROFILE.match(str(profile)):
            raise RateCardError(name, key, "not a MIG profile name like 1g.10gb")
        fraction = _number(value, name, key)
        if not 0 < fraction <= 1:
            raise RateCardError(name, key, f"fraction must be in (0, 1], got {value}")
        mig[str(profile)] = fraction
    energy = (
        _periods(doc["energy_price_per_kwh"], name, "energy_price_per_kwh", tz)
        if doc.get("energy_price_per_kwh") is not None
        else ()
    )
    carbon = (
        _periods(doc["carbon_g_per_kwh"], name, "carbon_g_per_kwh", tz)
        if doc.get("carbon_g_per_kwh") is not None
        else ()
    )
    try:
        focus = focus_settings.parse(doc.get("focus"))
    except focus_settings.SettingError as exc:
        raise RateCardError(name, exc.key, exc.problem) from exc
    return RateCard(currency.strip(), default_rate, models, mig, energy, carbon, focus)


def _periods(spec: Any, name: str, key: str, tz: dt.tzinfo) -> tuple[RatePeriod, ...]:
    if not isinstance(spec, list):
        return (RatePeriod(None, _rate(spec, name, key)),)
    if not spec:
        raise RateCardError(name, key, "empty list of rates")
    periods: list[RatePeriod] = []
    for i, entry in enumerate(spec):
        where = f"{key}[{i}]"
        if not isinstance(entry, dict):
            raise RateCardError(name, where, "expected a mapping with 'rate' and optional 'from'")
        unknown = sorted(set(map(str, entry)) - _ENTRY_KEYS)
        if unknown:
            raise RateCardError(name, f"{where}.{unknown[0]}", "unknown key (expected rate, from)")
        if "rate" not in entry:
            raise RateCardError(name, f"{where}.rate", "missing")
        rate = _rate(entry["rate"], name, f"{where}.rate")
        start = _instant(entry["from"], name, f"{where}.from", tz) if "from" in entry else None
        if start is None and i > 0:
            raise RateCardError(name, f"{where}.from", "missing (only the first rate may omit it)")
        if (
            periods
            and periods[-1].start is not None
            and start is not None
            and start <= periods[-1].start
        ):
            raise RateCardError(name, f"{where}.from", "effective dates must increase")
        periods.append(RatePeriod(start, rate))
    return tuple(periods)


def _number(value: Any, name: str, key: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise RateCardError(name, key, f"expected a number, got {value!r}")
    try:
        number = Decimal(str(value).strip())
    except InvalidOperation as exc:
        raise RateCardError(name, key, f"expected a number, got {value!r}") from exc
    if not number.is_finite():
        raise RateCardError(name, key, f"expected a finite number, got {value!r}")
    if abs(number) > MAX_NUMBER:
        # no price, fraction or intensity is this large: a typo, and past what a float (JSON,
        # CSV) can carry once multiplied by hours
        raise RateCardError(name, key, f"{value!r} is beyond {MAX_NUMBER:,}: a typo?")
    return Fraction(number)


def _rate(value: Any, name: str, key: str) -> Fraction:
    rate = _number(value, name, key)
    if rate < 0:
        raise RateCardError(name, key, f"a rate cannot be negative, got {value}")
    return rate


def _instant(value: Any, name: str, key: str, tz: dt.tzinfo) -> int:
    # PyYAML already turns 2026-10-15 into a date and full timestamps into datetimes
    if isinstance(value, dt.datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=tz)
        return int(moment.timestamp())
    if isinstance(value, dt.date):
        return int(dt.datetime(value.year, value.month, value.day, tzinfo=tz).timestamp())
    if isinstance(value, str):
        try:
            moment = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError as exc:
            if re.match(r"\d{4}-\d{2}-\d{2}", value.strip()):  # shaped like one, but no date
                raise RateCardError(name, key, f"invalid date {value!r}: {exc}") from None
            raise RateCardError(
                name, key, f"expected a date (2026-10-15) or RFC 3339 time, got {value!r}"
            ) from None
        else:
            moment = moment if moment.tzinfo else moment.replace(tzinfo=tz)
            return int(moment.timestamp())
    raise RateCardError(name, key, f"expected a date (2026-10-15) or RFC 3339 time, got {value!r}")
