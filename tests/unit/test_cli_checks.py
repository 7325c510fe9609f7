"""CLI commands that check or export must not make what they check, nor guess a format
(issue 11): ``crucible audit verify`` with no database, ``crucible rewards export x.csv``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from service.cli import app
from service.config import get_settings
from service.db.engine import Database


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    where = tmp_path / "data"
    monkeypatch.setenv("CRUCIBLE_DATA_DIR", str(where))
    monkeypatch.delenv("CRUCIBLE_DATABASE_URL", raising=False)
    get_settings.cache_clear()
    yield where
    get_settings.cache_clear()


def test_audit_verify_without_a_database_fails_and_creates_nothing(data_dir: Path) -> None:
    # Regression: it created an empty database and reported "intact: 0 events", exit 0.
    result = CliRunner().invoke(app, ["audit", "verify"])
    assert result.exit_code == 1, result.output
    assert "no database at" in result.output
    assert not data_dir.exists()


def test_audit_verify_of_a_file_without_the_schema_fails(data_dir: Path) -> None:
    data_dir.mkdir()
    (data_dir / "crucible.db").write_bytes(b"")
    result = CliRunner().invoke(app, ["audit", "verify"])
    assert result.exit_code == 1 and "no Crucible audit log" in result.output
    assert (data_dir / "crucible.db").stat().st_size == 0


def test_audit_verify_of_a_real_database(data_dir: Path) -> None:
    db = Database(get_settings().sqlalchemy_url)
    db.migrate()
    db.dispose()
    result = CliRunner().invoke(app, ["audit", "verify", "--json"])
    assert result.exit_code == 0, result.output
    assert '"first_broken_seq": null' in result.output


@pytest.mark.parametrize("name", ["x.csv", "x", "x.json", "x.parquet.gz"])
def test_rewards_export_refuses_unknown_extensions(tmp_path: Path, name: str) -> None:
    # Regression: x.csv received JSONL. No server is asked: the name is checked first.
    out = tmp_path / name
    result = CliRunner().invoke(
        app, ["rewards", "export", str(out), "--url", "http://127.0.0.1:9", "--api-key", "k"]
    )
    assert result.exit_code == 2, result.output
    assert "*.jsonl or" in result.output and "*.parquet" in result.output
    assert not out.exists()


def test_keys_create_sets_the_snapshot_quota(data_dir: Path) -> None:
    from service.db.models import Tenant

    args = ["keys", "create", "--tenant", "t1", "--max-snapshots", "3"]
    result = CliRunner().invoke(app, [*args, "--max-snapshot-bytes", "1000"])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(app, ["keys", "create", "--tenant", "t1"])  # keeps it
    db = Database(get_settings().sqlalchemy_url)
    with db.read() as s:
        t = s.get(Tenant, "t1")
        assert (t.max_snapshots, t.max_snapshot_bytes, t.used_snapshots) == (3, 1000, 0)
    db.dispose()
