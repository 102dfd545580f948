"""One clock for a simulated cluster: the time the workload generator's events happen at is the
time every program watching them reads.

A generated workload (sim/workload.py) is dated (2026-01-01 by default) and played in seconds,
while a program's wall clock says today: a controller watching it would stamp its heartbeat, a
namespace's label change and a node's deletion with today's date. :class:`SimClock` keeps the
simulated cluster's time in a file; the workload driver (``sim.apiserver.Driver``) moves it to
each event's time before applying the event, and

    python -m gpuquota.sim.clock FILE -- gpuquota controller ...

runs one of our installed programs unchanged with ``time.time`` (and ``time.time_ns``) reading
that file. ``time.monotonic`` is left alone: timeouts, back-off and flush intervals still run on
real seconds. Like the NVML stand-in, this is a stand-in for the environment (what
libfaketime does in C), never used by a deployment.
"""

from __future__ import annotations

import runpy
import shutil
import sys
import time
from pathlib import Path


class SimClock:
    """The simulated time (unix seconds) in a file; readers see each write whole."""

    def __init__(self, path: Path, start: float):
        self.path = path
        self.set(start)

    def set(self, t: float) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(repr(float(t)))
        tmp.replace(self.path)  # atomic: a reader never sees half a number
        self.now = float(t)


def reader(path: Path) -> tuple[object, object]:
    """``time.time`` and ``time.time_ns`` replacements reading ``path``."""

    def now() -> float:
        return float(path.read_text())

    def now_ns() -> int:
        return int(now() * 1_000_000_000)

    return now, now_ns


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m gpuquota.sim.clock FILE -- PROGRAM [ARGS...]", file=sys.stderr)
        return 2
    path, program = Path(args[0]), args[2]
    script = shutil.which(program) or shutil.which(program, path=str(Path(sys.executable).parent))
    if script is None or not path.is_file():
        missing = program if script is None else str(path)
        print(f"python -m gpuquota.sim.clock: error: {missing} not found", file=sys.stderr)
        return 2
    # before the program imports anything: a default argument bound to time.time at import
    # time (the controller's clock) must bind the simulated one
    time.time, time.time_ns = reader(path)  # type: ignore[assignment]
    sys.argv = [script, *args[3:]]
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
