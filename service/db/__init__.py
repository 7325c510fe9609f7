"""Persistence: SQLAlchemy 2 models and the engine/session factory (Alembic in ``migrations/``)."""
