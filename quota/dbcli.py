"""`gpuquota db`: create or migrate the store's schema, show its revision, back it up,
prune history older than a date, and check that no row dangles (docs/operations.md, day
two)."""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime
from pathlib import Path

from gpuquota.cli_common import exitcodes
from gpuquota.quota.options import add_db_option
from gpuquota.quota.report import period
from gpuquota.quota.store import daytwo, db

EXAMPLES = """\
examples:
  gpuquota db upgrade --db sqlite:///gpuquota.db         # creates the file and every table
  gpuquota db upgrade --db postgresql+psycopg://gpuquota@db.example/gpuquota
  gpuquota db current --db sqlite:///gpuquota.db         # exit 1 when not at the latest
  gpuquota db downgrade base --db sqlite:///scratch.db   # drops every table
  gpuquota db backup --db sqlite:///gpuquota.db --to backup-2026-10-31.db  # online, consistent
  gpuquota db prune --before 2025-11-01 --db sqlite:///gpuquota.db         # shows what goes
  gpuquota db prune --before 2025-11-01 --db sqlite:///gpuquota.db --yes   # removes it
  gpuquota db check --db sqlite:///gpuquota.db           # exit 1 when rows dangle

Only upgrade creates a SQLite file: current and downgrade never do.

""" + exitcodes.help_text()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EXAMPLES
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    actions = parser.add_subparsers(dest="db_action", metavar="ACTION", required=True)

    def action(name: str, help: str) -> argparse.ArgumentParser:
        """A subcommand with the shared examples; its --db option is added last."""
        return actions.add_parser(
            name, help=help, epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter
        )

    up = action("upgrade", "migrate the schema to the latest revision (creates it)")
    up.add_argument("revision", nargs="?", default="head", help="target revision (default: head)")
    down = action("downgrade", "migrate the schema back ('base' drops every table)")
    down.add_argument("revision", help="target revision, e.g. base")
    cur = action("current", "print the schema revision of the database")
    back = action(
        "backup", "copy a SQLite store into one new file while the controller writes (online)"
    )
    back.add_argument("--to", required=True, type=Path, metavar="FILE", help="the new file")
    prune = action(
        "prune", "remove history that ended before a date; shows what it would remove unless --yes"
    )
    prune.add_argument(
        "--before",
        required=True,
        metavar="WHEN",
        help="a date (midnight UTC) or an RFC 3339 time: what ended before it goes",
    )
    prune.add_argument(
        "--yes", action="store_true", help="remove it (without: only say what would go)"
    )
    check = action(
        "check", "find rows that refer to rows that are not there (exit 1 when any is found)"
    )
    for sub in (up, down, cur, back, prune, check):
        add_db_option(sub)


def run(args: argparse.Namespace) -> int:
    if args.db_action == "backup":
        size = daytwo.backup(args.db, args.to)
        print(f"{db.safe_url(args.db)}: backed up to {args.to} ({size} bytes)")
        return 0
    if args.db_action == "prune":
        return _prune(args)
    if args.db_action == "check":
        return _check(args)
    if args.db_action == "upgrade":
        db.upgrade(args.db, args.revision)
        print(f"{db.safe_url(args.db)}: at revision {db.current(args.db)}")
        return 0
    if args.db_action == "downgrade":
        db.downgrade(args.db, args.revision)
        print(f"{db.safe_url(args.db)}: at revision {db.current(args.db) or 'base (empty)'}")
        return 0
    revision = db.current(args.db, refuse_foreign=True)
    head = db.head_revision()
    if revision is None:
        print(f"{db.safe_url(args.db)}: empty (latest is {head}; run `gpuquota db upgrade`)")
        return 1
    state = "latest" if revision == head else f"behind, latest is {head}"
    print(f"{revision} ({state})")
    return 0 if revision == head else 1


def _prune(args: argparse.Namespace) -> int:
    try:
        before = period.parse_instant(args.before, UTC, "--before")
    except period.PeriodError as exc:
        raise db.StoreError(str(exc)) from None
    if before < 0:
        raise db.StoreError(
            f"--before: {args.before!r} is before 1970-01-01 (the Unix epoch), when no store "
            "holds anything: a typo?"
        )
    if before > time.time():
        raise db.StoreError(f"--before: {args.before!r} is in the future: that would remove today")
    found = daytwo.prune(args.db, before, apply=args.yes)
    when = datetime.fromtimestamp(before, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    verb = "removed" if args.yes else "would remove"
    for p in found:
        print(f"{verb:>13} {p.rows:>9} {p.table}")
    total = sum(p.rows for p in found)
    if not args.yes:
        print(f"history that ended before {when}: {total} rows; run again with --yes to remove it")
    else:
        print(
            f"removed {total} rows; reports of periods before {when} now say they are not covered"
        )
    return 0


def _check(args: argparse.Namespace) -> int:
    found = daytwo.check(args.db)
    for d in found:
        line = f"{d.rows:>9} {d.table} referring to {d.refers_to}"
        if d.rows and d.table == "usage_windows":
            line += (
                f": {d.used_gpu_seconds / 3600:.3f} used GPU-h and "
                f"{d.energy_joules / 3.6e6:.3f} kWh that no report shows"
            )
        print(line)
    dangling = sum(d.rows for d in found)
    if dangling:
        print(f"{db.safe_url(args.db)}: {dangling} dangling rows (docs/operations.md, db check)")
        return 1
    print(f"{db.safe_url(args.db)}: no dangling rows")
    return 0
