"""gpuquota/kube/rest.py: the agent's Kubernetes API access without the official client
(issue 28): kubeconfig TLS and credentials as kubectl reads them, refusals in one line, and
an exporter with every API feature that never loads the ``kubernetes`` package."""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
import urllib3

from gpuquota.kube.client import Kube
from gpuquota.kube.rest import KubeConfigError, load


class _Handler(BaseHTTPRequestHandler):
    seen: list[tuple[str, str | None, bool]] = []

    def do_GET(self) -> None:
        peer = self.connection.getpeercert()  # type: ignore[attr-defined]
        self.seen.append((self.path, self.headers.get("Authorization"), bool(peer)))
        body = json.dumps({"kind": "PodList", "items": [{"metadata": {"name": "p"}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def https_server(tls_files: dict[str, Path]) -> Iterator[str]:
    """An HTTPS server for 127.0.0.1 that demands a client certificate of the test CA."""
    server = HTTPServer(("127.0.0.1", 0), _Handler)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(tls_files["ca_crt"]))
    context.load_cert_chain(str(tls_files["server_crt"]), str(tls_files["server_key"]))
    context.verify_mode = ssl.CERT_REQUIRED
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _kubeconfig(path: Path, cluster: dict[str, object], user: dict[str, object]) -> Path:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    }))  # fmt: skip
    return path


def test_ca_data_client_certificate_and_token_file(
    https_server: str, tls_files: dict[str, Path], tmp_path: Path
) -> None:
    def data(name: str) -> str:
        return base64.b64encode(tls_files[name].read_bytes()).decode()

    (tmp_path / "token").write_text("t0ken\n")
    config = _kubeconfig(
        tmp_path / "kubeconfig",
        {"server": https_server, "certificate-authority-data": data("ca_crt")},
        {"client-certificate-data": data("client_crt"), "client-key-data": data("client_key"),
         "tokenFile": "token"},  # relative to the kubeconfig
    )  # fmt: skip
    _Handler.seen.clear()
    answer = Kube(load(str(config))).call("GET", "/api/v1/pods", [("fieldSelector", "a=b")])
    assert answer["items"] == [{"metadata": {"name": "p"}}]
    assert _Handler.seen == [("/api/v1/pods?fieldSelector=a%3Db", "Bearer t0ken", True)]


def test_a_server_the_ca_does_not_vouch_for_is_refused(https_server: str, tmp_path: Path) -> None:
    config = _kubeconfig(tmp_path / "kubeconfig", {"server": https_server}, {"token": "x"})
    with pytest.raises(urllib3.exceptions.SSLError, match="CERTIFICATE_VERIFY_FAILED"):
        Kube(load(str(config))).call("GET", "/version")


@pytest.mark.parametrize(
    ("user", "message"),
    [
        (
            {"exec": {"command": "aws"}},
            "authenticates with 'exec', which gpu-exporter does not run",
        ),
        ({"auth-provider": {"name": "gcp"}}, "'auth-provider'"),
    ],
)
def test_plugins_are_refused_in_one_line(
    tmp_path: Path, user: dict[str, object], message: str
) -> None:
    config = _kubeconfig(tmp_path / "kubeconfig", {"server": "https://x:6443"}, user)
    with pytest.raises(KubeConfigError, match=message) as info:
        load(str(config))
    assert "\n" not in str(info.value)


def test_missing_and_malformed_kubeconfigs_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match="no such file"):
        load(str(tmp_path / "nope"))
    (tmp_path / "bad").write_text("- a\n- b\n")
    with pytest.raises(KubeConfigError, match=f"kubeconfig {tmp_path / 'bad'}: Invalid"):
        load(str(tmp_path / "bad"))
    config = _kubeconfig(tmp_path / "k2", {"server": "x:6443"}, {})
    with pytest.raises(KubeConfigError, match="is not a URL"):
        load(str(config))


def test_the_agent_with_every_api_feature_never_loads_the_official_client(tmp_path: Path) -> None:
    """The 40 MB of issue 28: the exporter's API access (device plugin's node status, DRA,
    pod usage) goes through gpuquota/kube/rest.py."""
    config = _kubeconfig(tmp_path / "kubeconfig", {"server": "http://127.0.0.1:9"}, {"token": "x"})
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from gpuquota.exporter import app\n"
        "from gpuquota.exporter.enrich import slicewatcher, claimreader\n"
        "from gpuquota.exporter.nodestatus import updater\n"
        "from gpuquota.exporter.dra import taints\n"
        "from gpuquota.kube import watch\n"
        "app.kube_api(Path(" + repr(str(config)) + "))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'kubernetes'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout
