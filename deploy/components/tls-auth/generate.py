"""Writes the files of deploy/components/tls-auth's Secret: a web config with one basic-auth user,
a self-signed certificate and its key. Prints the password once (keep it for Prometheus).

    python3 deploy/components/tls-auth/generate.py [--user prometheus] [--out DIR]

The certificate names gpu-exporter.<namespace>.svc: Prometheus scrapes pod IPs, so it sets
``tls_config.server_name`` to that name and ``ca_file`` to tls.crt (docs/operations.md).
Needs the openssl command and the bcrypt module (in the project's virtual environment).
"""

from __future__ import annotations

import argparse
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

BCRYPT_COST = 12  # exporter-toolkit's recommendation; checks are remembered, not repeated


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--user", default="prometheus", help="basic-auth user (default %(default)s)"
    )
    parser.add_argument("--namespace", default="gpuquota", help="for the certificate's name")
    parser.add_argument("--days", type=int, default=825, help="certificate lifetime in days")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent, help="folder to write")
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
    if not args.out.is_dir():
        print(f"generate.py: error: --out {args.out}: no such folder", file=sys.stderr)
        return 2
    name = f"gpu-exporter.{args.namespace}.svc"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(args.out / "tls.key"), "-out", str(args.out / "tls.crt"),
         "-days", str(args.days), "-subj", f"/CN={name}",
         "-addext", f"subjectAltName=DNS:{name},DNS:gpu-exporter"],
        check=True, capture_output=True,
    )  # fmt: skip
    (args.out / "tls.key").chmod(0o600)
    password = secrets.token_urlsafe(24)
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=BCRYPT_COST)).decode()
    config = args.out / "web-config.yml"
    config.write_text(
        "# written by generate.py; exporter-toolkit web config format\n"
        "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n  min_version: TLS12\n"
        f"basic_auth_users:\n  {args.user}: '{hashed}'\n"
    )
    config.chmod(0o600)
    print(f"wrote {config}, tls.crt and tls.key in {args.out}")
    print(f"basic auth: user {args.user!r}, password {password!r} (shown only now)")
    print(f"Prometheus: scheme https, tls_config.server_name {name}, ca_file = tls.crt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
