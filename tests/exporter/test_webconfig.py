"""Parsing and checking the exporter-toolkit web config (TLS, basic auth)."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import bcrypt
import pytest

from gpuquota.exporter.expose.webconfig import ReloadingWebConfig, WebConfigError, load

HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "web.yml"
    path.write_text(text)
    return path


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_empty_file_means_no_tls_and_no_auth(tmp_path: Path) -> None:
    config = load(write(tmp_path, ""))
    assert config.ssl_context is None
    assert config.authorized(None)


def test_basic_auth_checks_bcrypt_hashes(tmp_path: Path) -> None:
    config = load(write(tmp_path, f"basic_auth_users:\n  prom: '{HASH}'\n"))
    assert config.users  # auth required
    assert config.authorized(basic("prom", "s3cret"))
    assert config.authorized(basic("prom", "s3cret"))  # the cached path
    assert not config.authorized(basic("prom", "wrong"))
    assert not config.authorized(basic("other", "s3cret"))
    assert not config.authorized(None)
    assert not config.authorized("Bearer abc")
    assert not config.authorized("Basic !!!notbase64")


def test_tls_paths_are_relative_to_the_file(tmp_path: Path, tls_files: dict[str, Path]) -> None:
    for name in ("server_crt", "server_key"):
        (tmp_path / tls_files[name].name).write_bytes(tls_files[name].read_bytes())
    config = load(
        write(
            tmp_path,
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
            "http_server_config:\n  headers:\n    X-Frame-Options: deny\n",
        )
    )
    assert config.ssl_context is not None
    assert config.headers == {"X-Frame-Options": "deny"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tls_server_config: [\n", "not valid YAML"),
        ("- a\n- b\n", "must be a mapping"),
        ("tls_config:\n  cert_file: x\n", "unknown field(s) tls_config"),
        ("tls_server_config:\n  cert_file: a.crt\n", "needs both cert_file and key_file"),
        ("tls_server_config:\n  cert_file: nope.crt\n  key_file: nope.key\n", "does not exist"),
        ("basic_auth_users:\n  prom: plaintext\n", "must be a bcrypt hash"),
        ("basic_auth_users:\n  prom: '$2b$12$short'\n", "not a valid bcrypt hash"),
        ("basic_auth_users: [prom]\n", "must map user names"),
        ("http_server_config:\n  headers: [a]\n", "headers must be a mapping"),
    ],
)
def test_bad_config_names_the_problem(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(
        WebConfigError, match=message.replace("(", r"\(").replace(")", r"\)")
    ) as info:
        load(write(tmp_path, text))
    assert "\n" not in str(info.value)  # one line (issue 18: bad YAML gave five)


def test_tls_settings_are_checked(tmp_path: Path, tls_files: dict[str, Path]) -> None:
    cert, key, ca = tls_files["server_crt"], tls_files["server_key"], tls_files["ca_crt"]
    base = f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
    with pytest.raises(WebConfigError, match="RequireAnyClientCert"):
        load(write(tmp_path, base + "  client_auth_type: RequireAnyClientCert\n"))
    with pytest.raises(WebConfigError, match="needs client_ca_file"):
        load(write(tmp_path, base + "  client_auth_type: RequireAndVerifyClientCert\n"))
    with pytest.raises(WebConfigError, match="min_version"):
        load(write(tmp_path, base + "  min_version: TLS99\n"))
    with pytest.raises(WebConfigError, match="cannot load certificate"):
        load(write(tmp_path, f"tls_server_config:\n  cert_file: {ca}\n  key_file: {key}\n"))
    ok = load(
        write(
            tmp_path,
            base + f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {ca}\n",
        )
    )
    assert ok.ssl_context is not None


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(WebConfigError, match="cannot read web config"):
        load(tmp_path / "absent.yml")


def _touch_later(path: Path, text: str) -> None:
    """Rewrite ``path`` so that its mtime surely differs (coarse filesystem clocks)."""
    before = path.stat().st_mtime_ns
    path.write_text(text)
    os.utime(path, ns=(before + 2_000_000_000, before + 2_000_000_000))


def test_reloads_users_when_the_file_changes(tmp_path: Path, caplog) -> None:
    path = write(tmp_path, f"basic_auth_users:\n  prom: '{HASH}'\n")
    reloading = ReloadingWebConfig(path, check_every=0.0)
    assert reloading.current().authorized(basic("prom", "s3cret"))

    _touch_later(path, f"basic_auth_users:\n  grafana: '{HASH}'\n")
    assert not reloading.current().authorized(basic("prom", "s3cret"))
    assert reloading.current().authorized(basic("grafana", "s3cret"))

    _touch_later(path, "basic_auth_users:\n  grafana: plaintext\n")  # a broken edit
    assert reloading.current().authorized(basic("grafana", "s3cret"))  # previous one stays
    assert "keeping the previous web config" in caplog.text


def test_tls_cannot_be_switched_off_by_a_reload(
    tmp_path: Path, tls_files: dict[str, Path], caplog
) -> None:
    cert, key = tls_files["server_crt"], tls_files["server_key"]
    path = write(tmp_path, f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
    reloading = ReloadingWebConfig(path, check_every=0.0)
    _touch_later(path, "")
    assert reloading.current().ssl_context is not None
    assert "needs a restart" in caplog.text


def test_bad_file_at_start_is_fatal(tmp_path: Path) -> None:
    with pytest.raises(WebConfigError):
        ReloadingWebConfig(write(tmp_path, "nonsense: 1\n"))
