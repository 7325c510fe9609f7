"""Tasks: load Harbor (Terminal-Bench 2) and Terminal-Bench 1 task folders into one ``Task``
model, group them in suites, and give each its sandbox image and template.

    load_task(path) -> Task                 one task folder
    load_suite(path) -> Suite               every task folder of a suite, sorted
    discover_suites(root) -> [Suite]        every suite under a root such as ``tasks/``
    TaskRegistry                            suites by name; get, list, ensure_image, template_for

Malformed tasks raise ``service.errors.TaskFormatError`` naming the file and the field.
"""

from service.tasks.loader import discover_suites, load_suite, load_task, task_version
from service.tasks.models import (
    DOMAINS,
    Domain,
    RewardSource,
    Suite,
    Task,
    TaskEnvironment,
    TaskFormat,
)
from service.tasks.registry import (
    TaskRegistry,
    image_repository,
    template_for,
    template_name,
)

__all__ = [
    "DOMAINS",
    "Domain",
    "RewardSource",
    "Suite",
    "Task",
    "TaskEnvironment",
    "TaskFormat",
    "TaskRegistry",
    "discover_suites",
    "image_repository",
    "load_suite",
    "load_task",
    "task_version",
    "template_for",
    "template_name",
]
