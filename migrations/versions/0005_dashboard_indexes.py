"""dashboard indexes: the dashboard's keyset pages and lookups stay index range scans

- episodes by sandbox (a sandbox's page), by time (the episode list, all tenants) and by
  tenant and time (one tenant's list);
- reward records by time (the rewards page's newest records, all tenants);
- sandboxes by the snapshot they were forked from (a sandbox's forks);
- jobs by time (the job list).

Revision ID: 0005_dashboard_indexes
Revises: 0004_snapshot_quota
"""

from alembic import op

revision = "0005_dashboard_indexes"
down_revision = "0004_snapshot_quota"
branch_labels = None
depends_on = None

INDEXES = (
    ("ix_episodes_sandbox", "episodes", ["sandbox_id"]),
    ("ix_episodes_created", "episodes", ["created_at", "id"]),
    ("ix_episodes_tenant_created", "episodes", ["tenant_id", "created_at", "id"]),
    ("ix_rewards_created", "reward_records", ["created_at"]),
    ("ix_sandboxes_source_snapshot", "sandboxes", ["source_snapshot_id"]),
    ("ix_jobs_created", "jobs", ["created_at", "id"]),
)


def upgrade() -> None:
    for name, table, columns in INDEXES:
        op.create_index(name, table, columns)


def downgrade() -> None:
    for name, table, _ in reversed(INDEXES):
        op.drop_index(name, table_name=table)
