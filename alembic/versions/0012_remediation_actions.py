"""Central pod remediation (issue 35): ``remediation_actions``, one row per pod evicted or
marked for a fenced GPU (or refused), and per opening or closing of the circuit breaker; the
fleet-wide eviction budget is counted from it. See docs/health.md ("Pods on a failed GPU").

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "remediation_actions",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("cluster", sa.String(length=253), nullable=False),
        sa.Column("at", sa.BigInteger(), nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("result", sa.String(length=16), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("namespace", sa.String(length=253), nullable=False),
        sa.Column("pod", sa.String(length=253), nullable=False),
        sa.Column("pod_uid", sa.String(length=64), nullable=False),
        sa.Column("devices", sa.JSON(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_remediation_actions_at", "remediation_actions", ["cluster", "action", "at"])


def downgrade() -> None:
    op.drop_index("ix_remediation_actions_at", table_name="remediation_actions")
    op.drop_table("remediation_actions")
