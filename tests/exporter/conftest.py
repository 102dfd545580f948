"""Fixtures for the exporter tests: promtool, self-signed certificates, the NVML stand-in,
the exporter as a subprocess and its HTTP endpoint in-process."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuquota.exporter.collect.loop import CollectLoop
from gpuquota.exporter.collect.nvml import NvmlApi
from gpuquota.exporter.expose.render import Renderer
from gpuquota.exporter.expose.server import ExporterServer
from gpuquota.exporter.expose.webconfig import ReloadingWebConfig, WebConfig
from gpuquota.sim.harness import free_port, stop_process
from gpuquota.sim.nvml.control import SimNode
from tests.exporter.procs import EXPORTER, Exporter, base_env

NvmlOn = Callable[[Any], tuple[SimNode, NvmlApi]]


@pytest.fixture(scope="session")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not installed (Debian: apt-get install prometheus)")
    return path


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl CLI not installed")
    d = tmp_path_factory.mktemp("tls")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=d, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
        "-days", "2", "-subj", "/CN=gpuquota test CA")  # fmt: skip
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
            f"{name}.csr", "-subj", f"/CN={name}")  # fmt: skip
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", "san.ext")  # fmt: skip
    return {p.stem + p.suffix.replace(".", "_"): p for p in d.iterdir()}


# --- the NVML stand-in ---------------------------------------------------------------------------


@pytest.fixture
def nvml_on(
    make_node: Callable[..., SimNode],
) -> Iterator[Callable[[Any], tuple[SimNode, NvmlApi]]]:
    """nvml_on(spec) -> (node, api): this process's NVML initialised on a fresh node."""
    started: list[NvmlApi] = []

    def start(spec: Any) -> tuple[SimNode, NvmlApi]:
        node = make_node(spec)
        node.preload()
        api = NvmlApi()
        api.init()
        started.append(api)
        return node, api

    yield start
    for api in started:
        api.shutdown()


@pytest.fixture
def start_exporter(
    make_node: Callable[..., SimNode], sim_dir: Path
) -> Iterator[Callable[..., Exporter]]:
    """start_exporter(node, *flags) -> a running gpu-exporter subprocess, ready to scrape."""
    started: list[Exporter] = []

    def start(node: SimNode, *args: str) -> Exporter:
        port = free_port()
        log = sim_dir / f"exporter-{port}.log"
        with log.open("w") as out:
            proc = subprocess.Popen(
                [*EXPORTER, "--listen", f"127.0.0.1:{port}", *args],
                env=base_env(**node.env()),
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
            )
        exporter = Exporter(proc, port, log)
        started.append(exporter)
        exporter.wait_ready()
        return exporter

    yield start
    for exporter in started:
        stop_process(exporter.proc)


# --- the HTTP endpoint in-process ------------------------------------------------------------


@pytest.fixture
def serve(nvml_on: NvmlOn) -> Iterator[Callable[..., tuple[SimNode, CollectLoop, ExporterServer]]]:
    running: list[tuple[CollectLoop, ExporterServer]] = []

    def start(
        spec: str = "l4x2",
        web_config: WebConfig | ReloadingWebConfig | None = None,
        interval: float = 0.1,
    ) -> tuple[SimNode, CollectLoop, ExporterServer]:
        node, api = nvml_on(spec)
        collector = CollectLoop(api, interval=interval)
        server = ExporterServer(
            collector, Renderer(), host="127.0.0.1", port=0, web_config=web_config
        )
        collector.start()
        server.start()
        running.append((collector, server))
        return node, collector, server

    yield start
    for collector, server in running:
        server.stop()
        collector.stop()
