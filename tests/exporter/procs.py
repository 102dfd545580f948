"""Running gpu-exporter as a subprocess against the NVML stand-in (shared by the tests)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXPORTER = [sys.executable, "-m", "gpuquota.exporter.cli"]


def base_env(**extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "GPUQUOTA_SIM_STATE")
    }
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*EXPORTER, *args],
        env=env or base_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


class Exporter:
    def __init__(self, proc: subprocess.Popen[str], port: int, log: Path) -> None:
        self.proc = proc
        self.port = port
        self.log = log  # stdout and stderr (a file: a full pipe would block the exporter)
        self.url = f"http://127.0.0.1:{port}"

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def wait_ready(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"exporter exited: {self.log.read_text()}")
            try:
                if self.get("/readyz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError("exporter never became ready")
