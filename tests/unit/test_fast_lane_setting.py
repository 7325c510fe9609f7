"""``Settings.fast_lane`` (``CRUCIBLE_FAST_LANE``) still reads its former name,
``CRUCIBLE_EXEC_FAST_LANE``; the new name wins when both are set."""

from __future__ import annotations

import pytest

from service.config import Settings


def test_fast_lane_reads_the_new_and_the_former_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CRUCIBLE_FAST_LANE", raising=False)
    monkeypatch.delenv("CRUCIBLE_EXEC_FAST_LANE", raising=False)
    assert Settings().fast_lane is True
    assert Settings(fast_lane=False).fast_lane is False
    monkeypatch.setenv("CRUCIBLE_EXEC_FAST_LANE", "false")
    assert Settings().fast_lane is False
    monkeypatch.setenv("CRUCIBLE_FAST_LANE", "true")
    assert Settings().fast_lane is True
    monkeypatch.delenv("CRUCIBLE_EXEC_FAST_LANE")
    monkeypatch.setenv("CRUCIBLE_FAST_LANE", "false")
    assert Settings().fast_lane is False
