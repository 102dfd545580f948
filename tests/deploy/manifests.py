"""Building and reading deploy/'s manifests in tests (kustomize through kubectl)."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from copy import deepcopy
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl (with kustomize) not installed")

# The optional parts, each a kustomize Component, in the order a kustomization lists them
# (tls-auth after prometheus-operator: it gives the ServiceMonitor its credentials).
COMPONENTS = (
    "report-cronjob",  # before postgres, which points the report at the database
    "remediation",  # before postgres too: it points remediate at the database
    "postgres",
    "prometheus-operator",
    "dcgm-compat",
    "device-plugin",
    "pod-usage",
    "usage-ledger",
    "dra",
    "tls-auth",
    "grafana-dashboards",
    "restricted",
)
# restricted takes the exporter's host folders away: it composes only with what needs none
RESTRICTED_WITH = (
    "report-cronjob",
    "remediation",
    "postgres",
    "prometheus-operator",
    "dcgm-compat",
    "grafana-dashboards",
)
PRODUCTION = ("report-cronjob", "postgres", "prometheus-operator", "device-plugin", "pod-usage",
              "usage-ledger", "tls-auth", "grafana-dashboards")  # fmt: skip
# the production example on DRA nodes: dra instead of device-plugin (its comment says so)
PRODUCTION_DRA = tuple("dra" if c == "device-plugin" else c for c in PRODUCTION)


def _sensible() -> dict[str, tuple[str, ...]]:
    """Every build the tests check: the base, each component alone, every sensible pair,
    deploy/examples/production, and everything that composes at once."""
    builds: dict[str, tuple[str, ...]] = {"base": ()}
    for i, a in enumerate(COMPONENTS):
        builds[f"components/{a}"] = (a,)
        for b in COMPONENTS[i + 1 :]:
            if "restricted" in (a, b) and not {a, b} - {"restricted"} <= set(RESTRICTED_WITH):
                continue
            builds[f"components/{a}+{b}"] = (a, b)
    builds["components/all-but-restricted"] = tuple(c for c in COMPONENTS if c != "restricted")
    builds["components/restricted-and-all-it-takes"] = (*RESTRICTED_WITH, "restricted")
    builds["components/production-with-dra"] = PRODUCTION_DRA
    builds["examples/production"] = PRODUCTION
    return builds


#: build name -> the components it composes with the base
BUILDS = _sensible()
OVERLAYS = list(BUILDS)  # every build the per-build tests run on


def components_of(name: str) -> tuple[str, ...]:
    return BUILDS[name]


def kustomize(folder: Path) -> list[dict[str, Any]]:
    """The build's documents, a copy of their own for each caller: a test that changes what
    it was given (as an operator would change a setting) changes no other test's build."""
    return deepcopy(_kustomized(folder))


@functools.cache
def _kustomized(folder: Path) -> list[dict[str, Any]]:
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
def deploy_copy() -> Path:
    """A copy of deploy/ as a fresh clone has it (tracked files only: nothing generated),
    where the compositions' kustomizations are written."""
    import atexit
    import tempfile

    copy = Path(tempfile.mkdtemp(prefix="deploy-")) / "deploy"
    atexit.register(shutil.rmtree, copy.parent, True)
    tracked = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "deploy"],
        capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, tracked):
        target = copy.parent / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    return copy


def built(name: str) -> list[dict[str, Any]]:
    """kustomize of a build: ``base``, ``examples/<name>``, or the base composed with the
    components a ``components/...`` name lists (BUILDS); made in a copy of deploy/'s tracked
    files, as a fresh clone has them."""
    copy = deploy_copy()
    if name == "base":
        return kustomize(copy / "base")
    if name.startswith("examples/"):
        return kustomize(copy / name)
    folder = copy / "builds" / name.replace("/", "_")
    if not folder.exists():
        folder.mkdir(parents=True)
        listed = "".join(f"  - ../../components/{c}\n" for c in BUILDS[name])
        (folder / "kustomization.yaml").write_text(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
            "namespace: gpuquota\nresources:\n  - ../../base\ncomponents:\n" + listed
        )
    return kustomize(folder)


def expanded(args: list[str], env: dict[str, str]) -> list[str]:
    """``args`` as the kubelet runs them: ``$(VAR)`` replaced by the container's variable VAR
    (env and envFrom) where it has one, ``$$`` an escaped ``$``, anything else as written."""

    def one(arg: str) -> str:
        return re.sub(
            r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)",
            lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)),
            arg,
        )

    return [one(a) for a in args]


# ServiceMonitors of components/prometheus-operator for workloads another component adds
# (deploy/components/remediation): they select nothing, and are inert, in a build without it
OPTIONAL_MONITORS = ("gpuquota-remediate",)
