"""The audit actions the dashboard knows (data in ``actions.toml`` beside this module)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

ACTIONS_FILE = Path(__file__).resolve().parent / "actions.toml"


@dataclass(frozen=True)
class Catalog:
    """``known``: actions offered in the search menu; ``errors``: actions the overview lists
    as recent errors; ``timeline``: action -> label on a sandbox's timeline."""

    known: tuple[str, ...]
    errors: tuple[str, ...]
    timeline: dict[str, str]

    def label(self, action: str) -> str:
        """The timeline label of ``action`` (its raw name when it has none)."""
        return self.timeline.get(action, action)


@lru_cache
def catalog() -> Catalog:
    """The catalog read from ``actions.toml`` (once).

    Raises:
        tomllib.TOMLDecodeError, KeyError: the packaged file is malformed.
    """
    data = tomllib.loads(ACTIONS_FILE.read_text())
    return Catalog(tuple(data["known"]), tuple(data["errors"]), dict(data["timeline"]))
