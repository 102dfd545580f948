"""Reads processes' cgroups under a /proc root (the host's, with hostPID; tests build one)."""

from __future__ import annotations

from pathlib import Path

from gpuquota.exporter.enrich.cgroup import CgroupPod, parse_cgroup


class ProcReader:
    """Reads processes' cgroups under a /proc root (the host's, with hostPID)."""

    def __init__(self, root: Path = Path("/proc")) -> None:
        self.root = root

    def pod_of(self, pid: int) -> tuple[bool, CgroupPod | None]:
        """(visible, pod): visible is False when /proc has no such process for us."""
        try:
            text = (self.root / str(pid) / "cgroup").read_text(errors="replace")
        except OSError:
            return False, None
        return True, parse_cgroup(text)
