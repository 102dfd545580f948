"""`make image`'s store checks (tools/store-smoke), run on this machine's gpuquota: what the
image's smoke step expects of `gpuquota report` must be what gpuquota does (issue 38: the
smoke expected exit 0 on an empty store after that became exit 2, and `make image` failed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.deploy.manifests import ROOT


def test_the_image_smokes_store_checks_hold_for_gpuquota(tmp_path: Path) -> None:
    bin_dir = Path(sys.executable).parent
    done = subprocess.run(
        [str(ROOT / "tools/store-smoke"), str(tmp_path), str(tmp_path)],
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "empty store: exit 2" in done.stdout
    assert "as generated" in done.stdout
    # and `make image` runs these very checks in the image
    assert (
        'tools/store-smoke "$scratch/data" /data "${RUN[@]}"' in (ROOT / "tools/image").read_text()
    )
