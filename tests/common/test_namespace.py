"""One installed package: every module is `gpuquota.<...>` (gpuquota/__init__.py).

The repository keeps its top-level folders (exporter/, quota/, sim/, dashboards/) and gpuquota/
links to each. Importing a folder by its bare name would still work from a checkout (the current
folder is on sys.path) but break from the wheel, and would load a second copy of the module
beside the `gpuquota.` one: so no import, `python -m` argument or module-name string may use it.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINKED = sorted(p.name for p in (ROOT / "gpuquota").iterdir() if p.is_symlink())
SKIP = {"build", "dist", "node_modules", "__pycache__"}


def _python_files() -> Iterator[Path]:
    for folder, dirs, files in os.walk(ROOT):  # links are not followed: each file once
        dirs[:] = sorted(
            d
            for d in dirs
            if d not in SKIP and not d.startswith(".") and not d.endswith(".egg-info")
        )
        yield from (Path(folder, f) for f in sorted(files) if f.endswith(".py"))


def _is_module(dotted: str) -> bool:
    first, _, rest = dotted.partition(".")
    head = ROOT / first / rest.partition(".")[0]
    return first in LINKED and (
        head.with_suffix(".py").is_file() or (head / "__init__.py").is_file()
    )


def bare_references(source: str) -> list[str]:
    """Imports of a linked folder by its bare name, and strings that are its module paths
    (`"-m", "sim.nvml"`, a logger name, an import_module argument)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        found += [f"line {node.lineno}: import {n}" for n in names if n.split(".")[0] in LINKED]
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value.strip()
            if re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", text) and _is_module(text):
                found.append(f"line {node.lineno}: {text!r}")
    return found


def test_the_package_folders_are_linked_into_gpuquota() -> None:
    assert {"exporter", "quota", "sim", "dashboards"} <= set(LINKED)
    for name in LINKED:
        assert (ROOT / "gpuquota" / name).resolve() == (ROOT / name).resolve(), name
    assert not (ROOT / "gpuquota" / "cli_common").is_symlink()
    assert (ROOT / "gpuquota" / "cli_common" / "durations.py").is_file()


def test_the_checker_sees_bare_names() -> None:
    assert bare_references("from sim.nvml import control\nimport exporter.cli as c\n") == [
        "line 1: import sim.nvml",
        "line 2: import exporter.cli",
    ]
    assert bare_references('RUN = ["-m", "quota.cli"]\n') == ["line 1: 'quota.cli'"]
    assert (
        bare_references('from gpuquota.sim import nvml\nX = ["-m", "gpuquota.quota.cli"]\n') == []
    )
    assert bare_references('LOG = "exporter.log"\nQ = quota.get("x")\n') == []


def test_no_module_uses_a_folder_by_its_bare_name() -> None:
    offenders = {
        str(path.relative_to(ROOT)): found
        for path in _python_files()
        if (found := bare_references(path.read_text()))
    }
    assert offenders == {}, "write gpuquota.<package>... (see gpuquota/__init__.py)"


def test_modules_are_named_under_gpuquota() -> None:
    from gpuquota.cli_common import durations
    from gpuquota.exporter.collect import loop

    assert loop.__name__ == "gpuquota.exporter.collect.loop"
    assert durations.__name__ == "gpuquota.cli_common.durations"
