"""Gaps in the record, and every quota change of a second.

``gaps``: spans in which the controller could not follow a kind (a 410 Gone followed by a
relist; downtime its resumed watch could not replay), per cluster and kind; the report names
every gap its period overlaps. ``quota_samples.seq``: the order of a sample among those of the
same second, in the unique key, so several changes in one second are all kept (the peak is
exact). Rows written before this revision are each the only one of their second: seq 0.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD_KEY = ["cluster", "namespace", "quota_name", "resource_name", "observed_at"]


def upgrade() -> None:
    op.create_table(
        "gaps",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("cluster", sa.String(length=253), nullable=False),
        sa.Column("kind", sa.String(length=63), nullable=False),
        sa.Column("started_at", sa.BigInteger(), nullable=False),
        sa.Column("ended_at", sa.BigInteger(), nullable=False),
        sa.Column("reason", sa.String(length=32), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("cluster", "kind", "started_at", name="uq_gap"),
    )
    op.create_index("ix_gaps_window", "gaps", ["cluster", "started_at", "ended_at"])
    # batch mode: SQLite changes a unique constraint by copying the table
    with op.batch_alter_table("quota_samples") as batch:
        batch.add_column(
            sa.Column("seq", sa.Integer(), server_default=sa.text("0"), nullable=False)
        )
        batch.drop_constraint("uq_quota_sample", type_="unique")
        batch.create_unique_constraint("uq_quota_sample", [*_OLD_KEY, "seq"])


def downgrade() -> None:
    # keep the last sample of each second, as the old key allows one
    conn = op.get_bind()
    q = sa.table(
        "quota_samples",
        *(sa.column(c) for c in _OLD_KEY),
        sa.column("seq", sa.Integer),
    )
    later = sa.alias(q, "later")
    conn.execute(
        q.delete().where(
            sa.exists().where(
                *(later.c[c] == q.c[c] for c in _OLD_KEY),
                later.c.seq > q.c.seq,
            )
        )
    )
    with op.batch_alter_table("quota_samples") as batch:
        batch.drop_constraint("uq_quota_sample", type_="unique")
        batch.create_unique_constraint("uq_quota_sample", _OLD_KEY)
        batch.drop_column("seq")
    op.drop_index("ix_gaps_window", table_name="gaps")
    op.drop_table("gaps")
