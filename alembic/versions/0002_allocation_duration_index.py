"""Expression index on an allocation's length, for the report's window scans.

The report reads the longest closed interval (max(ended_at - started_at)) with one probe of
this index, then scans closed intervals by start time in [window start - longest, window end)
with ix_allocations_window instead of the whole table.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_allocations_duration", "allocations", [sa.text("(ended_at - started_at)")])


def downgrade() -> None:
    op.drop_index("ix_allocations_duration", table_name="allocations")
