"""Build hooks: generate the kubelet gRPC stubs and ship the Alembic migrations.

Everything else about the distribution is declared in pyproject.toml. Two steps need code:

* The kubelet APIs (pod-resources v1, device plugin v1beta1) are written as .proto files in
  exporter/kubeletapi/ and compiled with grpcio-tools at build time, so generated code is
  never committed and always matches the installed protobuf runtime.
* The repository's alembic/ folder (env.py, versions/) is copied into the wheel as
  gpuquota/quota/migrations, so `gpuquota db upgrade` works from an installed wheel without a
  top-level `alembic` package shadowing the alembic library.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
# compiled by their path inside the package (gpuquota/exporter links to exporter/), so the
# generated modules import each other as gpuquota.exporter.kubeletapi.*
PROTO_DIR = ROOT / "gpuquota" / "exporter" / "kubeletapi"


def generate_kubelet_stubs() -> None:
    """Compile every .proto in gpuquota/exporter/kubeletapi/ next to itself (with .pyi stubs)."""
    from grpc_tools import protoc  # build-time dependency, see [build-system]

    protos = sorted(PROTO_DIR.glob("*.proto"))
    for proto in protos:
        args = [
            "grpc_tools.protoc",
            f"--proto_path={ROOT}",
            f"--python_out={ROOT}",
            f"--grpc_python_out={ROOT}",
            f"--mypy_out={ROOT}",
            f"--mypy_grpc_out={ROOT}",
            str(proto.relative_to(ROOT)),
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {proto}")


class BuildPy(build_py):
    def run(self) -> None:
        generate_kubelet_stubs()
        if not self.editable_mode:
            # setuptools reuses build/lib between builds: a package an earlier layout put there
            # (the top-level exporter/, quota/, ... before gpuquota.*) would land in the wheel
            shutil.rmtree(self.build_lib, ignore_errors=True)
        super().run()
        if not self.editable_mode:
            target = Path(self.build_lib) / "gpuquota" / "quota" / "migrations"
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(ROOT / "alembic", target, ignore=shutil.ignore_patterns("__pycache__"))


setup(cmdclass={"build_py": BuildPy})
