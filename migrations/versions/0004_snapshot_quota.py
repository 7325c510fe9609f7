"""snapshot quota: tenants' snapshot limits and usage; each snapshot's bytes and expiry

Tenants that predate this get the default snapshot quota; existing snapshots are charged 0
bytes and never expire (their size was not measured); their count is recomputed from the
live rows at the next start-up reconcile.

Revision ID: 0004_snapshot_quota
Revises: 0003_exactly_once
"""

import sqlalchemy as sa
from alembic import op

revision = "0004_snapshot_quota"
down_revision = "0003_exactly_once"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tenants", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("max_snapshots", sa.Integer(), nullable=False, server_default="64")
        )
        batch_op.add_column(
            sa.Column(
                "max_snapshot_bytes",
                sa.BigInteger(),
                nullable=False,
                server_default=str(20 << 30),
            )
        )
        batch_op.add_column(
            sa.Column("used_snapshots", sa.Integer(), nullable=False, server_default="0")
        )
        batch_op.add_column(
            sa.Column("used_snapshot_bytes", sa.BigInteger(), nullable=False, server_default="0")
        )
    with op.batch_alter_table("snapshots", schema=None) as batch_op:
        batch_op.add_column(sa.Column("bytes", sa.BigInteger(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.create_index("ix_snapshots_expiry", ["deleted_at", "expires_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("snapshots", schema=None) as batch_op:
        batch_op.drop_index("ix_snapshots_expiry")
        batch_op.drop_column("expires_at")
        batch_op.drop_column("bytes")
    with op.batch_alter_table("tenants", schema=None) as batch_op:
        batch_op.drop_column("used_snapshot_bytes")
        batch_op.drop_column("used_snapshots")
        batch_op.drop_column("max_snapshot_bytes")
        batch_op.drop_column("max_snapshots")
