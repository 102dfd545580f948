"""sim/clock.py: a program run on the simulated cluster's clock reads it, and only it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gpuquota.sim.clock import SimClock


def test_program_reads_the_simulated_clock(tmp_path: Path) -> None:
    clock = SimClock(tmp_path / "clock", 1767225600)
    script = tmp_path / "prog"
    script.write_text(
        "import datetime, sys, time\n"
        "print(int(time.time()), time.time_ns() // 10**9, sys.argv[1:])\n"
        "clock = open(sys.argv[1]).read()\n"
        "print(int(time.time()) == int(float(clock)))\n"
    )
    script.chmod(0o755)
    clock.set(1767225600 + 3600)
    done = subprocess.run(
        [sys.executable, "-m", "gpuquota.sim.clock", str(clock.path), "--", str(script),
         str(clock.path)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    first, second = done.stdout.splitlines()
    assert first == f"1767229200 1767229200 ['{clock.path}']" and second == "True"


def test_bad_use_is_one_line_and_exit_2(tmp_path: Path) -> None:
    missing = subprocess.run(
        [sys.executable, "-m", "gpuquota.sim.clock", str(tmp_path / "nope"), "--", "true"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert "nope not found" in missing.stderr
