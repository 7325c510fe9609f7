"""The process-wide objects of one control plane: settings, DB, runtime, templates, pools."""

from __future__ import annotations

from dataclasses import dataclass

from service.config import Settings
from service.db.engine import Database
from service.pool import PoolManager
from service.runtime.base import SandboxRuntime
from service.tasks.registry import TaskRegistry
from service.templates import TemplateRegistry, builtin_templates


@dataclass
class ServiceContext:
    """Everything a request handler or background loop needs, built once per process."""

    settings: Settings
    db: Database
    runtime: SandboxRuntime
    templates: TemplateRegistry
    pools: PoolManager
    tasks: TaskRegistry

    @classmethod
    def build(cls, settings: Settings, *, runtime: SandboxRuntime | None = None) -> ServiceContext:
        """Open the DB (migrated), the Docker runtime and the template registry.

        Raises:
            SandboxError: the Docker engine cannot be reached.
        """
        db = Database(settings.sqlalchemy_url)
        db.migrate()
        if runtime is None:
            from service.runtime.docker import DockerRuntime

            runtime = DockerRuntime.from_settings(settings)
        templates = TemplateRegistry(builtin_templates(settings.image_prefix))
        pools = PoolManager(settings=settings, db=db, runtime=runtime, templates=templates)
        tasks = TaskRegistry.from_root(settings.tasks_dir, collect_errors=True, settings=settings)
        return cls(
            settings=settings, db=db, runtime=runtime, templates=templates, pools=pools, tasks=tasks
        )
