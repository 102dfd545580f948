"""Building and reading deploy/'s manifests in tests (kustomize through kubectl)."""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl (with kustomize) not installed")

# every folder kustomize builds (``built`` makes tls-auth from a copy with its generated Secret files)
OVERLAYS = [
    "base",
    "overlays/dcgm-compat",
    "overlays/postgres",
    "overlays/device-plugin",
    "overlays/dra",
    "overlays/restricted",
    "overlays/tls-auth",
    "overlays/pod-usage",
]


@functools.cache
def kustomize(folder: Path) -> list[dict[str, Any]]:
    assert KUBECTL is not None
    built = subprocess.run(
        [KUBECTL, "kustomize", str(folder)], capture_output=True, text=True, timeout=60
    )
    assert built.returncode == 0, built.stderr
    return [d for d in yaml.safe_load_all(built.stdout) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    for doc in docs:
        if doc["kind"] == kind and doc["metadata"]["name"] == name:
            return doc
    raise AssertionError(
        f"no {kind}/{name} in {[(d['kind'], d['metadata']['name']) for d in docs]}"
    )


@functools.cache
def generated_deploy() -> Path:
    """A copy of deploy/ with overlays/tls-auth's Secret files generated (never in the tree)."""
    import sys
    import tempfile

    copy = Path(tempfile.mkdtemp(prefix="deploy-")) / "deploy"
    shutil.copytree(DEPLOY, copy)
    script = copy / "overlays" / "tls-auth" / "generate.py"
    made = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    return copy


def built(folder: str) -> list[dict[str, Any]]:
    """kustomize of ``base`` or ``overlays/<name>``; tls-auth with generated Secret files."""
    if folder == "overlays/tls-auth":
        return kustomize(generated_deploy() / folder)
    return kustomize(DEPLOY / folder)
