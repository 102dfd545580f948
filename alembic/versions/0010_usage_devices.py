"""The usage ledger's devices: ``usage_devices``, one row per device, instead of the device's
UUID, node, GPU model and MIG profile on each of its series (issue #19's storage target: a
series is written per pod and device; a real device UUID alone is 40 bytes, twice, heap and
unique index).

``usage_devices`` is filled from the series (a device's node, model and MIG profile: the
latest non-null value, latest by series id, i.e. of the most recently created series that has
one); ``usage_series`` is rebuilt with ``device_id`` in place of the moved columns, its
unique key (cluster, holder_uid, holder_kind, device_id), series ids kept (usage_windows
refers to them). The rebuild (a new table, the rows copied, the old one dropped: what batch
mode does on SQLite, done the same way on both databases) puts the 8-byte integers first, so
PostgreSQL pads nothing, where adding a column would have appended it. Downgrade puts the
device's values back on each series and drops usage_devices.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD = "usage_series_0009"  # the table being rebuilt, while the new one is filled


def _id() -> sa.Column[int]:
    return sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False)


def _holder_columns() -> list[sa.Column[str]]:
    return [
        sa.Column("holder_kind", sa.String(length=16), nullable=False),
        sa.Column("holder_uid", sa.String(length=64), nullable=False),
        sa.Column("namespace", sa.String(length=253), nullable=False),
        sa.Column("holder_name", sa.String(length=253), nullable=False),
    ]


def _series_with_devices() -> None:
    """usage_series as of this revision (models.UsageSeries)."""
    op.create_table(
        "usage_series",
        _id(),
        sa.Column(
            "device_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column("cluster", sa.String(length=253), nullable=False),
        *_holder_columns(),
        sa.Column("activity", sa.String(length=32), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint(
            "cluster", "holder_uid", "holder_kind", "device_id", name="uq_usage_series"
        ),
    )


def _series_of_0008() -> None:
    """usage_series as migration 0008 created it."""
    op.create_table(
        "usage_series",
        _id(),
        sa.Column("cluster", sa.String(length=253), nullable=False),
        sa.Column("device_uuid", sa.String(length=64), nullable=False),
        *_holder_columns(),
        sa.Column("node", sa.String(length=253), nullable=True),
        sa.Column("gpu_model", sa.String(length=253), nullable=True),
        sa.Column("mig_profile", sa.String(length=32), nullable=True),
        sa.Column("activity", sa.String(length=32), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint(
            "cluster", "holder_uid", "holder_kind", "device_uuid", name="uq_usage_series"
        ),
    )


def _rebuild_series(create: Callable[[], None], copy: str) -> None:
    """Replace usage_series by the table ``create`` makes, filled by ``copy`` (an INSERT ...
    SELECT from OLD), keeping the ids; on PostgreSQL the id sequence goes on after them."""
    postgres = op.get_bind().dialect.name == "postgresql"
    if postgres:
        # free the names the new table's constraints and id sequence take
        seq = op.get_bind().execute(sa.text("SELECT pg_get_serial_sequence('usage_series', 'id')"))
        sequence = seq.scalar()
        op.execute(f"ALTER TABLE usage_series RENAME CONSTRAINT uq_usage_series TO uq_{OLD}")
        op.execute(f"ALTER TABLE usage_series RENAME CONSTRAINT usage_series_pkey TO {OLD}_pkey")
        if sequence:
            op.execute(f"ALTER SEQUENCE {sequence} RENAME TO {OLD}_id_seq")
    op.rename_table("usage_series", OLD)
    create()
    op.execute(copy)
    op.drop_table(OLD)
    if postgres:
        op.execute(
            "SELECT setval(pg_get_serial_sequence('usage_series', 'id'),"
            " COALESCE((SELECT MAX(id) FROM usage_series), 0) + 1, false)"
        )


def upgrade() -> None:
    op.create_table(
        "usage_devices",
        _id(),
        sa.Column("cluster", sa.String(length=253), nullable=False),
        sa.Column("device_uuid", sa.String(length=64), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=True),
        sa.Column("gpu_model", sa.String(length=253), nullable=True),
        sa.Column("mig_profile", sa.String(length=32), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("cluster", "device_uuid", name="uq_usage_devices"),
    )
    # per device, the newest series (highest id) with each label, then its value: one scan
    # of the series and look-ups by primary key
    op.execute(
        """
        INSERT INTO usage_devices (cluster, device_uuid, node, gpu_model, mig_profile)
        SELECT g.cluster, g.device_uuid, n.node, m.gpu_model, p.mig_profile
        FROM (
            SELECT cluster, device_uuid,
                MAX(CASE WHEN node IS NOT NULL THEN id END) AS node_id,
                MAX(CASE WHEN gpu_model IS NOT NULL THEN id END) AS model_id,
                MAX(CASE WHEN mig_profile IS NOT NULL THEN id END) AS mig_id
            FROM usage_series
            GROUP BY cluster, device_uuid
        ) g
        LEFT JOIN usage_series n ON n.id = g.node_id
        LEFT JOIN usage_series m ON m.id = g.model_id
        LEFT JOIN usage_series p ON p.id = g.mig_id
        ORDER BY g.cluster, g.device_uuid
        """
    )
    _rebuild_series(
        _series_with_devices,
        f"""
        INSERT INTO usage_series (id, device_id, cluster, holder_kind, holder_uid, namespace,
            holder_name, activity)
        SELECT s.id, d.id, s.cluster, s.holder_kind, s.holder_uid, s.namespace,
            s.holder_name, s.activity
        FROM {OLD} s
        JOIN usage_devices d ON d.cluster = s.cluster AND d.device_uuid = s.device_uuid
        """,
    )


def downgrade() -> None:
    _rebuild_series(
        _series_of_0008,
        f"""
        INSERT INTO usage_series (id, cluster, device_uuid, holder_kind, holder_uid, namespace,
            holder_name, node, gpu_model, mig_profile, activity)
        SELECT s.id, s.cluster, d.device_uuid, s.holder_kind, s.holder_uid, s.namespace,
            s.holder_name, d.node, d.gpu_model, d.mig_profile, s.activity
        FROM {OLD} s
        JOIN usage_devices d ON d.id = s.device_id
        """,
    )
    op.drop_table("usage_devices")
