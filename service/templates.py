"""Templates: named sandbox recipes (image, limits, network, workdir, env, sandbox user).

Built-in templates are data (``templates.toml``); task images register theirs at run time
(``TemplateRegistry.register``).

The sandbox user: execs, sessions, kept processes and uploaded files run as / belong to the
template's ``uid``:``gid``. The runtime is given the numbers, so an image need not have a
passwd entry for them (the supervisor then keeps ``HOME`` from the template's env, or ``/``).
A request may name another user (root included) only where ``allow_root`` is set (a root
template always has it): anything else is a 403 (``request_user``).
"""

from __future__ import annotations

import threading
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.errors import Forbidden, NotFound

BUILTIN_TEMPLATES = Path(__file__).with_name("templates.toml")
ROOT_NAMES = frozenset({"root", "0", "0:0", "root:root"})


class Template(BaseModel):
    """A sandbox recipe. Units: ``cpus`` in CPUs, ``memory_mb`` in MiB (memory = memory+swap)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,62}$")
    image: str
    description: str = ""
    cpus: float = Field(1.0, gt=0, le=64)
    memory_mb: int = Field(1024, ge=16, le=256 * 1024)
    pids_limit: int = Field(256, ge=8, le=65536)
    nofile: int = Field(1024, ge=64, le=1 << 20)
    disk_mb: int = Field(
        4096, ge=16, description="Writable-layer budget (enforced where the engine can)."
    )
    network: Literal["none", "bridge"] = "none"
    workdir: str = "/workspace"
    files_root: str = Field("/", description="The file API may not reach outside this directory.")
    user: str = Field("root", min_length=1, max_length=32, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
    uid: int = Field(0, ge=0, lt=1 << 31)
    gid: int = Field(0, ge=0, lt=1 << 31)
    allow_root: bool = Field(
        False, description="A request may run as another user (root included); always for root."
    )
    env: dict[str, str] = Field(default_factory=dict)
    cap_add: tuple[str, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _root_allows_root(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("uid", 0) == 0:
            data = {**data, "allow_root": True}  # root is its own user
        return data

    @model_validator(mode="after")
    def _user_matches_uid(self) -> Template:
        if (self.user == "root") != (self.uid == 0):
            raise ValueError(
                f"user {self.user!r} with uid {self.uid}: root is uid 0 and uid 0 is root"
            )
        return self

    @property
    def exec_user(self) -> str:
        """The identity the runtime gives commands: ``root``, or ``"<uid>:<gid>"`` (numbers,
        so no passwd entry is needed in the image)."""
        return "root" if self.uid == 0 else f"{self.uid}:{self.gid}"


def request_user(template: Template, user: str | None) -> str | None:
    """The runtime identity for a request's ``user`` field; None means the template's own.

    ``user`` None, the template's name, ``"<uid>"`` or ``"<uid>:<gid>"`` is the template's
    user. Any other value switches identity (what only root can do), so it needs
    ``template.allow_root``; it is then passed on as given (a name, ``uid`` or
    ``uid:gid``, looked up in the sandbox's passwd file by the supervisor).

    Raises ``Forbidden`` (403, field ``user``) when the template does not allow it.
    """
    if user is None or user in {template.user, str(template.uid), template.exec_user}:
        return None
    if not template.allow_root:
        raise Forbidden(
            f"template {template.name!r} runs as {template.user} ({template.exec_user}) and "
            f"does not allow other users: user {user!r} refused",
            field="user",
        )
    return user


def builtin_templates(
    image_prefix: str = "crucible", *, path: Path = BUILTIN_TEMPLATES
) -> list[Template]:
    """The templates every deployment has, read from ``path`` (a TOML table per template;
    ``{prefix}`` in ``image`` becomes ``image_prefix``). Images are built by ``crucible
    images build``. Raises ``ValueError`` (pydantic's) for a malformed entry."""
    data = tomllib.loads(path.read_text())
    return [
        Template(name=name, **{**fields, "image": fields["image"].format(prefix=image_prefix)})
        for name, fields in data.items()
    ]


class TemplateRegistry:
    """Thread-safe name -> Template map.

    ``resolver`` makes templates on demand from their name (task templates after a restart:
    a leased sandbox of a task must keep working), returning None for unknown names.
    """

    def __init__(
        self,
        templates: list[Template] | None = None,
        *,
        resolver: Callable[[str], Template | None] | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._templates: dict[str, Template] = {t.name: t for t in templates or []}
        self._resolver = resolver

    def get(self, name: str) -> Template:
        """Return the template; ``NotFound`` (field ``template``) when unknown."""
        with self._lock:
            found = self._templates.get(name)
        if found is None and self._resolver is not None:
            found = self._resolver(name)
            if found is not None:
                self.register(found)
        if found is None:
            raise NotFound(f"unknown template {name!r}", field="template")
        return found

    def peek(self, name: str) -> Template | None:
        """The registered template, or None: never resolved (no I/O, so an event loop may
        call it; ``get`` may make a task's template, which reads the task registry)."""
        with self._lock:
            return self._templates.get(name)

    def register(self, template: Template) -> None:
        """Add or replace a template."""
        with self._lock:
            self._templates[template.name] = template

    def all(self) -> list[Template]:
        """All templates, sorted by name."""
        with self._lock:
            return sorted(self._templates.values(), key=lambda t: t.name)
