"""Templates: named sandbox recipes (image, limits, network, workdir, env).

Built-in templates are defined here; task images register theirs at run time
(``TemplateRegistry.register``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from service.errors import NotFound


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
    user: str = "root"
    uid: int = 0
    gid: int = 0
    env: dict[str, str] = Field(default_factory=dict)
    cap_add: tuple[str, ...] = ()


def builtin_templates(image_prefix: str = "crucible") -> list[Template]:
    """The templates every deployment has. Images are built by ``crucible images build``."""
    return [
        Template(
            name="terminal",
            image=f"{image_prefix}/terminal:latest",
            description="Debian bookworm with bash, coreutils, python3, pytest, git, procps.",
            cpus=1.0,
            memory_mb=1024,
            pids_limit=256,
            workdir="/workspace",
        ),
        Template(
            name="document",
            image=f"{image_prefix}/document:latest",
            description="PDF and office tooling: poppler-utils, pdfminer.six, pypdf, openpyxl.",
            cpus=1.0,
            memory_mb=1024,
            workdir="/app",
        ),
        Template(
            name="cad",
            image=f"{image_prefix}/cad:latest",
            description="Headless Blender (blender -b --python) with python3 and numpy.",
            cpus=2.0,
            memory_mb=4096,
            workdir="/app",
        ),
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

    def register(self, template: Template) -> None:
        """Add or replace a template."""
        with self._lock:
            self._templates[template.name] = template

    def all(self) -> list[Template]:
        """All templates, sorted by name."""
        with self._lock:
            return sorted(self._templates.values(), key=lambda t: t.name)
