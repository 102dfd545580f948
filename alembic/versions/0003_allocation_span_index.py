"""Index of allocations by length class and start, for the report's window scans.

"Overlaps [lo, hi)" is not one B-tree range; "length class k and started in [lo - bound_k,
hi)" is, and reads little more than the rows the window needs. The class expression is
gpuquota.quota.store.models.SPAN_CLASS_SQL as of this revision (written out: a migration never changes).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SPAN_CLASS_SQL = (
    "(\nCASE\n"
    "    WHEN (ended_at - started_at) < 3600 THEN 0\n"
    "    WHEN (ended_at - started_at) < 86400 THEN 1\n"
    "    WHEN (ended_at - started_at) < 604800 THEN 2\n"
    "    WHEN (ended_at - started_at) < 3024000 THEN 3\n"
    "    ELSE 4\n"
    "END)"
)


def upgrade() -> None:
    op.create_index(
        "ix_allocations_span",
        "allocations",
        [sa.column("cluster"), sa.text(SPAN_CLASS_SQL), sa.column("started_at")],
    )


def downgrade() -> None:
    op.drop_index("ix_allocations_span", table_name="allocations")
