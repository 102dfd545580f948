"""TLS and basic auth for the HTTP endpoint, from a Prometheus exporter-toolkit web config.

The file format is the one every official Prometheus exporter reads with
``--web.config.file``::

    tls_server_config:
      cert_file: server.crt          # relative paths are relative to this file
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # optional
      client_ca_file: ca.crt                         # with the Verify* client auth types
      min_version: TLS12                             # optional
    http_server_config:
      headers: {X-Frame-Options: deny}               # optional extra response headers
    basic_auth_users:
      prometheus: $2b$12$...                         # bcrypt hashes

Everything is checked when the file is loaded (the certificate and key are loaded, the
hashes parsed), so a bad file stops the exporter at start with one line naming the problem.
While running, ``ReloadingWebConfig`` re-reads the file when it or a file it names changes
(as exporter-toolkit does), so rotated certificates and changed users take effect without a
restart; a broken edit is logged and the previous config stays in force.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import logging
import secrets
import ssl
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt

log = logging.getLogger(__name__)


class WebConfigError(ValueError):
    """The web config file is unreadable or invalid; the message names the problem."""


# exporter-toolkit client_auth_type -> Python's verify mode. The two "any certificate"
# modes (RequestClientCert, RequireAnyClientCert) accept unverified certificates, which
# Python's ssl module cannot do; they are refused rather than silently made stricter.
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_TOP_KEYS = {"tls_server_config", "http_server_config", "basic_auth_users"}
_TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version",
             "max_version"}  # fmt: skip
_HTTP_KEYS = {"headers", "http2"}
VERDICT_TTL_S = 120.0  # a presented credential's verdict is remembered this long ...
MAX_VERDICTS = 4096  # ... for this many credentials at most (the oldest are forgotten)
# One secret per process keys the remembered verdicts: what sits in memory is an HMAC of the
# Authorization header, never the password, and useless for guessing passwords offline.
_VERDICT_KEY = secrets.token_bytes(32)


def bcrypt_cost(hashed: bytes) -> int:
    """The cost (log2 rounds) of a bcrypt hash: b"$2b$12$..." -> 12."""
    return int(hashed.split(b"$")[2])


@functools.cache
def dummy_hash(cost: int) -> bytes:
    """A hash of the given cost that no password matches in practice: checking an unknown
    user's password against it takes as long as checking a known user's."""
    return bcrypt.hashpw(secrets.token_bytes(16).hex().encode(), bcrypt.gensalt(rounds=cost))


@dataclass(eq=False)
class WebConfig:
    path: Path | None = None
    ssl_context: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    headers: dict[str, str] = field(default_factory=dict)
    files: tuple[Path, ...] = ()  # the config file and the files it names (for reloading)
    _verdicts: OrderedDict[bytes, tuple[bool, float]] = field(
        default_factory=OrderedDict, repr=False
    )
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def dummy_hash(self) -> bytes:
        """Checked for unknown users: the cost of the costliest configured hash."""
        return dummy_hash(max((bcrypt_cost(h) for h in self.users.values()), default=4))

    def remembered(self, header: str | None) -> bool | None:
        """The verdict on ``header`` if it was checked less than VERDICT_TTL_S ago, else None."""
        key = _verdict_key(header)
        with self._lock:
            found = self._verdicts.get(key)
            if found is None:
                return None
            if time.monotonic() - found[1] > VERDICT_TTL_S:
                del self._verdicts[key]
                return None
            return found[0]

    def authorized(self, header: str | None) -> bool:
        """Whether an Authorization header satisfies basic_auth_users (True if none set).

        Known and unknown users cost one bcrypt check of the same cost; the verdict is then
        remembered for VERDICT_TTL_S, so a scraper does not pay bcrypt (~250 ms at cost 12)
        on every scrape.
        """
        if not self.users:
            return True
        remembered = self.remembered(header)
        if remembered is not None:
            return remembered
        ok = self._check(header)
        with self._lock:
            self._verdicts[_verdict_key(header)] = (ok, time.monotonic())
            while len(self._verdicts) > MAX_VERDICTS:
                self._verdicts.popitem(last=False)
        return ok

    def _check(self, header: str | None) -> bool:
        if not header or not header.startswith("Basic "):
            return False
        try:
            decoded = base64.b64decode(header[6:].strip(), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return False
        user, sep, password = decoded.partition(":")
        if not sep:
            return False
        hashed = self.users.get(user)
        ok = bcrypt.checkpw(password.encode(), hashed or self.dummy_hash)
        return ok and hashed is not None


def _verdict_key(header: str | None) -> bytes:
    return hmac.new(_VERDICT_KEY, (header or "").encode(), hashlib.sha256).digest()


def load(path: str | Path) -> WebConfig:
    """Read and check a web config file; raises WebConfigError naming the problem."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise WebConfigError(f"cannot read web config {path}: {exc.strerror}") from None
    import yaml  # only with --web.config.file

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        from gpuquota.cli_common.yamltext import yaml_problem

        raise WebConfigError(f"web config {path} is not valid YAML: {yaml_problem(exc)}") from None
    if data is None:
        return WebConfig(path=path, files=(path,))
    where = f"web config {path}"
    doc = _mapping(data, where, _TOP_KEYS)
    config = WebConfig(path=path, files=(path,))
    if doc.get("tls_server_config") is not None:
        config.ssl_context, named = _tls(
            _mapping(doc["tls_server_config"], f"{where}: tls_server_config", _TLS_KEYS),
            path.parent,
            where,
        )
        config.files += named
    if doc.get("http_server_config") is not None:
        http = _mapping(doc["http_server_config"], f"{where}: http_server_config", _HTTP_KEYS)
        headers = http.get("headers") or {}
        if not isinstance(headers, dict):
            raise WebConfigError(f"{where}: http_server_config.headers must be a mapping")
        config.headers = {str(k): str(v) for k, v in headers.items()}
    users = doc.get("basic_auth_users") or {}
    if not isinstance(users, dict):
        raise WebConfigError(f"{where}: basic_auth_users must map user names to bcrypt hashes")
    for user, hashed in users.items():
        config.users[str(user)] = _bcrypt_hash(hashed, f"{where}: basic_auth_users.{user}")
    if config.users:
        _ = config.dummy_hash  # made now, so the first unknown user is not slower than the rest
    return config


def _mapping(value: Any, where: str, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise WebConfigError(f"{where} must be a mapping")
    unknown = sorted(str(k) for k in value if k not in allowed)
    if unknown:
        raise WebConfigError(
            f"{where}: unknown field(s) {', '.join(unknown)} "
            f"(supported: {', '.join(sorted(allowed))})"
        )
    return value


def _file(value: Any, base: Path, where: str) -> Path:
    if not isinstance(value, str) or not value:
        raise WebConfigError(f"{where} must be a file path")
    path = Path(value)
    path = path if path.is_absolute() else base / path
    if not path.is_file():
        raise WebConfigError(f"{where}: {path} does not exist")
    return path


def _tls(tls: dict[str, Any], base: Path, where: str) -> tuple[ssl.SSLContext, tuple[Path, ...]]:
    if "cert_file" not in tls or "key_file" not in tls:
        raise WebConfigError(f"{where}: tls_server_config needs both cert_file and key_file")
    cert = _file(tls["cert_file"], base, f"{where}: tls_server_config.cert_file")
    key = _file(tls["key_file"], base, f"{where}: tls_server_config.key_file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _version(tls.get("min_version", "TLS12"), "min_version", where)
    if "max_version" in tls:
        context.maximum_version = _version(tls["max_version"], "max_version", where)
    try:
        context.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise WebConfigError(
            f"{where}: cannot load certificate {cert} with key {key}: {exc}"
        ) from None
    auth = tls.get("client_auth_type", "NoClientCert")
    if auth not in _CLIENT_AUTH:
        raise WebConfigError(
            f"{where}: tls_server_config.client_auth_type {auth!r} is not supported "
            f"(use one of {', '.join(_CLIENT_AUTH)})"
        )
    context.verify_mode = _CLIENT_AUTH[auth]
    named: tuple[Path, ...] = (cert, key)
    if auth != "NoClientCert":
        if "client_ca_file" not in tls:
            raise WebConfigError(f"{where}: client_auth_type {auth} needs client_ca_file")
        ca = _file(tls["client_ca_file"], base, f"{where}: tls_server_config.client_ca_file")
        try:
            context.load_verify_locations(cafile=str(ca))
        except (ssl.SSLError, OSError) as exc:
            raise WebConfigError(f"{where}: cannot load client_ca_file {ca}: {exc}") from None
        named += (ca,)
    return context, named


def _version(value: Any, name: str, where: str) -> ssl.TLSVersion:
    if value not in _TLS_VERSIONS:
        raise WebConfigError(
            f"{where}: tls_server_config.{name} {value!r} is not one of {', '.join(_TLS_VERSIONS)}"
        )
    return _TLS_VERSIONS[value]


def _bcrypt_hash(value: Any, where: str) -> bytes:
    if not isinstance(value, str) or not value.startswith(("$2a$", "$2b$", "$2y$")):
        raise WebConfigError(f"{where} must be a bcrypt hash ($2a$/$2b$/$2y$...)")
    hashed = value.encode()
    try:
        bcrypt.checkpw(b"", hashed)
    except ValueError:
        raise WebConfigError(f"{where} is not a valid bcrypt hash") from None
    return hashed


class ReloadingWebConfig:
    """The web config of ``path``, re-read when any of its files changes (checked at most
    every ``check_every`` seconds, on use)."""

    def __init__(self, path: str | Path, *, check_every: float = 1.0) -> None:
        self.path = Path(path)
        self.check_every = check_every
        self._config = load(self.path)  # a bad file at start is fatal (WebConfigError)
        self._stamp = _stamps(self._config.files)
        self._checked = time.monotonic()
        self._lock = threading.Lock()

    def current(self) -> WebConfig:
        now = time.monotonic()
        if now - self._checked < self.check_every:
            return self._config
        with self._lock:
            self._checked = now
            stamp = _stamps(self._config.files)
            if stamp == self._stamp:
                return self._config
            self._stamp = stamp  # whatever happens, report a broken edit once
            try:
                config = load(self.path)
            except WebConfigError as exc:
                log.error("keeping the previous web config: %s", exc)
                return self._config
            if (config.ssl_context is None) != (self._config.ssl_context is None):
                log.error(
                    "keeping the previous web config: %s switches TLS %s, which needs a restart",
                    self.path,
                    "on" if config.ssl_context else "off",
                )
                return self._config
            self._config = config
            self._stamp = _stamps(config.files)
            log.info("reloaded web config %s", self.path)
            return config


def _stamps(files: tuple[Path, ...]) -> tuple[tuple[int, int] | None, ...]:
    out: list[tuple[int, int] | None] = []
    for path in files:
        try:
            st = path.stat()
            out.append((st.st_mtime_ns, st.st_size))
        except OSError:
            out.append(None)
    return tuple(out)
