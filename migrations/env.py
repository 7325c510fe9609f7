"""Alembic environment: the connection (or URL) comes from ``service.db.engine.Database``."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from service.db.models import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_online() -> None:
    """Run against the connection handed in by ``Database.migrate`` (or a fresh engine)."""
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=connection.dialect.name == "sqlite",
        )
        with context.begin_transaction():
            context.run_migrations()
        return
    url = config.attributes.get("connection_url") or config.get_main_option("sqlalchemy.url")
    engine = create_engine(url)
    with engine.connect() as conn:
        context.configure(
            connection=conn,
            target_metadata=target_metadata,
            render_as_batch=conn.dialect.name == "sqlite",
        )
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("offline migrations are not supported; run against a database")
run_migrations_online()
