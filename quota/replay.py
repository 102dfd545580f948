"""`gpuquota replay FILE`: ingest a recorded stream of watch events into the store.

Accepted input, mixed freely in one file:

* one JSON object a line: ``{"type": "ADDED|MODIFIED|DELETED|BOOKMARK", "object": {...}}``, as
  ``kubectl get pods -A --watch --output-watch-events -o json`` prints it (pretty-printed,
  multi-line objects are accepted too: a line holding only ``{`` starts one and a line holding
  only ``}`` ends it); an optional ``"observedAt"`` (RFC 3339 or unix seconds) says when the
  event was seen, ERROR events are skipped;
* a List (``kubectl get pods -A -o json``): every item is applied as ADDED;
* a bare object (``kubectl get pods -A --watch -o json``): applied as MODIFIED.

Without ``observedAt`` an event is taken as seen at the latest timestamp its object carries,
and never before the event above it. Pods, Nodes, Namespaces and ResourceQuotas are
accounted; other kinds are counted and skipped.

The whole file is read and checked first: a malformed line stops the command (exit 2) with
its line number before anything is written. That includes a time the recording cannot have
seen: an ``observedAt`` later than now, or an object timestamp later than the line's
``observedAt`` (without one: than now), each allowing CLOCK_SKEW (5 minutes) for clocks that
disagree; a ``deletionTimestamp`` is a deadline (the delete request plus the grace period) and
may be later by ``deletionGracePeriodSeconds`` (acc.unseen_time: the live controller applies
the same rule). One far-future time would otherwise move the
recording's end, and every open allocation with it (docs/accounting.md, "Input ranges"). Like every gpuquota command that writes, it
refuses a store that is not at the latest schema revision unless given ``--migrate``. At the
end it records the cluster's heartbeat at the last replayed event: the report counts
allocations still open in the recording up to there, not beyond. Events then go through the same Accountant as
the live controller, flushed in batches; the writes are idempotent, so after a database
failure rerunning the same command completes the job without counting anything twice.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tqdm import tqdm

from gpuquota.cli_common import exitcodes
from gpuquota.quota import accounting as acc
from gpuquota.quota.accounting.accountant import KINDS, Accountant
from gpuquota.quota.accounting.rules.claims import check_dra
from gpuquota.quota.options import (
    accounting_options,
    add_accounting_options,
    add_cluster_option,
    add_db_option,
)
from gpuquota.quota.store.db import open_store, safe_url

DEFAULT_FLUSH_EVERY = 5000
CLOCK_SKEW = acc.CLOCK_SKEW  # how far a recorded time may run ahead of its recording clock
PROGRESS_MIN_BYTES = 1 << 20
PROGRESS_LOG_SECONDS = 10.0  # without a terminal: one progress line in the log this often

log = logging.getLogger(__name__)

EXAMPLES = """\
examples:
  gpuquota db upgrade --db sqlite:///gpuquota.db
  kubectl get pods -A --watch --output-watch-events -o json > events.jsonl
  gpuquota replay events.jsonl --db sqlite:///gpuquota.db --cluster prod
  python -m gpuquota.sim.workload --seed 1 --hours 48 | gpuquota replay - --migrate --cluster sim
  gpuquota replay events.jsonl --node-pool-label node-pool --cluster prod

After a database failure, rerun the same command: nothing is counted twice.

""" + exitcodes.help_text()


class ReplayError(ValueError):
    """A line of the input that cannot be replayed; the message names the line and cause."""


@dataclass(frozen=True)
class Event:
    line: int
    type: str
    obj: Mapping[str, Any]
    observed_at: int | None  # explicit observedAt, else None


@dataclass
class Summary:
    events: int = 0
    kinds: Counter[str] | None = None
    skipped: Counter[str] | None = None
    rows: int = 0
    estimated: int = 0


def _items(stream: IO[str], name: str) -> Iterator[tuple[int, int, Any]]:
    """(line number, bytes consumed, parsed JSON value) of each top-level value."""
    buffer: list[str] = []
    start = 0
    for number, line in enumerate(stream, start=1):
        size = len(line.encode())
        text = line.strip()
        if buffer:
            buffer.append(line)
            if line.rstrip() == "}" and not line.startswith((" ", "\t")):
                yield start, size, _parse("".join(buffer), name, start)
                buffer = []
            else:
                yield start, size, None
            continue
        if not text:
            yield number, size, None
            continue
        if text == "{":
            buffer, start = [line], number
            yield number, size, None
            continue
        yield number, size, _parse(text, name, number)
    if buffer:
        raise ReplayError(f"{name}:{start}: JSON object starting here is never closed")


def _parse(text: str, name: str, first_line: int) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReplayError(
            f"{name}:{first_line + exc.lineno - 1}: invalid JSON: {exc.msg} (column {exc.colno})"
        ) from None


def _observed(value: Any, where: str) -> int | None:
    if value is None:
        return None
    try:
        return acc.parse_time(value, "observedAt")
    except acc.AccountingError as exc:
        raise ReplayError(f"{where}: {exc}") from None


class Progress:
    """Progress through the input in bytes: a tqdm bar on a terminal, else (logs, CI, a pod)
    one log line every PROGRESS_LOG_SECONDS, for inputs of PROGRESS_MIN_BYTES or more."""

    def __init__(self, what: str, total: int, *, terminal: bool, clock: Any = time.monotonic):
        self.what, self.total, self.clock = what, total, clock
        self.done = 0
        self.enabled = total >= PROGRESS_MIN_BYTES
        self.bar: tqdm[Any] | None = None
        if self.enabled and terminal:
            self.bar = tqdm(total=total, unit="B", unit_scale=True, desc=what)
        self.next_log = clock() + PROGRESS_LOG_SECONDS

    def update(self, size: int) -> None:
        self.done += size
        if self.bar is not None:
            self.bar.update(size)
        elif self.enabled and self.clock() >= self.next_log:
            self.next_log = self.clock() + PROGRESS_LOG_SECONDS
            log.info(
                "%s: %.0f%% (%d of %d MB)",
                self.what,
                100 * self.done / self.total,
                self.done >> 20,
                self.total >> 20,
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def events(stream: IO[str], name: str, progress: Progress | None = None) -> Iterator[Event]:
    """The events of a recorded stream, in order; ReplayError on the first bad line."""
    for line, size, item in _items(stream, name):
        if progress is not None:
            progress.update(size)
        if item is None:
            continue
        where = f"{name}:{line}"
        if not isinstance(item, dict):
            raise ReplayError(f"{where}: expected a JSON object, got {type(item).__name__}")
        if "type" in item and "object" in item:
            kind_type = item["type"]
            if kind_type == "ERROR":
                continue  # a watch error (410 Gone, ...) recorded with the stream
            if kind_type not in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK"):
                raise ReplayError(f"{where}: unknown event type {kind_type!r}")
            if not isinstance(item["object"], dict):
                raise ReplayError(f"{where}: event object is not a JSON object")
            yield Event(line, kind_type, item["object"], _observed(item.get("observedAt"), where))
        elif isinstance(item.get("items"), list) and str(item.get("kind", "")).endswith("List"):
            item_kind = str(item["kind"])[: -len("List")] or None
            for i, obj in enumerate(item["items"]):
                if not isinstance(obj, dict):
                    raise ReplayError(f"{where}: items[{i}] is not a JSON object")
                if "kind" not in obj and item_kind:
                    obj = {**obj, "kind": item_kind}
                yield Event(line, "ADDED", obj, None)
        elif "kind" in item and "metadata" in item:
            yield Event(line, "MODIFIED", item, _observed(item.get("observedAt"), where))
        else:
            raise ReplayError(
                f'{where}: neither a watch event {{"type": ..., "object": ...}}, a List, nor a Kubernetes object'
            )


def too_late(event: Event, now: int) -> str | None:
    """Why the event's times cannot have been recorded (later than its observedAt, or than
    ``now`` without one, by more than CLOCK_SKEW), or None."""
    if event.observed_at is not None and event.observed_at > now + CLOCK_SKEW:
        return (
            f"observedAt {acc.format_time(event.observed_at)} is in the future "
            f"(now is {acc.format_time(now)}; {CLOCK_SKEW} s of clock skew allowed)"
        )
    seen, seen_as = (
        (event.observed_at, "its observedAt") if event.observed_at is not None else (now, "now")
    )
    return acc.unseen_time(event.obj, seen, seen_as)


def check(event: Event, name: str, config: acc.AccountingConfig) -> str | None:
    """Validate one event with the same rules the Accountant applies; returns its kind, or
    None for a kind that is not accounted."""
    kind = event.obj.get("kind")
    where = f"{name}:{event.line}"
    late = too_late(event, int(time.time()))
    if late is not None:
        raise ReplayError(f"{where}: {late}")
    if event.type == "BOOKMARK":
        return None  # carries only a resourceVersion
    if not isinstance(kind, str) or not kind:
        raise ReplayError(f"{where}: object has no kind")
    if kind not in KINDS or event.type == "BOOKMARK":
        return None
    try:
        if kind == "Pod":
            acc.pod_facts(event.obj, config)
        elif kind == "Node":
            acc.node_gpus(event.obj, config)
        elif kind == "Namespace":
            acc.namespace_labels(event.obj)
        elif kind == "ResourceQuota":
            acc.quota_facts(event.obj, config)
        else:
            check_dra(kind, event.obj)
    except acc.AccountingError as exc:
        raise ReplayError(f"{where}: {kind}: {exc}") from None
    return kind


class Source:
    """The input, readable twice (check, then apply): a file, or stdin held in memory."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.name = "<stdin>" if path == "-" else path
        self._data: str | None = None
        if path == "-":
            self._data = sys.stdin.read()
            self.size = len(self._data.encode())
            return
        try:
            self.size = Path(path).stat().st_size
        except OSError as exc:
            raise ReplayError(f"{path}: cannot read: {exc.strerror}") from None

    def open(self) -> IO[str]:
        if self._data is not None:
            return io.StringIO(self._data)
        try:
            return Path(self.path).open(encoding="utf-8")
        except OSError as exc:
            raise ReplayError(f"{self.path}: cannot read: {exc.strerror}") from None


def validate(
    source: Source,
    config: acc.AccountingConfig = acc.DEFAULT_CONFIG,
    *,
    show_progress: bool = False,
) -> Summary:
    """Check every event of the input; ReplayError names the first bad line."""
    summary = Summary(kinds=Counter(), skipped=Counter())
    assert summary.kinds is not None and summary.skipped is not None
    progress = Progress("check", source.size, terminal=show_progress)
    with source.open() as stream:
        try:
            for event in events(stream, source.name, progress):
                try:
                    kind = check(event, source.name, config)
                except ReplayError:
                    raise
                except Exception as exc:  # a surprise still names its line
                    raise ReplayError(
                        f"{source.name}:{event.line}: cannot read this event "
                        f"({type(exc).__name__}: {exc})"
                    ) from exc
                if kind is None:
                    if event.type != "BOOKMARK":
                        summary.skipped[str(event.obj.get("kind"))] += 1
                else:
                    summary.kinds[kind] += 1
                    summary.events += 1
        except UnicodeDecodeError as exc:
            raise ReplayError(f"{source.name}: not UTF-8 text: {exc.reason}") from None
        finally:
            progress.close()
    return summary


def apply(
    source: Source,
    accountant: Accountant,
    *,
    flush_every: int = DEFAULT_FLUSH_EVERY,
    show_progress: bool = False,
) -> int:
    """Feed every event of a validated input to ``accountant``, flushing every
    ``flush_every`` events; returns the number of rows written. The last event's time is
    recorded as the cluster's heartbeat: the store knew the cluster up to there."""
    rows = 0
    observed = 0
    pending = 0
    progress = Progress("replay", source.size, terminal=show_progress)
    with source.open() as stream:
        for event in events(stream, source.name, progress):
            if event.observed_at is not None:
                # any line saying when it was seen (a bookmark too) moves the recording's end
                observed = max(observed, event.observed_at)
            if event.obj.get("kind") not in KINDS:
                continue  # other kinds, and bookmarks without a kind
            if event.observed_at is not None:
                at = event.observed_at
            else:
                at = max(observed, acc.latest_timestamp(event.obj) or observed)
            observed = max(observed, at)
            accountant.apply(event.type, event.obj, at)
            pending += 1
            if pending >= flush_every:
                rows += accountant.flush()
                pending = 0
        progress.close()
        if observed:
            accountant.heartbeat(observed)
        rows += accountant.flush()
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EXAMPLES
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("file", metavar="FILE", help="recorded watch events ('-' reads stdin)")
    add_db_option(parser)
    add_cluster_option(parser)
    parser.add_argument(
        "--migrate", action="store_true", help="bring the store's schema up to date first"
    )
    add_accounting_options(parser)
    parser.add_argument(
        "--flush-every",
        type=int,
        default=DEFAULT_FLUSH_EVERY,
        metavar="N",
        help=f"write to the store every N events (default {DEFAULT_FLUSH_EVERY})",
    )


def run(args: argparse.Namespace) -> int:
    if args.flush_every < 1:
        print("gpuquota replay: error: --flush-every must be at least 1", file=sys.stderr)
        return 2
    terminal = sys.stderr.isatty()
    try:
        config, drivers = accounting_options(args)
        source = Source(args.file)
        # before touching the database: a bad line costs nothing
        summary = validate(source, config, show_progress=terminal)
    except (ReplayError, ValueError) as exc:
        print(f"gpuquota replay: error: {exc}", file=sys.stderr)
        return 2
    with open_store(args.db, migrate=args.migrate) as store:
        accountant = Accountant(store, args.cluster, config, holder="replay", dra_drivers=drivers)
        summary.rows = apply(
            source, accountant, flush_every=args.flush_every, show_progress=terminal
        )
        summary.estimated = accountant.stats["estimated"]
    kinds = ", ".join(f"{n} {k}" for k, n in sorted((summary.kinds or {}).items())) or "none"
    print(
        f"replayed {summary.events} events ({kinds}) into {safe_url(args.db)} "
        f"as cluster {args.cluster!r}: {summary.rows} rows written"
    )
    skipped = ", ".join(f"{n} {k}" for k, n in sorted((summary.skipped or {}).items()))
    if skipped:
        print(f"skipped objects of kinds not accounted: {skipped}")
    return 0
