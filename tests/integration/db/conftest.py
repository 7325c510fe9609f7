"""Every test here runs twice: on the embedded SQLite file and on PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from service.db.engine import Database
from tests.dbutil import fresh_database


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    with fresh_database(request.param, tmp_path) as database:
        yield database
