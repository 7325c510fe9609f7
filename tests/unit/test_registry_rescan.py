"""``TaskRegistry.rescan``: suites added, edited or removed under ``tasks_dir`` while serving
are seen without a restart, no more often than ``tasks_rescan_interval_s``; suites added in
code stay."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from service.config import Settings
from service.errors import NotFound
from service.tasks.loader import load_suite
from service.tasks.registry import TaskRegistry

TB2 = Path(__file__).resolve().parents[1] / "fixtures" / "tasks" / "tb2"


def _registry(root: Path, interval_s: float) -> TaskRegistry:
    settings = Settings(tasks_dir=root, tasks_rescan_interval_s=interval_s)
    return TaskRegistry.from_root(root, collect_errors=True, settings=settings)


def test_added_edited_and_removed_tasks_are_seen(tmp_path: Path) -> None:
    root = tmp_path / "tasks"
    root.mkdir()
    reg = _registry(root, 0.0)
    with pytest.raises(NotFound):
        reg.get("csv-sum", "tb2")
    shutil.copytree(TB2, root / "tb2")
    before = reg.get("csv-sum", "tb2")
    (root / "tb2" / "csv-sum" / "instruction.md").write_text("Sum the column, now.\n")
    after = reg.get("csv-sum", "tb2")
    assert after.instruction.strip() == "Sum the column, now."
    assert after.version != before.version  # a new content hash: a new image
    shutil.rmtree(root / "tb2" / "json-merge")
    assert "json-merge" not in {t.id for t in reg.list(suite="tb2")}
    shutil.rmtree(root / "tb2")
    with pytest.raises(NotFound):
        reg.suite("tb2")
    assert reg.rescan(force=True) is False  # nothing changed since


def test_rescans_wait_for_the_interval_unless_forced(tmp_path: Path) -> None:
    root = tmp_path / "tasks"
    root.mkdir()
    reg = _registry(root, 3600.0)
    shutil.copytree(TB2, root / "tb2")
    assert reg.rescan() is False
    assert [s.name for s in reg.suites()] == []
    assert reg.rescan(force=True) is True
    assert [s.name for s in reg.suites()] == ["tb2"]


def test_suites_added_in_code_stay(tmp_path: Path) -> None:
    root = tmp_path / "tasks"
    (root / "other").mkdir(parents=True)
    reg = _registry(root, 0.0)
    reg.add_suite(load_suite(TB2))
    (root / "other" / "marker").mkdir()  # a change under the root: re-read
    assert reg.rescan(force=True) is True
    assert "tb2" in [s.name for s in reg.suites()]
