"""The Kubernetes API for the node agent without the official client: the kubeconfig or
in-cluster configuration, and raw calls over urllib3, for gpuquota.kube.client.Kube.

gpu-exporter runs on every GPU node, so its memory is paid once per node: importing the
``kubernetes`` package alone costs it about 19 MB (its client, configuration and models
modules), for calls that are plain JSON over HTTPS anyway (docs/benchmarks.md, "The node
agent's memory"). The controller keeps the official client (gpuquota.kube.client.load): its
leader election is the official client's.

What is read, as kubectl reads it: the context (current-context, or the one named); the
cluster's ``server``, ``certificate-authority`` / ``-data`` and ``insecure-skip-tls-verify``;
the user's ``token`` / ``tokenFile``, ``client-certificate`` / ``-data`` and ``client-key`` /
``-data`` (file paths relative to the kubeconfig). Users that run an ``exec`` plugin or an
``auth-provider`` are refused with one line. In a pod: the service account's token (reread
every minute: bound tokens are rotated by the kubelet) and CA, and
``KUBERNETES_SERVICE_HOST``/``_PORT``.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlencode

import urllib3
import yaml
from urllib3 import BaseHTTPResponse

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_S = 60.0


class KubeConfigError(RuntimeError):
    """The kubeconfig or in-cluster configuration cannot be used: one line."""


# TCP keepalive: a dead API server connection is found by the kernel, not by a watch's
# silence (quiet kinds are silent for minutes; ../shared/kube-apiserver.md)
KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_COUNT = 30, 10, 3


def keepalive_options() -> list[tuple[int, int, int]]:
    """urllib3 socket_options: its defaults (no Nagle) plus SO_KEEPALIVE and the probe
    timings where the platform names them."""
    import socket

    from urllib3.connection import HTTPConnection

    options = list(HTTPConnection.default_socket_options)
    options.append((socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1))
    for name, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE),
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
        ("TCP_KEEPCNT", KEEPALIVE_COUNT),
    ):
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    return options


class RestApi:
    """One API server: its address, TLS, credentials and a connection pool."""

    def __init__(
        self,
        host: str,
        ssl_context: ssl.SSLContext | None = None,
        token: str | None = None,
        token_file: Path | None = None,
    ) -> None:
        self.host = host.rstrip("/")
        self.configuration = SimpleNamespace(host=self.host)  # what Kube.host reads
        self._token = token
        self._token_file = token_file
        self._token_read = 0.0
        self._lock = threading.Lock()
        self.pool = urllib3.PoolManager(
            num_pools=4,
            maxsize=8,
            ssl_context=ssl_context,
            socket_options=keepalive_options(),
            retries=False,
        )

    def token(self) -> str | None:
        if self._token_file is not None:
            with self._lock:
                if time.monotonic() - self._token_read > TOKEN_REREAD_S or self._token is None:
                    self._token = self._token_file.read_text().strip()
                    self._token_read = time.monotonic()
        return self._token

    def send(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]],
        headers: dict[str, str],
        body: Any,
        timeout: tuple[float, float],
    ) -> BaseHTTPResponse:
        """One request; the response unread (release it)."""
        url = self.host + path + (("?" + urlencode(query)) if query else "")
        headers = dict(headers)
        token = self.token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None if body is None else json.dumps(body).encode()
        return self.pool.request(
            method,
            url,
            body=data,
            headers=headers,
            preload_content=False,
            redirect=False,
            retries=False,
            timeout=urllib3.Timeout(connect=timeout[0], read=timeout[1]),
        )


def load(kubeconfig: str | None, context: str | None = None) -> RestApi:
    """A RestApi from ``kubeconfig``, else in-cluster, else $KUBECONFIG / ~/.kube/config."""
    try:
        if kubeconfig:
            if not Path(kubeconfig).exists():
                raise KubeConfigError(f"kubeconfig {kubeconfig}: no such file")
            return _from_file(Path(kubeconfig), context)
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            return _in_cluster()
        default = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
        path = Path(default) if default else Path.home() / ".kube" / "config"
        if not path.exists():
            raise KubeConfigError(
                f"kubeconfig {path}: no such file, and not in a pod (no KUBERNETES_SERVICE_HOST)"
            )
        return _from_file(path, context)
    except KubeConfigError:
        raise
    except (OSError, ValueError, TypeError, KeyError, AttributeError, yaml.YAMLError,
            ssl.SSLError) as exc:  # fmt: skip
        where = kubeconfig or "in-cluster/default kubeconfig"
        text = str(exc).strip()
        msg = text.splitlines()[0] if text else type(exc).__name__
        raise KubeConfigError(f"kubeconfig {where}: {msg}") from None


def _in_cluster() -> RestApi:
    host = os.environ["KUBERNETES_SERVICE_HOST"]
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if ":" in host:
        host = f"[{host}]"  # IPv6
    token = SERVICE_ACCOUNT / "token"
    if not token.exists():
        raise KubeConfigError(f"in-cluster: no service account token at {token}")
    context = ssl.create_default_context(cafile=str(SERVICE_ACCOUNT / "ca.crt"))
    return RestApi(f"https://{host}:{port}", context, token_file=token)


def _named(items: Any, name: str, what: str, path: Path) -> dict[str, Any]:
    for item in items or []:
        if isinstance(item, dict) and item.get("name") == name:
            return dict(item.get(what) or {})
    raise KubeConfigError(f"kubeconfig {path}: no {what} named {name!r}")


def _from_file(path: Path, context_name: str | None) -> RestApi:
    config = yaml.safe_load(path.read_text())
    if not isinstance(config, dict):
        raise KubeConfigError(
            f"kubeconfig {path}: Invalid kube-config file. No configuration found."
        )
    name = context_name or config.get("current-context")
    if not name:
        raise KubeConfigError(f"kubeconfig {path}: no current-context and none asked for")
    context = _named(config.get("contexts"), name, "context", path)
    cluster = _named(config.get("clusters"), str(context.get("cluster")), "cluster", path)
    user = (
        _named(config.get("users"), str(context["user"]), "user", path)
        if context.get("user")
        else {}
    )
    server = str(cluster.get("server") or "")
    if not server.startswith(("http://", "https://")):
        raise KubeConfigError(f"kubeconfig {path}: cluster server {server!r} is not a URL")
    for plugin in ("exec", "auth-provider"):
        if plugin in user:
            raise KubeConfigError(
                f"kubeconfig {path}: user {context.get('user')!r} authenticates with "
                f"{plugin!r}, which gpu-exporter does not run: use a token or a client certificate"
            )

    def local(key: str) -> str | None:
        value = cluster.get(key) if key in cluster else user.get(key)
        if not value:
            return None
        file = Path(str(value))
        return str(file if file.is_absolute() else path.parent / file)

    ssl_context = None
    if server.startswith("https://"):
        ca_data = cluster.get("certificate-authority-data")
        ssl_context = ssl.create_default_context(
            cafile=local("certificate-authority"),
            cadata=base64.b64decode(ca_data).decode() if ca_data else None,
        )
        if cluster.get("insecure-skip-tls-verify"):
            ssl_context.check_hostname = False
            ssl_context.verify_mode = ssl.CERT_NONE
        cert, key = _pem(user, "client-certificate", local), _pem(user, "client-key", local)
        if cert and key:
            _load_chain(ssl_context, cert, key)
    token_file = user.get("tokenFile")
    return RestApi(
        server,
        ssl_context,
        token=str(user["token"]) if user.get("token") else None,
        token_file=Path(str(local("tokenFile"))) if token_file and not user.get("token") else None,
    )


def _pem(user: dict[str, Any], key: str, local: Any) -> bytes | None:
    data = user.get(f"{key}-data")
    if data:
        return base64.b64decode(data)
    file = local(key)
    return Path(file).read_bytes() if file else None


def _load_chain(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """ssl loads a client certificate from files only: written to a private temporary folder
    and removed at once."""
    with tempfile.TemporaryDirectory(prefix="gq-kube-") as folder:
        cert_file, key_file = Path(folder) / "client.crt", Path(folder) / "client.key"
        cert_file.write_bytes(cert)
        key_file.touch(mode=0o600)
        key_file.write_bytes(key)
        context.load_cert_chain(str(cert_file), str(key_file))
