"""checkpoints: an episode's sandbox snapshot plus its trajectory so far, per sample

One row per (work item, sample): the latest checkpoint replaces the previous one (whose
snapshot is deleted). ``state`` is the runner's trajectory so far (turns, chat, token ids,
loss mask, logprobs, timing), opaque to the server.

Revision ID: 0007_checkpoints
Revises: 0006_scheduling
"""

import sqlalchemy as sa
from alembic import op

revision = "0007_checkpoints"
down_revision = "0006_scheduling"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "checkpoints",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("tenant_id", sa.String(64), sa.ForeignKey("tenants.id"), nullable=False),
        sa.Column("work_item_id", sa.String(40), nullable=False),
        sa.Column("sample_idx", sa.Integer(), nullable=False),
        sa.Column("episode_id", sa.String(40), nullable=False),
        sa.Column("turn", sa.Integer(), nullable=False),
        sa.Column("snapshot_id", sa.String(40), nullable=False),
        sa.Column("state", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("work_item_id", "sample_idx", name="uq_checkpoints_sample"),
    )


def downgrade() -> None:
    op.drop_table("checkpoints")
