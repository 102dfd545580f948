"""Optional: writes the files of the two Secrets deploy/components/tls-auth refers to, with a
self-signed certificate and a random password, and prints the kubectl commands that create
them. Never needed to build: the Secrets can hold any certificate (cert-manager's, your CA's)
and any password (docs/operations.md, "Turning on TLS and basic auth").

    python3 deploy/components/tls-auth/generate.py [--out DIR] [--user prometheus]

DIR (default ./gpu-exporter-secrets, created) receives:
  gpu-exporter-tls:        tls.crt, tls.key, ca.crt (the self-signed certificate itself)
  gpu-exporter-basic-auth: username, password, web-config.yml (exporter-toolkit format: the
                           user with the password's bcrypt hash, TLS from tls.crt/tls.key)
The certificate names gpu-exporter.<namespace>.svc: Prometheus scrapes pod IPs, so it checks
that name (``tls_config.server_name``) against ca.crt. Keep DIR out of git. Needs the openssl
command and the bcrypt module (in the project's virtual environment).
"""

from __future__ import annotations

import argparse
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

BCRYPT_COST = 12  # exporter-toolkit's recommendation; checks are remembered, not repeated
WEB_CONFIG = "web-config.yml"


def web_config(user: str, bcrypt_hash: str) -> str:
    """The exporter's web config: TLS from the files beside it, one basic-auth user."""
    return (
        "# exporter-toolkit web config (gpu-exporter --web.config.file)\n"
        "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n  min_version: TLS12\n"
        f"basic_auth_users:\n  {user}: '{bcrypt_hash}'\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--user", default="prometheus", help="basic-auth user (default %(default)s)"
    )
    parser.add_argument("--namespace", default="gpuquota", help="for the certificate's name")
    parser.add_argument("--days", type=int, default=825, help="certificate lifetime in days")
    parser.add_argument(
        "--out", type=Path, default=Path("gpu-exporter-secrets"), help="folder to write"
    )
    args = parser.parse_args(argv)
    try:
        import bcrypt
    except ImportError:
        print("generate.py: error: the bcrypt module is missing (pip install bcrypt, or run "
              "it with .venv/bin/python)", file=sys.stderr)  # fmt: skip
        return 1
    openssl = shutil.which("openssl")
    if openssl is None:
        print("generate.py: error: the openssl command is missing (apt-get install openssl)",
              file=sys.stderr)  # fmt: skip
        return 1
    try:
        args.out.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        print(f"generate.py: error: --out {args.out}: {exc.strerror}", file=sys.stderr)
        return 2
    out = args.out
    name = f"gpu-exporter.{args.namespace}.svc"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(out / "tls.key"), "-out", str(out / "tls.crt"),
         "-days", str(args.days), "-subj", f"/CN={name}",
         "-addext", f"subjectAltName=DNS:{name},DNS:gpu-exporter"],
        check=True, capture_output=True,
    )  # fmt: skip
    shutil.copyfile(out / "tls.crt", out / "ca.crt")  # self-signed: its own CA
    password = secrets.token_urlsafe(24)
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=BCRYPT_COST)).decode()
    (out / "username").write_text(args.user)
    (out / "password").write_text(password)
    (out / WEB_CONFIG).write_text(web_config(args.user, hashed))
    for path in out.iterdir():
        path.chmod(0o600)
    ns = args.namespace
    print(f"wrote tls.crt, tls.key, ca.crt, username, password and {WEB_CONFIG} in {out}")
    print("create the Secrets components/tls-auth refers to:")
    print(f"  kubectl -n {ns} create secret generic gpu-exporter-tls --type=kubernetes.io/tls "
          f"--from-file={out}/tls.crt --from-file={out}/tls.key --from-file={out}/ca.crt")  # fmt: skip
    print(f"  kubectl -n {ns} create secret generic gpu-exporter-basic-auth "
          f"--from-file={out}/username --from-file={out}/password --from-file={out}/{WEB_CONFIG}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
