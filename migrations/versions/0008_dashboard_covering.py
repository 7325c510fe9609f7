"""dashboard covering indexes: the rewards page and the anomaly monitor read index entries,
not records

A reward record's row carries the whole record as JSON (about 1.3 KB), so a query that
scans the newest 10,000 records to count them touches some 3,000 table pages. These
indexes hold every column the rewards page's counts (``service.dashboard.reward_queries``)
and the anomaly monitor's rankings (``service.anomaly``) read, newest first overall, per
tenant and per domain, so those scans stay inside the index (SQLite, 10,000 records: the
page's counts from about 220 ms to 60 ms, ``compute_anomalies`` from 110 to 30 ms).

- ``ix_rewards_plot`` supersedes ``ix_rewards_created`` (0005), its prefix, which is dropped;
- ``ix_rewards_tenant_plot`` extends ``ix_rewards_tenant`` (kept: ``db/models.py`` declares it);
- ``ix_rewards_domain_plot``: one domain's newest (the page's domain filter, and the
  monitor's per-domain ranking, which it serves in order);
- ``ix_audit_tenant_action``: a tenant's newest events of one action (the overview's recent
  errors), which ``ix_audit_action`` answered by walking every tenant's events of it.

Revision ID: 0008_dashboard_covering
Revises: 0007_checkpoints
"""

from alembic import op

revision = "0008_dashboard_covering"
down_revision = "0007_checkpoints"
branch_labels = None
depends_on = None

PLOT = ["domain", "task_id", "group_id", "status", "reward", "record_id"]

INDEXES = (
    ("ix_rewards_plot", "reward_records", ["created_at", *PLOT, "tenant_id"]),
    ("ix_rewards_tenant_plot", "reward_records", ["tenant_id", "created_at", *PLOT]),
    ("ix_rewards_domain_plot", "reward_records", ["domain", "created_at", *PLOT[1:], "tenant_id"]),
    ("ix_audit_tenant_action", "audit_events", ["tenant_id", "action", "seq"]),
)


def upgrade() -> None:
    for name, table, columns in INDEXES:
        op.create_index(name, table, columns)
    op.drop_index("ix_rewards_created", table_name="reward_records")


def downgrade() -> None:
    op.create_index("ix_rewards_created", "reward_records", ["created_at"])
    for name, table, _ in reversed(INDEXES):
        op.drop_index(name, table_name=table)
