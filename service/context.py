"""The process-wide objects of one control plane: settings, DB, runtime, templates, pools."""

from __future__ import annotations

from dataclasses import dataclass

from service import coordination, faults
from service.config import Settings
from service.coordination.tracking import TrackingRuntime
from service.db.engine import Database
from service.events import EventBus
from service.groupcommit import GroupCommitter
from service.keycache import KeyCache
from service.leasecache import LeaseCache
from service.pool import PoolManager
from service.ratelimit import RateLimiter
from service.runtime.base import SandboxRuntime
from service.tasks.registry import TaskRegistry, template_name
from service.templates import Template, TemplateRegistry, builtin_templates


@dataclass
class ServiceContext:
    """Everything a request handler or background loop needs, built once per process."""

    settings: Settings
    db: Database
    runtime: SandboxRuntime
    templates: TemplateRegistry
    pools: PoolManager
    tasks: TaskRegistry
    limiter: RateLimiter
    keys: KeyCache
    events: EventBus
    commits: GroupCommitter  # hot-path audit appends share commits (one fsync per batch)
    leases: LeaseCache  # the exec path's sandbox rows; off on replicas

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

            runtime = faults.wrap(DockerRuntime.from_settings(settings))  # CRUCIBLE_FAULT_*
        tasks = TaskRegistry.from_root(settings.tasks_dir, collect_errors=True, settings=settings)

        def task_template(name: str) -> Template | None:
            """A task's template by name (re-made after a restart from the task's image)."""
            for task in tasks.list():
                if template_name(task) == name:
                    base = f"{settings.image_prefix}/{task.domain}:latest"
                    return tasks.template_for(task, tasks.ensure_image(task, base_image=base))
            return None

        templates = TemplateRegistry(
            builtin_templates(settings.image_prefix), resolver=task_template
        )
        coord = coordination.build(settings)
        if settings.replica and settings.redis_url:  # others may reclaim what we leave
            runtime = TrackingRuntime(runtime, coord)
        pools = PoolManager(
            settings=settings, db=db, runtime=runtime, templates=templates, coordinator=coord
        )
        events = EventBus(coord)
        events.install(db)
        leases = LeaseCache(enabled=not settings.replica)
        leases.install(str(db.engine.url))
        return cls(
            settings=settings,
            db=db,
            runtime=runtime,
            templates=templates,
            pools=pools,
            tasks=tasks,
            limiter=RateLimiter(settings, coord),
            keys=KeyCache(coord, ttl_s=settings.key_cache_ttl_s, read=db.read),
            events=events,
            commits=GroupCommitter(db),
            leases=leases,
        )
