"""The command-line convention (docs/operations.md), enforced on every command's parser.

The test walks every parser of every program (gpuquota and each of its subcommands,
gpu-exporter, python -m gpuquota.sim.nvml and its actions, gpuquota.sim.nvml.build, gpuquota.sim.workload) and checks: examples in every --help,
--version on every program, the shared duration grammar behind every duration flag, and
each flag fed hostile values: parsed, or refused with one line `prog: error: ...` and exit 2
- never a traceback. The gpuquota commands that only touch a store (report, replay, db) are
also run with each hostile value that parses, against a real SQLite store.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuquota.cli_common import exitcodes
from gpuquota.cli_common.commandline import version
from gpuquota.exporter import cli as exporter_cli
from gpuquota.quota import cli as gpuquota_cli
from gpuquota.quota.store import db
from gpuquota.sim import workload as sim_workload
from gpuquota.sim.nvml import build as sim_build
from gpuquota.sim.nvml import cli as sim_cli

ROOT = Path(__file__).resolve().parents[2]

HOSTILE = [
    "",
    " ",
    "-1",
    "0",
    "nan",
    "inf",
    "1e999",
    "99999999999999999999",
    "1h30x",
    "\u00e9\u6f22\U0001f4a5",
    "x" * 300,
    "a=b,c",
    "9999-12-31T23:59:59+14:00",
]
DURATION_WORDS = ("interval", "timeout", "duration", "deadline", "period", "last")


def programs() -> dict[str, argparse.ArgumentParser]:
    return {
        "gpuquota": gpuquota_cli.build_parser()[0],
        "gpu-exporter": exporter_cli.build_parser(),
        "python -m gpuquota.sim.nvml": sim_cli._parser(),
        "python -m gpuquota.sim.nvml.build": sim_build.parser(),
        "python -m gpuquota.sim.workload": sim_workload.parser(),
    }


def walk(
    parser: argparse.ArgumentParser, argv: list[str]
) -> Iterator[tuple[argparse.ArgumentParser, list[str]]]:
    """Every parser under ``parser`` with an argv that reaches it (positionals filled)."""
    yield parser, argv
    positionals = [
        a
        for a in parser._actions
        if not a.option_strings and not isinstance(a, argparse._SubParsersAction)
    ]
    filled = argv + ["1"] * sum(1 for a in positionals if a.nargs != "?")
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk(sub, [*filled, name])


def every_parser() -> list[tuple[str, argparse.ArgumentParser, list[str]]]:
    found = []
    for program, parser in programs().items():
        for sub, argv in walk(parser, []):
            found.append((program, sub, argv))
    return found


def leaf_argv(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """argv reaching ``parser`` plus its own required positionals."""
    extra = [
        "1"
        for a in parser._actions
        if not a.option_strings
        and not isinstance(a, argparse._SubParsersAction)
        and a.nargs not in ("?", "*")
    ]
    return [*argv, *extra]


def value_options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a
        for a in parser._actions
        if a.option_strings
        and a.nargs != 0
        and not isinstance(a, (argparse._HelpAction, argparse._VersionAction))
    ]


def parse(program: str, argv: list[str]) -> tuple[int | None, str]:
    """(exit status or None when parsed, stderr) of parsing ``argv`` with ``program``."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            programs()[program].parse_args(argv)
        except SystemExit as exc:
            return int(exc.code or 0), err.getvalue()
    return None, err.getvalue()


PARSERS = every_parser()
IDS = [" ".join([prog, *argv]) for prog, _p, argv in PARSERS]


@pytest.mark.parametrize(("program", "parser", "argv"), PARSERS, ids=IDS)
def test_help_has_examples(program: str, parser: argparse.ArgumentParser, argv: list[str]) -> None:
    text = parser.format_help()
    assert "examples:" in text, f"{parser.prog} --help has no examples"
    assert "exit status" in text, f"{parser.prog} --help does not say its exit status"


@pytest.mark.parametrize(("program", "parser", "argv"), PARSERS, ids=IDS)
def test_every_help_prints_the_one_exit_code_table(
    program: str, parser: argparse.ArgumentParser, argv: list[str]
) -> None:
    """Issue 18 (fails on 6c36c52, where `gpuquota db --help` said an unreachable database is
    2 and the CLI returned 1): the table is generated from one place into every --help."""
    assert exitcodes.help_text() in parser.format_help(), f"{parser.prog} --help"


def test_docs_hold_the_same_exit_code_table() -> None:
    operations = ROOT / "docs" / "operations.md"
    assert exitcodes.main(["--check", str(operations)]) == 0, (
        "run `python -m gpuquota.cli_common.exitcodes --write docs/operations.md`"
    )
    # the codes the programs return are the table's
    assert (gpuquota_cli.EXIT_ERROR, gpuquota_cli.EXIT_UNAVAILABLE) == (2, 1)
    assert [code for code, _ in exitcodes.TABLE] == [0, 1, 2, 130]
    for page in ("report.md", "operations.md"):  # no second, hand-written list of codes
        text = (ROOT / "docs" / page).read_text()
        assert "unreachable or unmigrated database" not in text
        assert "give up (exit 2)" not in text


@pytest.mark.parametrize("program", list(programs()))
def test_version(program: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        programs()[program].parse_args(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"{program} {version()}"


@pytest.mark.parametrize(("program", "parser", "argv"), PARSERS, ids=IDS)
def test_duration_flags_share_one_grammar(
    program: str, parser: argparse.ArgumentParser, argv: list[str]
) -> None:
    for action in value_options(parser):
        name = action.option_strings[-1]
        if any(word in name for word in DURATION_WORDS) or action.metavar == "DURATION":
            assert getattr(action.type, "__name__", None) == "duration", name
            code, err = parse(program, [*leaf_argv(parser, argv), name, "1h30m"])
            assert code is None, err


@pytest.mark.parametrize(("program", "parser", "argv"), PARSERS, ids=IDS)
def test_hostile_values_parse_or_give_one_line(
    program: str, parser: argparse.ArgumentParser, argv: list[str]
) -> None:
    base = leaf_argv(parser, argv)
    for action in value_options(parser):
        name = action.option_strings[-1]
        for value in HOSTILE:
            code, err = parse(program, [*base, f"{name}={value}"])
            if code is None:
                continue
            assert code == 2, (name, value, err)
            lines = err.strip().splitlines()
            assert len(lines) == 1, (name, value, err)
            assert lines[0].startswith(f"{parser.prog}: error: "), (name, value, err)
            assert "Traceback" not in err


@pytest.fixture(scope="module")
def store_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('conv') / 'store.db'}"
    db.upgrade(url)
    return url


RUNNABLE = {("report",): [], ("db", "current"): [], ("replay",): ["-"]}


@pytest.mark.parametrize("command", list(RUNNABLE), ids=" ".join)
def test_store_commands_run_with_hostile_values(
    command: tuple[str, ...],
    store_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    parser = next(p for prog, p, argv in PARSERS if prog == "gpuquota" and tuple(argv) == command)
    monkeypatch.chdir(tmp_path)  # a command that wrongly creates files creates them here
    for action in value_options(parser):
        name = action.option_strings[-1]
        if name in ("--db", "--chart", "--output"):
            # --db: the store under test (hostile URLs below); --chart and --output write
            # (--output's bad paths: tests/store/test_daytwo.py)
            continue
        for value in HOSTILE:
            argv = [*command, *RUNNABLE[command], f"{name}={value}", "--db", store_url]
            monkeypatch.setattr("sys.stdin", io.StringIO(""))
            try:
                code = gpuquota_cli.main(argv)
            except SystemExit as exc:
                code = int(exc.code or 0)
            err = capsys.readouterr().err
            assert code in (0, 1, 2), (argv, err)
            assert "Traceback" not in err and "unexpected" not in err, (argv, err)
            if code:
                assert len(err.strip().splitlines()) == 1, (argv, err)
    # bad URLs are bad input (2); a database that does not answer is the environment (1)
    urls = {"": 2, "x": 2, "sqlite:///" + "x" * 300: 2, "mysql://h/d": 2}
    urls["postgresql+psycopg://u@127.0.0.1:1/x"] = 1
    for url, expected in urls.items():
        code = gpuquota_cli.main([*command, *RUNNABLE[command], "--db", url])
        err = capsys.readouterr().err
        assert code == expected and len(err.strip().splitlines()) == 1, (url, err)
        assert "unexpected" not in err
    assert list(tmp_path.iterdir()) == []


def example_commands(text: str) -> Iterator[tuple[str, list[str]]]:
    """(program, argv) of every example line of a --help text that runs one of ours."""
    import shlex

    lines = text.split("examples:", 1)[1].split("\n\n", 1)[0].splitlines()
    for line in lines:
        command = line.split(" # ", 1)[0]
        for stop in (" | ", " > ", "; "):
            command = command.split(stop, 1)[-1 if stop == "; " else 0]
        words = shlex.split(command.replace("\\", " "))  # a continued line: its first part
        while words and "=" in words[0] and not words[0].startswith("-"):
            words.pop(0)  # VAR=value before the program
        for program in sorted(programs(), key=len, reverse=True):
            if " ".join(words).startswith(program + " ") or " ".join(words) == program:
                yield program, words[len(program.split()) :]
                break


@pytest.mark.parametrize(("program", "parser", "argv"), PARSERS, ids=IDS)
def test_every_example_parses(
    program: str, parser: argparse.ArgumentParser, argv: list[str]
) -> None:
    for name, example in example_commands(parser.format_help()):
        if "--help" in example:
            continue
        code, err = parse(name, example)
        assert code is None, f"{parser.prog} --help example {example}: {err}"


def test_a_command_line_loads_only_the_subcommand_it_names() -> None:
    """`gpuquota report` imports neither Kubernetes' client nor the other subcommands (loading
    them all doubled its start-up), and its parser reads every command line as the whole one:
    the same commands, the same help at the top and for the named subcommand."""
    modules = [module for _name, module, _help in gpuquota_cli.SUBCOMMANDS]
    probe = (
        "import json, sys; from gpuquota.quota import cli; cli.build_parser(['-v', 'report']); "
        f"print(json.dumps([m for m in [*{modules!r}, 'kubernetes'] if m in sys.modules]))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["gpuquota.quota.report.cli"]
    whole, _ = gpuquota_cli.build_parser()
    for name, _module, _help in gpuquota_cli.SUBCOMMANDS:
        named, loaded = gpuquota_cli.build_parser(["-v", name, "--help"])
        assert list(loaded) == [name]
        assert named.format_help() == whole.format_help()
        assert subcommand(named, name).format_help() == subcommand(whole, name).format_help()
    # no subcommand named (a typo, --version, bare --help): every one is loaded
    assert len(gpuquota_cli.build_parser(["reprot"])[1]) == len(gpuquota_cli.SUBCOMMANDS)
    assert len(gpuquota_cli.build_parser(["--help"])[1]) == len(gpuquota_cli.SUBCOMMANDS)


def subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    sub: argparse.ArgumentParser = action.choices[name]
    return sub
