"""The wheel as a user installs it: built from this checkout, installed into a fresh virtual
environment, and everything documented to run from it run from there: the console scripts,
the store's migrations, and the NVML stand-in built and driven (never from site-packages)."""

from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, f"{args}: {done.stdout}{done.stderr}"
    return done.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_installed_wheel_runs_what_the_docs_say(tmp_path: Path) -> None:
    tools = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{tools}:{os.environ['PATH']}"}  # protoc-gen-mypy
    wheels = tmp_path / "dist"
    pip_wheel = [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps"]
    run([*pip_wheel, "--no-build-isolation", "-q", "-w", str(wheels)], tmp_path, env)
    (wheel,) = wheels.glob("gpuquota-*.whl")
    fresh = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(fresh)], tmp_path, env)
    py = fresh / "bin" / "python"
    purelib = Path(
        run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], tmp_path, env
        ).strip()
    )
    # the dependencies come from the test environment (no network needed), after the wheel
    (purelib / "zz_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        tmp_path,
        env,
    )

    user = {k: v for k, v in env.items() if k not in ("PYTHONPATH", "GPUQUOTA_SIM_LIB")}
    user["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    work = tmp_path / "work"  # not the checkout: nothing may come from the source tree
    work.mkdir()
    where = run(
        [str(py), "-c", "import sim, quota; print(sim.__file__, quota.__file__)"], work, user
    )
    assert str(ROOT) not in where and str(purelib) in where

    for script in ("gpuquota", "gpu-exporter"):
        assert run([str(fresh / "bin" / script), "--version"], work, user).startswith(script)
    store = f"sqlite:///{work / 'store.db'}"
    run([str(fresh / "bin" / "gpuquota"), "db", "upgrade", "--db", store], work, user)

    built = run([str(py), "-m", "sim.nvml.build"], work, user)
    library = tmp_path / "cache" / "gpuquota" / "sim" / "libnvidia-ml.so.1"
    assert str(library) in built and library.is_file()
    created = run(
        [str(py), "-m", "sim.nvml", str(work / "node.state"), "create", "h100x8"], work, user
    )
    assert "8 GPUs" in created
    assert not list(purelib.glob("build")), "nothing may be written into site-packages"
