"""The usage ledger's roll-up: ``ledger_progress.rolled_until``.

The controller rolls each UTC day's window rows up into one row per run of adjacent windows
(quota/ledger/rules.py roll_up) once none of them can be ingested again; ``rolled_until`` is
the end of the last day rolled up (NULL: none yet). Windows before it are final: they are
never ingested again (their hourly rows are gone).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("ledger_progress", sa.Column("rolled_until", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ledger_progress") as batch:
        batch.drop_column("rolled_until")
