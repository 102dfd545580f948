"""DRA ResourceClaim allocations: the GPUs a claim holds, charged through the pods using it.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "claim_allocations",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("cluster", sa.String(length=253), nullable=False),
        sa.Column("claim_uid", sa.String(length=64), nullable=False),
        sa.Column("pod_uid", sa.String(length=64), nullable=False),
        sa.Column("resource_name", sa.String(length=253), nullable=False),
        sa.Column("namespace", sa.String(length=253), nullable=False),
        sa.Column("claim_name", sa.String(length=253), nullable=False),
        sa.Column("pod_name", sa.String(length=253), nullable=False),
        sa.Column("owner_kind", sa.String(length=63), nullable=True),
        sa.Column("owner_name", sa.String(length=253), nullable=True),
        sa.Column("node", sa.String(length=253), nullable=True),
        sa.Column("node_pool", sa.String(length=253), nullable=True),
        sa.Column("gpu_model", sa.String(length=253), nullable=True),
        sa.Column("raw_units", sa.Integer(), nullable=False),
        sa.Column("physical_gpus", sa.Float(), nullable=False),
        sa.Column("share_numerator", sa.BigInteger(), nullable=False),
        sa.Column("share_denominator", sa.BigInteger(), nullable=False),
        sa.Column("sharing_strategy", sa.String(length=63), nullable=True),
        sa.Column("mig_profile", sa.String(length=32), nullable=True),
        sa.Column("share_estimated", sa.Boolean(), nullable=False),
        sa.Column("pod_started_at", sa.BigInteger(), nullable=False),
        sa.Column("pod_ended_at", sa.BigInteger(), nullable=True),
        sa.Column("started_at", sa.BigInteger(), nullable=False),
        sa.Column("ended_at", sa.BigInteger(), nullable=True),
        sa.Column("end_reason", sa.String(length=32), nullable=True),
        sa.Column("estimated", sa.Boolean(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint(
            "cluster", "claim_uid", "pod_uid", "resource_name", name="uq_claim_allocation"
        ),
    )
    op.create_index(
        "ix_claim_allocations_window", "claim_allocations", ["cluster", "started_at", "ended_at"]
    )
    op.create_index("ix_claim_allocations_open", "claim_allocations", ["cluster", "pod_ended_at"])


def downgrade() -> None:
    op.drop_index("ix_claim_allocations_open", table_name="claim_allocations")
    op.drop_index("ix_claim_allocations_window", table_name="claim_allocations")
    op.drop_table("claim_allocations")
