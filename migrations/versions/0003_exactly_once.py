"""exactly-once reward records: sample identity, claim ownership, idempotency keys

A reward record's identity is its sample: ``sample_key`` is ``<work_item_id>/<sample_idx>``
for job episodes and ``ep/<episode_id>`` for ad-hoc ones, unique in the table. Existing rows
are backfilled; where an older version stored two records for one sample, the earliest keeps
the key and the others are marked ``dup/<record_id>`` (kept, never counted twice).

Revision ID: 0003_exactly_once
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003_exactly_once"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("reward_records", schema=None) as batch_op:
        batch_op.add_column(sa.Column("sample_key", sa.String(length=200), nullable=True))
    op.execute(
        "UPDATE reward_records SET sample_key = (SELECT e.work_item_id || '/' || e.sample_idx"
        " FROM episodes e WHERE e.id = reward_records.episode_id AND e.work_item_id IS NOT NULL)"
        " WHERE job_id IS NOT NULL"
    )
    op.execute(
        "UPDATE reward_records SET sample_key = 'ep/' || episode_id WHERE sample_key IS NULL"
    )
    op.execute(
        "UPDATE reward_records SET sample_key = 'dup/' || record_id WHERE EXISTS ("
        "SELECT 1 FROM reward_records r2 WHERE r2.sample_key = reward_records.sample_key"
        " AND (r2.created_at < reward_records.created_at OR (r2.created_at ="
        " reward_records.created_at AND r2.record_id < reward_records.record_id)))"
    )
    with op.batch_alter_table("reward_records", schema=None) as batch_op:
        batch_op.alter_column("sample_key", existing_type=sa.String(length=200), nullable=False)
        batch_op.create_unique_constraint("uq_rewards_sample", ["sample_key"])

    with op.batch_alter_table("episodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("claim_id", sa.String(length=40), nullable=True))
        batch_op.create_index("ix_episodes_claim", ["claim_id"], unique=False)
        batch_op.create_index("ix_episodes_item", ["work_item_id", "sample_idx"], unique=False)
        batch_op.create_index("ix_episodes_state", ["state"], unique=False)

    with op.batch_alter_table("work_items", schema=None) as batch_op:
        batch_op.add_column(sa.Column("claim_id", sa.String(length=40), nullable=True))
        batch_op.add_column(
            sa.Column("claims", sa.Integer(), nullable=False, server_default=sa.text("0"))
        )
        batch_op.create_index("ix_work_items_claim", ["claim_id"], unique=False)
        batch_op.create_index("ix_work_items_expiry", ["state", "claim_expires_at"], unique=False)

    op.create_table(
        "idempotency_keys",
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("scope", sa.String(length=300), nullable=False),
        sa.Column("request_sha256", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("response", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("tenant_id", "key"),
    )
    with op.batch_alter_table("idempotency_keys", schema=None) as batch_op:
        batch_op.create_index("ix_idempotency_created", ["created_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("idempotency_keys", schema=None) as batch_op:
        batch_op.drop_index("ix_idempotency_created")
    op.drop_table("idempotency_keys")
    with op.batch_alter_table("work_items", schema=None) as batch_op:
        batch_op.drop_index("ix_work_items_expiry")
        batch_op.drop_index("ix_work_items_claim")
        batch_op.drop_column("claims")
        batch_op.drop_column("claim_id")
    with op.batch_alter_table("episodes", schema=None) as batch_op:
        batch_op.drop_index("ix_episodes_state")
        batch_op.drop_index("ix_episodes_item")
        batch_op.drop_index("ix_episodes_claim")
        batch_op.drop_column("claim_id")
    with op.batch_alter_table("reward_records", schema=None) as batch_op:
        batch_op.drop_constraint("uq_rewards_sample", type_="unique")
        batch_op.drop_column("sample_key")
