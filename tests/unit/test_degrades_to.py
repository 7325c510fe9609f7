"""``[crucible] degrades_to`` (issue 16, degradation): the loader reads it from task.toml and
the API's scheduler hook hands it to the scheduler only when the easier task is in the same
suite. The scheduler's use of the hook is tested in tests/integration/db/test_scheduler_mixed.py
(``test_k_failures_degrade_to_the_easier_task_or_park``); nothing read it from a task file."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from service import episodes
from service.api import jobs
from service.errors import NotFound, TaskFormatError
from service.tasks import load_task

GOOD = Path(__file__).resolve().parents[1] / "fixtures" / "tasks" / "good"


def _harbor(tmp_path: Path, extra: str) -> Path:
    task = tmp_path / "suite" / "harbor-hello"
    shutil.copytree(GOOD / "harbor-hello", task)
    toml = task / "task.toml"
    text = toml.read_text()
    assert "[crucible]\n" in text
    toml.write_text(text.replace("[crucible]\n", f"[crucible]\n{extra}\n", 1))
    return task


def test_degrades_to_is_read_from_task_toml(tmp_path: Path) -> None:
    assert load_task(GOOD / "harbor-hello").degrades_to is None, "absent: None"
    task = load_task(_harbor(tmp_path, 'degrades_to = "harbor-hello-easy"'))
    assert task.degrades_to == "harbor-hello-easy"


def test_an_empty_degrades_to_is_a_format_error(tmp_path: Path) -> None:
    with pytest.raises(TaskFormatError, match=r"\[crucible\]\.degrades_to"):
        load_task(_harbor(tmp_path, 'degrades_to = ""'))


def test_the_hook_names_only_an_easier_task_of_the_same_suite(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    known = {
        ("s", "hard"): SimpleNamespace(degrades_to="easy"),
        ("s", "easy"): SimpleNamespace(degrades_to=None),
        ("s", "orphan"): SimpleNamespace(degrades_to="gone"),
        ("t", "hard"): SimpleNamespace(degrades_to="easy"),  # suite t has no "easy"
    }

    def resolve(ctx: object, task_id: str, suite: str) -> SimpleNamespace:
        try:
            return known[(suite, task_id)]
        except KeyError:
            raise NotFound(f"no task {suite}/{task_id}") from None

    monkeypatch.setattr(episodes, "resolve_task", resolve)
    hooks = jobs.hooks(SimpleNamespace())  # type: ignore[arg-type]
    assert hooks.degrades_to("s", "hard") == "easy"
    assert hooks.degrades_to("s", "easy") is None
    assert hooks.degrades_to("s", "orphan") is None, "a target the suite lacks: park instead"
    assert hooks.degrades_to("t", "hard") is None, "never a task of another suite"
    assert hooks.degrades_to("s", "unknown") is None
