"""The wheel as a user installs it: built from this checkout, installed into a fresh virtual
environment, and everything documented to run from it run from there: the console scripts,
the store's migrations, and the NVML stand-in built and driven (never from site-packages).

The wheel is built from a copy of the checkout's sources: building it regenerates the kubelet
gRPC stubs next to their .proto files (setup.py) and rewrites build/lib and the egg-info, which
in the checkout itself would rewrite modules that tests running beside this one (pytest-xdist
workers) import."""

from __future__ import annotations

import os
import shutil
import site
import sqlite3
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# what a build of the sources does not read: environments, build output, caches
NOT_SOURCES = shutil.ignore_patterns(
    ".git",
    ".venv",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".*_cache",
    ".hypothesis",
    ".whl",
    ".gl",
)


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
    sources = tmp_path / "src"  # gpuquota/'s links to exporter/, quota/, ... stay links
    shutil.copytree(ROOT, sources, symlinks=True, ignore=NOT_SOURCES)
    pip_wheel = [sys.executable, "-m", "pip", "wheel", str(sources), "--no-deps"]
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
    before = set(purelib.iterdir())
    (purelib / "zz_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        tmp_path,
        env,
    )

    # one top-level package: gpuquota (and its dist-info), no generic names like `sim`
    added = sorted(p.name for p in set(purelib.iterdir()) - before if p.name != "zz_deps.pth")
    assert added == ["gpuquota", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"]
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
    assert tops == {"gpuquota", added[1]}, tops

    user = {k: v for k, v in env.items() if k not in ("PYTHONPATH", "GPUQUOTA_SIM_LIB")}
    user["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    work = tmp_path / "work"  # not the checkout: nothing may come from the source tree
    work.mkdir()
    where = run(
        [str(py), "-c", "from gpuquota import sim, quota; print(sim.__file__, quota.__file__)"],
        work,
        user,
    )
    assert str(ROOT) not in where and str(sources) not in where and str(purelib) in where
    generic = "import importlib.util as u; print([n for n in %r if u.find_spec(n)])"
    old_names = ["exporter", "quota", "sim", "dashboards", "cli_common"]
    assert run([str(py), "-c", generic % old_names], work, user).strip() == "[]"

    for script in ("gpuquota", "gpu-exporter"):
        assert run([str(fresh / "bin" / script), "--version"], work, user).startswith(script)
    store = f"sqlite:///{work / 'store.db'}"
    run([str(fresh / "bin" / "gpuquota"), "db", "upgrade", "--db", store], work, user)
    # docs/operations.md: a generated cluster replayed into that store
    workload = [str(py), "-m", "gpuquota.sim.workload", "--seed", "1", "--hours", "0.2"]
    (work / "events.jsonl").write_text(run(workload, work, user))
    replay = [str(fresh / "bin" / "gpuquota"), "replay", str(work / "events.jsonl")]
    run([*replay, "--db", store, "--cluster", "sim"], work, user)
    with sqlite3.connect(work / "store.db") as db:
        assert db.execute("SELECT count(*) FROM allocations").fetchone()[0] > 0

    built = run([str(py), "-m", "gpuquota.sim.nvml.build"], work, user)
    library = tmp_path / "cache" / "gpuquota" / "sim" / "libnvidia-ml.so.1"
    assert str(library) in built and library.is_file()
    created = run(
        [str(py), "-m", "gpuquota.sim.nvml", str(work / "node.state"), "create", "h100x8"],
        work,
        user,
    )
    assert "8 GPUs" in created
    exports = run([str(py), "-m", "gpuquota.sim.nvml", str(work / "node.state"), "env"], work, user)
    assert str(library.parent) in exports and "GPUQUOTA_SIM_STATE" in exports
    assert not list(purelib.glob("build")), "nothing may be written into site-packages"
