"""Initial schema of the quota store (matches quota/store/models.py).

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "allocations",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("cluster", sa.String(length=253), nullable=False),
        sa.Column("pod_uid", sa.String(length=64), nullable=False),
        sa.Column("namespace", sa.String(length=253), nullable=False),
        sa.Column("pod_name", sa.String(length=253), nullable=False),
        sa.Column("owner_kind", sa.String(length=63), nullable=True),
        sa.Column("owner_name", sa.String(length=253), nullable=True),
        sa.Column("node", sa.String(length=253), nullable=True),
        sa.Column("node_pool", sa.String(length=253), nullable=True),
        sa.Column("gpu_model", sa.String(length=253), nullable=True),
        sa.Column("resource_name", sa.String(length=253), nullable=False),
        sa.Column("raw_units", sa.Integer(), nullable=False),
        sa.Column("physical_gpus", sa.Float(), nullable=False),
        sa.Column("replicas", sa.Integer(), nullable=True),
        sa.Column("sharing_strategy", sa.String(length=63), nullable=True),
        sa.Column("started_at", sa.BigInteger(), nullable=False),
        sa.Column("ended_at", sa.BigInteger(), nullable=True),
        sa.Column("end_reason", sa.String(length=32), nullable=True),
        sa.Column("estimated", sa.Boolean(), nullable=False),
        sa.Column("qos_class", sa.String(length=16), nullable=True),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("cluster", "pod_uid", "resource_name", name="uq_allocation_pod"),
    )
    op.create_index(
        "ix_allocations_namespace", "allocations", ["cluster", "namespace", "started_at"]
    )
    op.create_index("ix_allocations_open", "allocations", ["cluster", "ended_at"])
    op.create_index("ix_allocations_window", "allocations", ["cluster", "started_at", "ended_at"])

    op.create_table(
        "clusters",
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "heartbeats",
        sa.Column("cluster", sa.String(length=253), nullable=False),
        sa.Column("holder", sa.String(length=253), nullable=False),
        sa.Column("at", sa.BigInteger(), nullable=False),
        sa.Column("resource_versions", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("cluster"),
    )
    op.create_table(
        "namespace_labels",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("cluster", sa.String(length=253), nullable=False),
        sa.Column("namespace", sa.String(length=253), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("valid_from", sa.BigInteger(), nullable=False),
        sa.Column("valid_to", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("cluster", "namespace", "valid_from", name="uq_namespace_labels_from"),
    )
    op.create_index(
        "ix_namespace_labels_lookup", "namespace_labels", ["cluster", "namespace", "valid_from"]
    )

    op.create_table(
        "node_capacity",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("cluster", sa.String(length=253), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("node_pool", sa.String(length=253), nullable=True),
        sa.Column("gpu_model", sa.String(length=253), nullable=True),
        sa.Column("resource_name", sa.String(length=253), nullable=False),
        sa.Column("allocatable_units", sa.Integer(), nullable=False),
        sa.Column("physical_gpus", sa.Float(), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("started_at", sa.BigInteger(), nullable=False),
        sa.Column("ended_at", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint(
            "cluster", "node", "resource_name", "started_at", name="uq_node_capacity_from"
        ),
    )
    op.create_index(
        "ix_node_capacity_node", "node_capacity", ["cluster", "node", "resource_name", "started_at"]
    )
    op.create_index(
        "ix_node_capacity_window", "node_capacity", ["cluster", "started_at", "ended_at"]
    )

    op.create_table(
        "quota_samples",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("cluster", sa.String(length=253), nullable=False),
        sa.Column("namespace", sa.String(length=253), nullable=False),
        sa.Column("quota_name", sa.String(length=253), nullable=False),
        sa.Column("resource_name", sa.String(length=253), nullable=False),
        sa.Column("hard", sa.Float(), nullable=True),
        sa.Column("used", sa.Float(), nullable=True),
        sa.Column("scopes", sa.JSON(), nullable=False),
        sa.Column("observed_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint(
            "cluster",
            "namespace",
            "quota_name",
            "resource_name",
            "observed_at",
            name="uq_quota_sample",
        ),
    )
    op.create_index(
        "ix_quota_samples_lookup",
        "quota_samples",
        ["cluster", "namespace", "resource_name", "observed_at"],
    )


def downgrade() -> None:
    op.drop_index("ix_quota_samples_lookup", table_name="quota_samples")

    op.drop_table("quota_samples")
    op.drop_index("ix_node_capacity_window", table_name="node_capacity")
    op.drop_index("ix_node_capacity_node", table_name="node_capacity")

    op.drop_table("node_capacity")
    op.drop_index("ix_namespace_labels_lookup", table_name="namespace_labels")

    op.drop_table("namespace_labels")
    op.drop_table("heartbeats")
    op.drop_table("clusters")
    op.drop_index("ix_allocations_window", table_name="allocations")
    op.drop_index("ix_allocations_open", table_name="allocations")
    op.drop_index("ix_allocations_namespace", table_name="allocations")

    op.drop_table("allocations")
