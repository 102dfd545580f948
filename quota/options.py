"""Command-line options shared by the `gpuquota` subcommands (database URL, cluster name)."""

from __future__ import annotations

import argparse
import os

from quota.store.db import DEFAULT_URL, ENV_URL

ENV_CLUSTER = "GPUQUOTA_CLUSTER"
DEFAULT_CLUSTER = "default"


def add_db_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        metavar="URL",
        default=os.environ.get(ENV_URL, DEFAULT_URL),
        help=f"SQLAlchemy URL of the store (env {ENV_URL}; default {DEFAULT_URL}); "
        "PostgreSQL: postgresql+psycopg://user:password@host/database",
    )


def add_cluster_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cluster",
        metavar="NAME",
        default=os.environ.get(ENV_CLUSTER, DEFAULT_CLUSTER),
        help=f"cluster name stored with every row (env {ENV_CLUSTER}; default {DEFAULT_CLUSTER})",
    )
