"""The fleet history (issue 29): every GPU's health history by board serial.

``gpu_boards`` (one row per serial), ``gpu_observations`` (stretches a board was seen with the
same placement, versions and verdict), ``gpu_events`` (verdict changes, XIDs, ECC and remap
counters, lost/returned, placement changes, gaps) and ``gpu_history_progress``. See
docs/accounting.md ("Fleet history").

Revision ID: 0011 (first shipped as ``i29_gpu_history``: stores stamped with that name are
read as 0011 and restamped on their next upgrade, quota/store/db.py ``RENAMED``)
Revises: 0010
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _id(name: str = "id") -> sa.Column[int]:
    return sa.Column(name, sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False)


def upgrade() -> None:
    op.create_table(
        "gpu_boards",
        _id(),
        sa.Column("cluster", sa.String(length=253), nullable=False),
        sa.Column("serial", sa.String(length=64), nullable=False),
        sa.Column("first_seen", sa.BigInteger(), nullable=False),
        sa.Column("last_seen", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("cluster", "serial", name="uq_gpu_boards"),
    )
    op.create_table(
        "gpu_observations",
        _id(),
        _id("board_id"),
        sa.Column("window_start", sa.BigInteger(), nullable=False),
        sa.Column("started_at", sa.BigInteger(), nullable=False),
        sa.Column("ended_at", sa.BigInteger(), nullable=False),
        sa.Column("cluster", sa.String(length=253), nullable=False),
        sa.Column("uuid", sa.String(length=64), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("pci_bus_id", sa.String(length=32), nullable=True),
        sa.Column("model", sa.String(length=253), nullable=True),
        sa.Column("driver_version", sa.String(length=64), nullable=True),
        sa.Column("vbios_version", sa.String(length=64), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("lost", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_gpu_observations_board", "gpu_observations", ["board_id", "started_at"])
    op.create_index("ix_gpu_observations_window", "gpu_observations", ["cluster", "window_start"])
    op.create_table(
        "gpu_events",
        _id(),
        _id("board_id"),
        sa.Column("at", sa.BigInteger(), nullable=False),
        sa.Column("seen", sa.BigInteger(), nullable=False),
        sa.Column("cluster", sa.String(length=253), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("key", sa.String(length=128), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_gpu_events_board", "gpu_events", ["board_id", "key", "seen"])
    op.create_index("ix_gpu_events_seen", "gpu_events", ["cluster", "seen"])
    op.create_table(
        "gpu_history_progress",
        sa.Column("cluster", sa.String(length=253), nullable=False),
        sa.Column("window_seconds", sa.Integer(), nullable=False),
        sa.Column("ingested_until", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("cluster"),
    )


def downgrade() -> None:
    op.drop_table("gpu_history_progress")
    op.drop_index("ix_gpu_events_seen", table_name="gpu_events")
    op.drop_index("ix_gpu_events_board", table_name="gpu_events")
    op.drop_table("gpu_events")
    op.drop_index("ix_gpu_observations_window", table_name="gpu_observations")
    op.drop_index("ix_gpu_observations_board", table_name="gpu_observations")
    op.drop_table("gpu_observations")
    op.drop_table("gpu_boards")
