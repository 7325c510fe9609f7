"""Engine and session factory; migrations run through Alembic at start-up.

SQLite (embedded default) runs in WAL mode with ``synchronous=FULL`` (a commit is durable
when it returns) and every transaction starts with
``BEGIN IMMEDIATE`` so concurrent writers queue on the busy timeout instead of failing on
a lock upgrade. PostgreSQL runs at READ COMMITTED; correctness comes from guarded UPDATEs.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

import migrations
from service.errors import InvalidRequest

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


_BIND_SUFFIX = re.compile(r"_\d+$")  # SQLAlchemy numbers repeated bind names: worker_1


def _refuse_nul(engine: Engine) -> None:
    """Refuse text holding U+0000 before it reaches the database, on both backends alike.

    PostgreSQL's text refuses NUL: a worker, an error, an id or a filter carrying one was a
    500 there (trial 29: 24 routes' fields, where SQLite stored it). Every statement's bound
    text is checked here, whichever route or field it came from; JSON is bound serialized
    (NUL escaped), so metadata and trajectories keep theirs. The transaction rolls back,
    so nothing stored changes.

    Raises:
        InvalidRequest: naming the bound column or parameter (``worker``, ``task_id``).
    """

    @event.listens_for(engine, "before_cursor_execute")
    def _check(
        _conn: Any, _cursor: Any, _sql: str, parameters: Any, context: Any, executemany: bool
    ) -> None:
        rows = parameters if executemany else (parameters,)
        for row in rows:
            if isinstance(row, dict):
                items = row.items()
            elif isinstance(row, (tuple, list)):
                names = getattr(getattr(context, "compiled", None), "positiontup", None)
                items = zip(names or ("value",) * len(row), row, strict=False)
            else:
                continue
            for name, value in items:
                if isinstance(value, str) and "\x00" in value:
                    field = _BIND_SUFFIX.sub("", name)
                    raise InvalidRequest(
                        f"{field} holds a NUL character (U+0000), which text cannot store",
                        field=field,
                    )


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
        _refuse_nul(self.engine)
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
