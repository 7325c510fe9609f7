"""What the scheduler needs to know about tasks and pools, supplied by the API layer.

The scheduler reads only the database; the task registry (CPUs, pass thresholds,
``degrades_to``) and the warm pools (warm sandboxes per template) come in through these
callables so that the scheduler can be tested without either.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


def _no(_suite: str, _task: str) -> bool:
    return False


def _one(_suite: str, _task: str) -> float:
    return 1.0


def _none(_suite: str, _task: str) -> str | None:
    return None


@dataclass(frozen=True)
class Hooks:
    """``warm(suite, task)``: its template has warm sandboxes now. ``cpus(suite, task)``:
    CPUs one sandbox of the task gets. ``threshold(suite, task)``: the reward at or above
    which a sample passed. ``degrades_to(suite, task)``: the easier task it degrades to."""

    warm: Callable[[str, str], bool] = _no
    cpus: Callable[[str, str], float] = _one
    threshold: Callable[[str, str], float] = _one
    degrades_to: Callable[[str, str], str | None] = _none


DEFAULT = Hooks()
