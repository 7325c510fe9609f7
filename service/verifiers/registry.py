"""Which verifier scores which task: ``task.verifier`` names an entry here.

Every verifier has the same signature: ``(task, end: EndState) -> VerifierResult``. It
must not raise for anything the agent did (that is a score) and reports its own
infrastructure failures as ``status="error"`` (never reward 0).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from service.errors import InvalidRequest
from service.runtime.base import SandboxRuntime
from service.tasks.models import Task
from service.templates import Template
from service.verifiers.base import VerifierResult


@dataclass(frozen=True, kw_only=True)
class EndState:
    """An episode's end state as a verifier receives it.

    ``episode_container_id`` is the episode's container, frozen (every process suspended):
    it may be diffed and read engine-side (``diff``, ``get_archive``, ``export_entries``),
    never executed in. ``pristine_image`` is the task image the episode's work is measured
    from (a resumed episode's container runs a checkpoint's image, which derives from it).
    ``fresh_sandbox()`` returns a started container of ``pristine_image`` that nothing has
    touched: taken from the template's warm pool when it has one of that image, else
    created. ``dispose`` removes containers the verifier obtained (in the background).
    """

    runtime: SandboxRuntime
    episode_container_id: str
    pristine_image: str
    template: Template
    deployment: str
    fresh_sandbox: Callable[[], str]
    dispose: Callable[[str], object]


Verifier = Callable[[Task, EndState], VerifierResult]
_VERIFIERS: dict[str, Verifier] = {}


def register(name: str, fn: Verifier) -> None:
    """Make ``fn`` the verifier called ``name``."""
    _VERIFIERS[name] = fn


def get(name: str) -> Verifier:
    """The verifier called ``name``, importing ``service.verifiers.<name>`` on first use (so a
    broken domain module cannot take the others down). ``InvalidRequest`` when none exists."""
    if name not in _VERIFIERS and name.isidentifier():
        try:
            importlib.import_module(f"service.verifiers.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"service.verifiers.{name}":
                raise
    try:
        return _VERIFIERS[name]
    except KeyError:
        raise InvalidRequest(
            f"no verifier named {name!r}; known: {sorted(_VERIFIERS)}", field="verifier"
        ) from None
