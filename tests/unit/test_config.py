"""Settings: the default deployment label belongs to one database."""

from __future__ import annotations

from pathlib import Path

from service.config import Settings


def test_default_deployment_is_per_database(tmp_path: Path) -> None:
    # Regression: every embedded install was deployment "default", so one's start-up
    # reconcile destroyed another's containers on a shared engine.
    a = Settings(data_dir=tmp_path / "a")
    assert a.deployment == Settings(data_dir=tmp_path / "a").deployment
    assert a.deployment != Settings(data_dir=tmp_path / "b").deployment
    assert a.deployment.startswith("crucible-") and len(a.deployment) == len("crucible-") + 10
    pg = Settings(database_url="postgresql+psycopg://u:p@h/db")
    assert pg.deployment != a.deployment
    assert Settings(deployment="mine").deployment == "mine"
