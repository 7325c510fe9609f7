"""Test databases: a fresh SQLite file, or a fresh schema in the test PostgreSQL."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, text

from service.db.engine import Database

POSTGRES_ENV = "CRUCIBLE_TEST_POSTGRES_URL"


def postgres_url() -> str:
    """The test PostgreSQL URL; fails loudly (never skips) when it is not configured."""
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        raise RuntimeError(
            f"{POSTGRES_ENV} is not set: run the tests with `make test`, which starts "
            "PostgreSQL, or point it at a PostgreSQL 15 database"
        )
    return url


@contextmanager
def fresh_database(kind: str, tmp_path: Path) -> Iterator[Database]:
    """A migrated, empty database of ``kind`` ('sqlite' or 'postgres'), dropped afterwards."""
    if kind == "sqlite":
        db = Database(f"sqlite:///{tmp_path / 'crucible.db'}")
        db.migrate()
        try:
            yield db
        finally:
            db.dispose()
        return
    base = postgres_url()
    schema = f"t_{secrets.token_hex(6)}"
    admin = create_engine(base)
    with admin.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    sep = "&" if "?" in base else "?"
    db = Database(f"{base}{sep}options=-csearch_path%3D{schema}")
    try:
        db.migrate()
        yield db
    finally:
        db.dispose()
        with admin.begin() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()
