"""The command-line convention every gpuquota program follows (docs/operations.md).

- bad input (a flag, a file it names): one line ``prog: error: ...`` on stderr, exit 2;
- the environment cannot serve the command (a database or API server that does not answer,
  a port in use): one line, exit 1 where the program says so in its --help;
- never a traceback;
- ``--version``; examples in every ``--help``; durations in one grammar (durations.py).
"""

from __future__ import annotations

import argparse
from importlib import metadata
from typing import NoReturn

from gpuquota.cli_common import exitcodes

EXIT_BAD_INPUT = exitcodes.BAD_INPUT
EXIT_ENVIRONMENT = exitcodes.ENVIRONMENT
DISTRIBUTION = "gpuquota"


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (``prog: error: ...``, exit 2):
    the usage synopsis is what --help is for; a log or a terminal gets the cause alone."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}\n")


def version() -> str:
    """The installed distribution's version (a source tree without metadata: 'unknown')."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


def add_version(parser: argparse.ArgumentParser) -> None:
    """``--version`` on ``parser`` and on every subcommand below it that lacks one."""
    if "--version" not in parser._option_string_actions:
        parser.add_argument(
            "--version",
            action="version",
            version=f"%(prog)s {version()}",
            help="print the version and exit",
        )
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                add_version(sub)
