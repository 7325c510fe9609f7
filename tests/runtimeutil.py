"""Helpers for fixtures that make sandboxes with a given runtime (tests/conftest.py and
modules that override its fixtures)."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from typing import Any

from service.runtime.base import SandboxSpec


def deployment_of(runtime: Any) -> Iterator[str]:
    """A unique deployment label; every container carrying it, and every snapshot made from
    them, is removed at the end (a fixture body)."""
    deployment = f"test-{secrets.token_hex(4)}"
    yield deployment
    for info in runtime.list(deployment=deployment):
        runtime.destroy(info.container_id)
    runtime.prune_snapshots(deployment=deployment)


def sandbox_factory(runtime: Any, deployment: str, image: str) -> Callable[..., str]:
    """``make(**spec_overrides) -> container_id``: sandboxes of ``image`` made by
    ``runtime`` in ``deployment``."""

    def make(**overrides: Any) -> str:
        fields: dict[str, Any] = {
            "sandbox_id": f"sb-{secrets.token_hex(4)}",
            "template": "test",
            "deployment": deployment,
            "image": image,
            "cpus": 1.0,
            "memory_bytes": 512 << 20,
            "pids_limit": 256,
        }
        fields.update(overrides)
        return runtime.create(SandboxSpec(**fields))

    return make
