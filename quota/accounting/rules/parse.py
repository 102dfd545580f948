"""Reading Kubernetes JSON: timestamps, quantities, and typed field access that names the field.

Every reader raises :class:`AccountingError` with the path of the bad field, so a malformed
object is rejected with one line before anything is stored.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any


class AccountingError(ValueError):
    """A Kubernetes object that the rules cannot read; the message names the field."""


# The documented ranges of every number the rules read (docs/accounting.md, "Input ranges"):
#: a timestamp: 1970-01-01T00:00:00Z .. 9999-12-31T23:59:59Z (unix seconds)
MAX_TIME = 253402300799
#: any resource quantity, Kubernetes' own limit (an int64 of its smallest unit)
MAX_QUANTITY = Decimal(2**63 - 1)
#: GPU units of an extended resource in one request, node or quota line
MAX_GPU_UNITS = 1_000_000


def parse_time(value: Any, where: str) -> int | None:
    """RFC 3339 timestamp (as Kubernetes serves it) -> unix seconds, floored; None stays None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise AccountingError(f"{where}: expected an RFC 3339 timestamp, got {value!r}")
    if isinstance(value, int | float):
        if not (isinstance(value, int) or math.isfinite(value)) or not 0 <= value <= MAX_TIME:
            raise AccountingError(
                f"{where}: {value!r} is out of range (unix seconds from 0 to {MAX_TIME}, "
                "9999-12-31T23:59:59Z)"
            )
        return math.floor(value)
    seconds = _parse_rfc3339(value)
    if seconds is None:
        raise AccountingError(f"{where}: not an RFC 3339 timestamp: {value!r}")
    if not 0 <= seconds <= MAX_TIME:
        raise AccountingError(f"{where}: {value!r} is before 1970-01-01T00:00:00Z")
    return seconds


@functools.lru_cache(maxsize=1 << 16)
def _parse_rfc3339(value: str) -> int | None:
    # objects repeat the same few timestamps many times: parse each once
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return math.floor(parsed.timestamp())


def format_time(seconds: int) -> str:
    """Unix seconds -> RFC 3339 in UTC, the way Kubernetes writes it."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_SUFFIXES: dict[str, Decimal | int] = {
    "": 1,
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_QUANTITY = re.compile(
    r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?)$"
)


def parse_quantity(value: Any, where: str) -> Decimal:
    """A Kubernetes resource quantity ("2", "500m", "1Gi", 3) as an exact Decimal."""
    if isinstance(value, bool):
        raise AccountingError(f"{where}: expected a quantity, got {value!r}")
    if isinstance(value, int):
        return _bounded(Decimal(value), value, where)
    if isinstance(value, float):
        return _bounded(Decimal(str(value)), value, where)
    if not isinstance(value, str):
        raise AccountingError(f"{where}: expected a quantity, got {value!r}")
    match = _QUANTITY.match(value.strip())
    if match is None:
        raise AccountingError(f"{where}: not a Kubernetes quantity: {value!r}")
    try:
        number = Decimal(match.group(1)) * _SUFFIXES[match.group(2)]
    except InvalidOperation:  # pragma: no cover - the regex admits only valid numbers
        raise AccountingError(f"{where}: not a Kubernetes quantity: {value!r}") from None
    return _bounded(number, value, where)


def _bounded(number: Decimal, value: Any, where: str) -> Decimal:
    if not number.is_finite() or abs(number) > MAX_QUANTITY:
        raise AccountingError(f"{where}: quantity {value!r} is out of range (at most 2^63-1)")
    return number


def units_of(value: Any, where: str) -> int:
    """Extended resources are whole numbers; round a fractional one up like the scheduler would
    refuse to split it."""
    quantity = parse_quantity(value, where)
    if quantity < 0:
        raise AccountingError(f"{where}: negative quantity {value!r}")
    if quantity > MAX_GPU_UNITS:
        raise AccountingError(f"{where}: {value!r} is out of range (at most {MAX_GPU_UNITS} units)")
    return math.ceil(quantity)


def mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise AccountingError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def sequence(value: Any, where: str) -> Sequence[Any]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise AccountingError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def string(value: Any, where: str, *, required: bool = False) -> str | None:
    if value is None:
        if required:
            raise AccountingError(f"{where}: missing")
        return None
    if not isinstance(value, str):
        raise AccountingError(f"{where}: expected a string, got {value!r}")
    return value


def int_label(labels: Mapping[str, str], key: str) -> int | None:
    value = labels.get(key)
    if value is None:
        return None
    try:
        number = int(str(value).strip())
    except ValueError:
        return None  # a label someone typed by hand must not stop accounting
    return number if number > 0 else None


def _walk_times(value: Any, keys: frozenset[str], out: list[tuple[str, int]], path: str) -> None:
    if isinstance(value, Mapping):
        for key, item in value.items():
            if key in keys and isinstance(item, str):
                try:
                    parsed = parse_time(item, key)
                except AccountingError:
                    continue
                if parsed is not None:
                    out.append((f"{path}{key}", parsed))
            elif key != "managedFields":
                _walk_times(item, keys, out, f"{path}{key}.")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _walk_times(item, keys, out, f"{path.removesuffix('.')}[{i}].")


_TIME_KEYS = frozenset(
    {
        "creationTimestamp",
        "deletionTimestamp",
        "startTime",
        "startedAt",
        "finishedAt",
        "lastTransitionTime",
        "lastProbeTime",
    }
)


def last_written(obj: Mapping[str, Any]) -> int | None:
    """When the object was last written (its spec by a client or its status by a controller):
    the latest ``metadata.managedFields[].time`` the API server stamped, None without one."""
    meta = obj.get("metadata")
    fields = meta.get("managedFields") if isinstance(meta, Mapping) else None
    times: list[int] = []
    for entry in fields if isinstance(fields, list) else []:
        if isinstance(entry, Mapping) and isinstance(entry.get("time"), str):
            try:
                parsed = parse_time(entry["time"], "managedFields[].time")
            except AccountingError:
                continue
            if parsed is not None:
                times.append(parsed)
    return max(times) if times else None


def latest_timestamp(obj: Mapping[str, Any]) -> int | None:
    """The latest timestamp an object carries: a lower bound of when it was observed, used by
    replay for lines without an explicit observation time."""
    return max((t for _, t in timestamps(obj)), default=None)


def timestamps(obj: Mapping[str, Any]) -> list[tuple[str, int]]:
    """Every readable timestamp an object carries, with its path (``status.startTime``)."""
    found: list[tuple[str, int]] = []
    _walk_times(obj, _TIME_KEYS, found, "")
    return found


#: how far a time an object carries may run ahead of the clock that saw it (clocks disagree)
CLOCK_SKEW = 300


def _allowed(obj: Mapping[str, Any], path: str, seen: int) -> int:
    """The latest ``path`` of ``obj`` may be when the object was seen at ``seen``: CLOCK_SKEW
    later; a ``deletionTimestamp`` is a deadline (the delete request plus the grace period)
    and may be later by ``deletionGracePeriodSeconds``."""
    allowed = seen + CLOCK_SKEW
    meta = obj.get("metadata")
    grace = meta.get("deletionGracePeriodSeconds") if isinstance(meta, Mapping) else None
    if path == "metadata.deletionTimestamp" and isinstance(grace, int) and grace > 0:
        allowed += grace
    return allowed


def unseen_time(obj: Mapping[str, Any], seen: int, seen_as: str) -> str | None:
    """Why ``obj`` cannot have been seen at ``seen`` (``seen_as`` names that time in the
    message): a timestamp it carries is later than that by more than the skew allowed
    (:func:`_allowed`). The one rule of `gpuquota replay` (which refuses the file) and the
    live controller (which skips the event); None when every time is possible."""
    for path, at in timestamps(obj):
        if at > _allowed(obj, path, seen):
            return (
                f"{path} {format_time(at)} is later than {seen_as} ({format_time(seen)}) by "
                f"more than the {CLOCK_SKEW} s of clock skew allowed: it cannot have been seen"
            )
    return None


def without_unseen_times(value: Any, obj: Mapping[str, Any], seen: int, path: str = "") -> Any:
    """A copy of ``value`` (``obj`` at first) without the timestamps :func:`unseen_time`
    refuses: what a DELETED event still proves (the object is gone at ``seen``) without
    the times it cannot prove."""
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if key in _TIME_KEYS and isinstance(item, str):
                try:
                    parsed = parse_time(item, key)
                except AccountingError:
                    parsed = None
                if parsed is not None and parsed > _allowed(obj, f"{path}{key}", seen):
                    continue
                out[key] = item
            elif key != "managedFields":
                out[key] = without_unseen_times(item, obj, seen, f"{path}{key}.")
            else:
                out[key] = item
        return out
    if isinstance(value, list):
        prefix = path.removesuffix(".")
        return [without_unseen_times(x, obj, seen, f"{prefix}[{i}].") for i, x in enumerate(value)]
    return value
