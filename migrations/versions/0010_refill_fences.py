"""refill fences: the newest fencing token that wrote each template's warm pool

One row per (deployment, template), made by the first fenced refill write. A refill's
writes (``service.pool.advance_fence``) raise ``token`` to their own in the same
transaction and are refused when a larger one is stored: a refiller whose Redis lock lapsed
cannot add warm sandboxes after a newer holder wrote (Kleppmann's fencing token). Empty
after the upgrade: the first write of each template creates its row.

Revision ID: 0010_refill_fences
Revises: 0009_anomaly_rank
"""

import sqlalchemy as sa
from alembic import op

revision = "0010_refill_fences"
down_revision = "0009_anomaly_rank"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "refill_fences",
        sa.Column("deployment", sa.String(64), primary_key=True),
        sa.Column("template", sa.String(64), primary_key=True),
        sa.Column("token", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("refill_fences")
