"""``cgroups.pids_max_events`` reads the ``max`` counter of a pids cgroup's ``pids.events``."""

from __future__ import annotations

from pathlib import Path

from service.runtime import cgroups


def test_reads_the_max_counter(tmp_path: Path) -> None:
    (tmp_path / "pids.events").write_text("max 17\n")
    assert cgroups.pids_max_events(tmp_path) == 17


def test_finds_max_among_other_keys(tmp_path: Path) -> None:
    (tmp_path / "pids.events").write_text("other 3\nmax 4\n")
    assert cgroups.pids_max_events(tmp_path) == 4


def test_unreadable_or_malformed_is_none(tmp_path: Path) -> None:
    assert cgroups.pids_max_events(tmp_path) is None  # no file
    (tmp_path / "pids.events").write_text("max lots\n")
    assert cgroups.pids_max_events(tmp_path) is None
    (tmp_path / "pids.events").write_text("other 3\n")
    assert cgroups.pids_max_events(tmp_path) is None
