"""`gpuquota`: the quota controller's command line, one subcommand per module.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> int``; to add one, add a line to SUBCOMMANDS.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from types import ModuleType

from gpuquota.cli_common import exitcodes
from gpuquota.cli_common.commandline import OneLineParser, add_version
from gpuquota.quota.accounting import AccountingError
from gpuquota.quota.store.db import StoreError, StoreUnavailableError

# (subcommand, module, one-line help)
SUBCOMMANDS: list[tuple[str, str, str]] = [
    ("db", "gpuquota.quota.dbcli", "create, migrate or inspect the store's schema"),
    ("replay", "gpuquota.quota.replay", "ingest a recorded stream of watch events into the store"),
    (
        "controller",
        "gpuquota.quota.controller.cli",
        "watch the cluster and keep GPU use in the store",
    ),
    (
        "remediate",
        "gpuquota.quota.remediation.cli",
        "mark and evict the pods of GPUs the node agents fenced (central, off by default)",
    ),
    ("report", "gpuquota.quota.report.cli", "GPU-hours, cost, quota use and idle GPUs per group"),
    ("gpus", "gpuquota.quota.fleet.cli", "every GPU's health history by serial, worst first"),
]

EXIT_ERROR = exitcodes.BAD_INPUT  # what the user can fix in the command or the files it names
EXIT_UNAVAILABLE = exitcodes.ENVIRONMENT  # a database or service that does not answer
EXIT_UNEXPECTED = exitcodes.ENVIRONMENT

VERBOSE_HELP = "log debug messages, and show the traceback of an unexpected error"

EXAMPLES = """\
examples:
  gpuquota db upgrade --db sqlite:///gpuquota.db
  gpuquota controller --kubeconfig ~/.kube/config --cluster prod
  gpuquota replay events.jsonl --cluster prod
  gpuquota report --month 2026-10 --rate-card ratecard.yaml
  gpuquota gpus --month 2026-10 --by model
  gpuquota COMMAND --help

durations: 500ms, 5s, 2m, 1h30m, 7d, or a bare number of seconds, in every flag.
""" + exitcodes.help_text()


def build_parser(
    argv: Sequence[str] | None = None,
) -> tuple[argparse.ArgumentParser, dict[str, ModuleType]]:
    """The parser, and the module of each subcommand it loaded: all of them, or given a command
    line, only the one it names (the others stay in the parser, bare, under the same names and
    help). Importing them all (Kubernetes' client, the remediation and fleet modules) doubled
    the start-up of every `gpuquota report`, which the tests run hundreds of times."""
    named = None if argv is None else _named_command(argv)
    parser = OneLineParser(
        prog="gpuquota",
        description="GPU quota accounting and chargeback for Kubernetes.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_version(parser)
    parser.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    modules: dict[str, ModuleType] = {}
    for name, module_name, help_text in SUBCOMMANDS:
        if named is not None and name != named:
            commands.add_parser(name, help=help_text)  # never parsed: the line names another
            continue
        module = importlib.import_module(module_name)
        sub = commands.add_parser(name, help=help_text, description=module.__doc__)
        # also after the subcommand, where the error messages tell a user to add it
        module.add_arguments(sub)
        _add_verbose(sub)
        add_version(sub)  # and on its own subcommands (db upgrade, ...)
        modules[name] = module
    return parser, modules


def _named_command(argv: Sequence[str]) -> str | None:
    """The subcommand the command line names: its first word that is no option (the options
    before it, -v, -h and --version, take no value), if that is a subcommand; else None."""
    first = next((arg for arg in argv if not arg.startswith("-")), None)
    return first if first in {name for name, _, _ in SUBCOMMANDS} else None


def _add_verbose(parser: argparse.ArgumentParser) -> None:
    """-v on ``parser`` and every subcommand below it (`gpuquota db current -v`): each --help
    says it shows a traceback."""
    if "-v" not in parser._option_string_actions:
        parser.add_argument(
            "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=VERBOSE_HELP
        )
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _add_verbose(sub)


def main(argv: Sequence[str] | None = None) -> int:
    parser, modules = build_parser(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        logging.getLogger("alembic").setLevel(logging.WARNING)
    try:
        code: int = modules[args.command].run(args)
    except StoreUnavailableError as exc:
        print(f"gpuquota: error: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except (StoreError, AccountingError) as exc:
        print(f"gpuquota: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return exitcodes.INTERRUPTED
    except Exception as exc:  # never a traceback for a user, unless asked for (-v)
        if args.verbose:
            raise
        print(
            f"gpuquota {args.command}: error: unexpected {type(exc).__name__}: {exc} "
            "(run with -v for details, and please report it)",
            file=sys.stderr,
        )
        return EXIT_UNEXPECTED
    return code


if __name__ == "__main__":
    sys.exit(main())
