"""Persistence: SQLAlchemy 2 models, the engine/session factory, Alembic migrations."""
