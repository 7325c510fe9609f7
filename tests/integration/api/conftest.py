"""A real control plane over real HTTP: uvicorn in a thread, the real Docker runtime.

Each module gets its own deployment label, SQLite file (or PostgreSQL schema) and
tenants; at the end every container of that deployment and every snapshot image it made is
removed, and nothing else.
"""

from __future__ import annotations

import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import docker
import httpx
import pytest
import uvicorn

from service import tenants
from service.app import create_app
from service.config import Settings
from service.context import ServiceContext
from service.templates import Template
from tests.dbutil import fresh_database


@dataclass
class Stack:
    """A running control plane and clients for its tenants."""

    url: str
    ctx: ServiceContext
    admin: httpx.Client
    alice: httpx.Client
    bob: httpx.Client
    make_client: Callable[..., httpx.Client]

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float = 30.0) -> None:
        """Poll ``predicate`` every 50 ms until true; fail after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.05)
        raise AssertionError(f"condition not met within {timeout_s} s")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_stack(
    tmp: Path,
    *,
    db_kind: str = "sqlite",
    pool_targets: dict[str, int] | None = None,
    **overrides: object,
) -> Iterator[Stack]:
    """Start a control plane; yields a ``Stack``; tears everything down afterwards."""
    deployment = f"test-{secrets.token_hex(4)}"
    with ExitStack() as stack:
        db = stack.enter_context(fresh_database(db_kind, tmp))
        settings = Settings(
            data_dir=tmp,
            database_url=db.url,
            deployment=deployment,
            pool_targets=pool_targets if pool_targets is not None else {"terminal": 1},
            pool_interval_s=0.2,
            **{"max_upload_bytes": 1 << 20, "max_exec_timeout_s": 600, **overrides},
        )
        ctx = ServiceContext.build(settings)
        terminal = ctx.templates.get("terminal")
        ctx.templates.register(
            terminal.model_copy(update={"name": "scoped", "files_root": "/workspace"})
        )
        ctx.templates.register(
            Template(name="tiny", image=terminal.image, cpus=0.5, memory_mb=128, pids_limit=64)
        )
        with ctx.db.session() as s:
            tenants.create_tenant(s, "admin", max_sandboxes=64, max_cpus=64, max_memory_mb=1 << 20)
            tenants.create_tenant(s, "alice", max_sandboxes=16, max_cpus=16, max_memory_mb=1 << 16)
            tenants.create_tenant(s, "bob", max_sandboxes=16, max_cpus=16, max_memory_mb=1 << 16)
            keys = {
                t: tenants.create_key(s, t, scopes={"admin"} if t == "admin" else set())
                for t in ("admin", "alice", "bob")
            }
        port = _free_port()
        server = uvicorn.Server(
            uvicorn.Config(create_app(ctx=ctx), host="127.0.0.1", port=port, log_level="warning")
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 60
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("control plane did not start")
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port}"

        def make_client(key: str | None = None, **kw: object) -> httpx.Client:
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            return stack.enter_context(
                httpx.Client(base_url=url, headers=headers, timeout=120, **kw)
            )

        try:
            yield Stack(
                url=url,
                ctx=ctx,
                admin=make_client(keys["admin"]),
                alice=make_client(keys["alice"]),
                bob=make_client(keys["bob"]),
                make_client=make_client,
            )
        finally:
            server.should_exit = True
            thread.join(timeout=60)
            _cleanup(deployment)


def _cleanup(deployment: str) -> None:
    client = docker.from_env()
    for c in client.containers.list(
        all=True, filters={"label": f"crucible.deployment={deployment}"}
    ):
        c.remove(force=True)
    for img in client.images.list(name=f"crucible-snapshots/{deployment}"):
        client.images.remove(img.id, force=True)
    # Untagged snapshots (a group's prepared snapshot, untagged once forked) carry the label.
    dangling = {"dangling": True, "label": f"crucible.deployment={deployment}"}
    for img in client.images.list(filters=dangling):
        client.images.remove(img.id, force=True)
    client.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from start_stack(tmp_path_factory.mktemp("stack"))
