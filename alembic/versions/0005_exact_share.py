"""The exact physical share of one unit of an allocation and of node capacity.

physical_gpus stays (a float the report sums in SQL); share_numerator / share_denominator
keep the share itself exactly (1/7, 3/7, 1/4), so nothing is recovered from a float later.
Rows written before this revision are filled in from their float once, here, with the
small-denominator rational the report used to recover at every read.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# the report's former recovery of a share from the stored float
_MAX_DENOMINATOR = 10_000
_TABLES = {"allocations": "raw_units", "node_capacity": "allocatable_units"}


def upgrade() -> None:
    for table, units in _TABLES.items():
        for column in ("share_numerator", "share_denominator"):
            op.add_column(
                table,
                sa.Column(column, sa.BigInteger(), server_default=sa.text("1"), nullable=False),
            )
        _backfill(table, units)


def _backfill(table: str, units_column: str) -> None:
    conn = op.get_bind()
    t = sa.table(
        table,
        sa.column(units_column, sa.Integer),
        sa.column("physical_gpus", sa.Float),
        sa.column("share_numerator", sa.BigInteger),
        sa.column("share_denominator", sa.BigInteger),
    )
    units_col, physical = t.c[units_column], t.c.physical_gpus
    # a handful of distinct (units, physical) pairs, however many rows
    pairs = conn.execute(sa.select(units_col, physical).distinct()).all()
    for units, physical_gpus in pairs:
        if not units or physical_gpus is None:
            continue
        share = Fraction(physical_gpus).limit_denominator(_MAX_DENOMINATOR) / units
        if share == 1:
            continue
        conn.execute(
            t.update()
            .where(units_col == units, physical == physical_gpus)
            .values(share_numerator=share.numerator, share_denominator=share.denominator)
        )


def downgrade() -> None:
    # a plain DROP COLUMN (SQLite >= 3.35), as in 0004
    for table in reversed(list(_TABLES)):
        op.drop_column(table, "share_denominator")
        op.drop_column(table, "share_numerator")
