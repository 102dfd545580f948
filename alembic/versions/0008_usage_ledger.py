"""The usage ledger: what each holder of a GPU used of it (activity and energy), per window.

``usage_series``: one row per (device, holder), holder being a pod, a DRA claim or nobody
(the device's unallocated energy). ``usage_windows``: one row per series and closed window,
ingested from the node agents' counters through Prometheus. ``ledger_progress``: how far
each cluster's ledger is ingested. See docs/accounting.md, "The usage ledger".
Also ``ix_allocations_best_effort``: a partial index of the BestEffort pods' allocations, for
the report's BestEffort-pod check (issue #19's report target).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# models.BEST_EFFORT_SQL as of this revision (a migration does not import the models)
BEST_EFFORT_SQL = "qos_class = 'BestEffort'"


def upgrade() -> None:
    op.create_table(
        "usage_series",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("cluster", sa.String(length=253), nullable=False),
        sa.Column("device_uuid", sa.String(length=64), nullable=False),
        sa.Column("holder_kind", sa.String(length=16), nullable=False),
        sa.Column("holder_uid", sa.String(length=64), nullable=False),
        sa.Column("namespace", sa.String(length=253), nullable=False),
        sa.Column("holder_name", sa.String(length=253), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=True),
        sa.Column("gpu_model", sa.String(length=253), nullable=True),
        sa.Column("mig_profile", sa.String(length=32), nullable=True),
        sa.Column("activity", sa.String(length=32), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint(
            "cluster", "holder_uid", "holder_kind", "device_uuid", name="uq_usage_series"
        ),
    )
    # SQLite: without rowid, the primary key's B-tree is the table; columns ordered so that
    # PostgreSQL pads nothing; one window's figures in single precision (models.UsageWindow)
    op.create_table(
        "usage_windows",
        sa.Column("series_id", sa.BigInteger(), nullable=False),
        sa.Column("window_start", sa.BigInteger(), nullable=False),
        sa.Column("end_used", sa.Float(), nullable=True),
        sa.Column("end_energy", sa.Float(), nullable=True),
        sa.Column("window_seconds", sa.Integer(), nullable=False),
        sa.Column("used_gpu_seconds", sa.REAL(), nullable=False),
        sa.Column("energy_joules", sa.REAL(), nullable=False),
        sa.Column("sampled_seconds", sa.REAL(), nullable=False),
        sa.PrimaryKeyConstraint("series_id", "window_start"),
        sqlite_with_rowid=False,
    )
    op.create_index("ix_usage_windows_start", "usage_windows", ["window_start"])
    op.create_table(
        "ledger_progress",
        sa.Column("cluster", sa.String(length=253), nullable=False),
        sa.Column("window_seconds", sa.Integer(), nullable=False),
        sa.Column("ingested_until", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("cluster"),
    )

    op.create_index(
        "ix_allocations_best_effort",
        "allocations",
        ["cluster", "started_at"],
        postgresql_where=sa.text(BEST_EFFORT_SQL),
        sqlite_where=sa.text(BEST_EFFORT_SQL),
    )


def downgrade() -> None:
    op.drop_index("ix_allocations_best_effort", table_name="allocations")
    op.drop_table("ledger_progress")
    op.drop_index("ix_usage_windows_start", table_name="usage_windows")
    op.drop_table("usage_windows")
    op.drop_table("usage_series")
