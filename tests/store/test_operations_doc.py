"""docs/operations.md's day-two walk-through is run as written (issue 18): every `gpuquota`
and `kubectl kustomize` line of its ```sh blocks, in order, in a folder holding a store with a
replayed January 2026, each exiting 0."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuquota.sim.workload import generate
from tests.deploy.manifests import deploy_copy

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SECTION = "## Day two: install, dashboards, monthly report, backup, upgrade"


def commands() -> list[str]:
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_the_section_has_every_step() -> None:
    lines = commands()
    for step in ("kubectl kustomize deploy/examples/production", "gpuquota db backup",
                 "gpuquota db prune", "--yes", "gpuquota db check", "gpuquota db upgrade", "gpuquota report"):  # fmt: skip
        assert any(step in line for line in lines), step
    assert all(line.startswith(("gpuquota ", "kubectl kustomize ")) for line in lines), lines


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with kustomize) missing")
def test_every_command_runs_as_written(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    events.write_text("".join(line + "\n" for line in generate(5, 3.0).lines()))
    work = tmp_path / "work"
    work.mkdir()
    (work / "docs" / "examples").mkdir(parents=True)
    shutil.copy(ROOT / "docs" / "examples" / "ratecard.yaml", work / "docs" / "examples")
    shutil.copytree(deploy_copy(), work / "deploy")  # as a fresh clone has it
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    seed = ["gpuquota", "replay", str(events), "--db", "sqlite:///gpuquota.db", "--migrate"]
    subprocess.run(seed, cwd=work, env=env, check=True, capture_output=True, timeout=120)
    for line in commands():
        done = subprocess.run(
            shlex.split(line), cwd=work, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"{line}: {done.stderr}"
    assert (work / "gpuquota-backup.db").is_file() and (work / "gpuquota-2026-01.csv").is_file()
