"""MIG profile of an allocation and of node capacity (single-strategy MIG nodes hide it).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("allocations", sa.Column("mig_profile", sa.String(length=32), nullable=True))
    op.add_column("node_capacity", sa.Column("mig_profile", sa.String(length=32), nullable=True))


def downgrade() -> None:
    # a plain DROP COLUMN (SQLite >= 3.35): batch mode would rebuild the tables and lose the
    # expression indexes SQLite cannot reflect
    op.drop_column("node_capacity", "mig_profile")
    op.drop_column("allocations", "mig_profile")
