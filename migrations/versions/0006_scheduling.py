"""scheduling: mixed-domain jobs, budgets, degradation, stragglers, bounded staleness

- jobs.schedule: the job's schedule (JSON; ``service.scheduler.spec.Schedule``);
- jobs.policy_version: the newest policy version a claim of the job carried;
- work_items.suite: the item's suite (a mixed job's items span suites; NULL: the job's);
- work_items.policy_version: the version the current claim samples with;
- work_items.claimed_at / duration_s: when the current claim began; how long the item's
  successful claim ran (shortest-expected-first and long-tail timeouts read it);
- work_items.meta: origin (budget, degraded_from), stragglers, staleness flags (JSON).

Revision ID: 0006_scheduling
Revises: 0005_dashboard_indexes
"""

import sqlalchemy as sa
from alembic import op

revision = "0006_scheduling"
down_revision = "0005_dashboard_indexes"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as t:
        t.add_column(sa.Column("schedule", sa.JSON(), nullable=True))
        t.add_column(sa.Column("policy_version", sa.Integer(), nullable=True))
    with op.batch_alter_table("work_items") as t:
        t.add_column(sa.Column("suite", sa.String(200), nullable=True))
        t.add_column(sa.Column("policy_version", sa.Integer(), nullable=True))
        t.add_column(sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True))
        t.add_column(sa.Column("duration_s", sa.Float(), nullable=True))
        t.add_column(sa.Column("meta", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("work_items") as t:
        for name in ("meta", "duration_s", "claimed_at", "policy_version", "suite"):
            t.drop_column(name)
    with op.batch_alter_table("jobs") as t:
        t.drop_column("policy_version")
        t.drop_column("schedule")
