"""`gpuquota db`: create or migrate the store's schema, and show its revision."""

from __future__ import annotations

import argparse

from gpuquota.cli_common import exitcodes
from gpuquota.quota.options import add_db_option
from gpuquota.quota.store import db

EXAMPLES = """\
examples:
  gpuquota db upgrade --db sqlite:///gpuquota.db         # creates the file and every table
  gpuquota db upgrade --db postgresql+psycopg://gpuquota@db.example/gpuquota
  gpuquota db current --db sqlite:///gpuquota.db         # exit 1 when not at the latest
  gpuquota db downgrade base --db sqlite:///scratch.db   # drops every table

Only upgrade creates a SQLite file: current and downgrade never do.

""" + exitcodes.help_text()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EXAMPLES
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    actions = parser.add_subparsers(dest="db_action", metavar="ACTION", required=True)
    up = actions.add_parser(
        "upgrade",
        help="migrate the schema to the latest revision (creates it)",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    up.add_argument("revision", nargs="?", default="head", help="target revision (default: head)")
    add_db_option(up)
    down = actions.add_parser(
        "downgrade",
        help="migrate the schema back ('base' drops every table)",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    down.add_argument("revision", help="target revision, e.g. base")
    add_db_option(down)
    cur = actions.add_parser(
        "current",
        help="print the schema revision of the database",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_db_option(cur)


def run(args: argparse.Namespace) -> int:
    if args.db_action == "upgrade":
        db.upgrade(args.db, args.revision)
        print(f"{db.safe_url(args.db)}: at revision {db.current(args.db)}")
        return 0
    if args.db_action == "downgrade":
        db.downgrade(args.db, args.revision)
        print(f"{db.safe_url(args.db)}: at revision {db.current(args.db) or 'base (empty)'}")
        return 0
    revision = db.current(args.db)
    head = db.head_revision()
    if revision is None:
        print(f"{db.safe_url(args.db)}: empty (latest is {head}; run `gpuquota db upgrade`)")
        return 1
    state = "latest" if revision == head else f"behind, latest is {head}"
    print(f"{revision} ({state})")
    return 0 if revision == head else 1
