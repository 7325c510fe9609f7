"""Engine and session factory; migrations run through Alembic at start-up.

SQLite (embedded default) runs in WAL mode with ``synchronous=FULL`` (a commit is durable
when it returns) and every transaction starts with
``BEGIN IMMEDIATE`` so concurrent writers queue on the busy timeout instead of failing on
a lock upgrade. PostgreSQL runs at READ COMMITTED; correctness comes from guarded UPDATEs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

import migrations

# Top-level ``migrations/`` (a package, so the wheel ships it with its versions).
MIGRATIONS_DIR = Path(migrations.__file__).resolve().parent


def _sqlite_setup(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        # FULL: WAL synced at every commit, so a committed audit event survives power loss
        # (NORMAL only survives a process crash). docs/architecture.md "Databases".
        cur.execute("PRAGMA synchronous=FULL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # Readers take no write lock (WAL lets them run beside the writer).
        readonly = conn.get_execution_options().get("crucible_readonly", False)
        conn.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")


class Database:
    """Owns the SQLAlchemy engine for one database URL.

    Args:
        url: SQLAlchemy URL (``sqlite:///path`` or ``postgresql+psycopg://...``).
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        if self.is_sqlite:
            path = url.split("///", 1)[1] if "///" in url else ""
            if path and path != ":memory:":
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            self.engine = create_engine(
                url, connect_args={"check_same_thread": False, "timeout": 30}, pool_size=20
            )
            _sqlite_setup(self.engine)
        else:
            self.engine = create_engine(url, pool_size=20, max_overflow=20, pool_pre_ping=True)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._read_sessions = sessionmaker(
            self.engine.execution_options(crucible_readonly=True), expire_on_commit=False
        )

    def migrate(self) -> None:
        """Upgrade the schema to the newest Alembic revision (idempotent)."""
        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
        cfg.attributes["connection_url"] = self.url
        with self.engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session in one transaction: commit on success, roll back on error."""
        with self._sessions() as s, s.begin():
            yield s

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A session for reads only: on SQLite it takes no write lock (rolled back at exit)."""
        with self._read_sessions() as s:  # autobegins; closing rolls back
            yield s

    def ping(self) -> bool:
        """True when the database answers ``SELECT 1``."""
        try:
            with self.engine.connect() as conn:
                conn.exec_driver_sql("SELECT 1")
            return True
        except Exception:  # noqa: BLE001 - readiness probe: any failure means not ready
            return False

    def dispose(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()
