"""anomaly rank index: a task's verified records newest first, inside the index

The anomaly monitor (``service.anomaly``) counts each task's newest ``window`` verified
records (and finds where each task's newest ``window`` records end, for the dodge rates)
with a LIMIT correlated with the task. This index serves that LIMIT in order and holds
every column it reads (status, reward, domain for per-domain thresholds, tenant),
so it never reads a record's row (about 1.3 KB of JSON). The per-domain ranking is served
by ``ix_rewards_domain_plot`` (0008).

Revision ID: 0009_anomaly_rank
Revises: 0008_dashboard_covering
"""

from alembic import op

revision = "0009_anomaly_rank"
down_revision = "0008_dashboard_covering"
branch_labels = None
depends_on = None

COLUMNS = ["task_id", "created_at", "record_id", "status", "reward", "domain", "tenant_id"]


def upgrade() -> None:
    op.create_index("ix_rewards_task_rank", "reward_records", COLUMNS)


def downgrade() -> None:
    op.drop_index("ix_rewards_task_rank", table_name="reward_records")
