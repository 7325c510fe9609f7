"""Background processes on behalf of a tenant: start detached, status, output from an
offset, stdin, signals, list, release (``service.runtime.keeper`` does the work in the
sandbox; this module checks ownership, keeps the handle table and audits).

The handle table lives in this process's memory, as the exec channel does: after a
control-plane restart the sandbox has no channel and its kept processes cannot be reached
(they keep running until the sandbox ends). Every op checks the sandbox is the caller's and
leased; a handle of another sandbox is ``NotFound``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from service import audit
from service.context import ServiceContext
from service.db.models import Sandbox
from service.errors import CrucibleError, NotFound
from service.runtime import keeper
from service.runtime.base import ExecRequest
from service.sandboxes import get_live, runtime_failure
from service.tenants import Principal


@dataclass(slots=True)
class Entry:
    """One kept process as the control plane knows it. ``kind``: process | session."""

    handle: int
    pid: int
    kind: str
    cmd: str
    started_at: float  # unix seconds
    meta: dict[str, Any] = field(default_factory=dict)


_lock = threading.Lock()
_table: dict[str, dict[int, Entry]] = {}  # sandbox id -> handle -> entry


def remember(sandbox_id: str, entry: Entry) -> None:
    """Add ``entry`` to the sandbox's handle table."""
    with _lock:
        _table.setdefault(sandbox_id, {})[entry.handle] = entry


def forget(sandbox_id: str, handle: int) -> None:
    """Drop a handle (released, or found gone)."""
    with _lock:
        _table.get(sandbox_id, {}).pop(handle, None)


def entry(sandbox_id: str, handle: int, *, kind: str) -> Entry:
    """The entry of ``handle`` in this sandbox, of this ``kind``. ``NotFound`` otherwise."""
    with _lock:
        found = _table.get(sandbox_id, {}).get(handle)
    if found is None or found.kind != kind:
        raise NotFound(f"no {kind} {handle} in sandbox {sandbox_id}", field="handle")
    return found


def entries(sandbox_id: str, *, kind: str) -> list[Entry]:
    """The sandbox's entries of ``kind``, oldest first."""
    with _lock:
        rows = [e for e in _table.get(sandbox_id, {}).values() if e.kind == kind]
    return sorted(rows, key=lambda e: e.started_at)


def audit_event(
    ctx: ServiceContext, principal: Principal, row: Sandbox, action: str, details: dict[str, Any]
) -> None:
    """One audit event for an op on a kept process (same chain as ``sandbox.exec``)."""
    with ctx.db.session() as s:
        audit.record(
            s,
            action,
            tenant_id=principal.tenant_id,
            key_id=principal.key_id,
            sandbox_id=row.id,
            details=details,
        )


def _cmd_text(cmd: str | list[str]) -> str:
    return cmd if isinstance(cmd, str) else " ".join(cmd)


def start(
    ctx: ServiceContext, principal: Principal, sandbox_id: str, req: ExecRequest
) -> tuple[Entry, keeper.KeptStatus]:
    """Start ``req`` detached (``req.max_output_bytes`` = bytes kept per stream, newest).

    Raises ``Conflict`` (sandbox not leased, no exec channel, 64 kept already: ended ones
    count until released), ``InvalidRequest`` (cwd, fields; a ``cmd`` list whose program
    cannot be executed: field ``cmd``), ``NotFound`` (not the caller's sandbox).
    """
    row = get_live(ctx, principal, sandbox_id)
    cmd = _cmd_text(req.cmd)
    details: dict[str, Any] = {"cmd": cmd[:4096], "cmd_truncated": len(cmd) > 4096}
    try:
        handle, pid = keeper.spawn(ctx.runtime, row.container_id, req, sandbox_id=sandbox_id)
        st = keeper.status(ctx.runtime, row.container_id, handle)
    except CrucibleError as e:
        audit_event(ctx, principal, row, "sandbox.process.start", {**details, "error": e.detail})
        raise runtime_failure(ctx, principal, sandbox_id, e) from e
    found = Entry(handle=handle, pid=pid, kind="process", cmd=cmd, started_at=time.time())
    remember(sandbox_id, found)
    audit_event(ctx, principal, row, "sandbox.process.start", {**details, "handle": handle})
    return found, st


def _live(
    ctx: ServiceContext, principal: Principal, sandbox_id: str, handle: int
) -> tuple[Sandbox, Entry]:
    row = get_live(ctx, principal, sandbox_id)
    return row, entry(sandbox_id, handle, kind="process")


def status(
    ctx: ServiceContext, principal: Principal, sandbox_id: str, handle: int
) -> tuple[Entry, keeper.KeptStatus]:
    """The process's entry and state now."""
    row, found = _live(ctx, principal, sandbox_id, handle)
    return found, keeper.status(ctx.runtime, row.container_id, handle)


def list_processes(
    ctx: ServiceContext, principal: Principal, sandbox_id: str
) -> list[tuple[Entry, keeper.KeptStatus]]:
    """Every process kept in the sandbox with its state (gone ones are dropped)."""
    row = get_live(ctx, principal, sandbox_id)
    out = []
    for found in entries(sandbox_id, kind="process"):
        try:
            out.append((found, keeper.status(ctx.runtime, row.container_id, found.handle)))
        except NotFound:
            forget(sandbox_id, found.handle)
    return out


def read_output(
    ctx: ServiceContext,
    principal: Principal,
    sandbox_id: str,
    handle: int,
    *,
    stream: str,
    offset: int,
    wait_s: float,
) -> keeper.KeptOutput:
    """Bytes of ``stream`` from ``offset`` (waiting up to ``wait_s`` for new ones)."""
    row, _ = _live(ctx, principal, sandbox_id, handle)
    return keeper.read(
        ctx.runtime, row.container_id, handle, stream=stream, offset=offset, wait_s=wait_s
    )


def write_stdin(
    ctx: ServiceContext,
    principal: Principal,
    sandbox_id: str,
    handle: int,
    data: bytes,
    *,
    close: bool,
) -> keeper.KeptStatus:
    """Queue ``data`` on the process's stdin (and close it with ``close``); audited."""
    row, _ = _live(ctx, principal, sandbox_id, handle)
    st = keeper.write(ctx.runtime, row.container_id, handle, data, close=close)
    audit_event(
        ctx,
        principal,
        row,
        "sandbox.process.stdin",
        {"handle": handle, "bytes": len(data), "close": close},
    )
    return st


def send_signal(
    ctx: ServiceContext,
    principal: Principal,
    sandbox_id: str,
    handle: int,
    signo: int,
    *,
    grace_ms: int,
) -> keeper.KeptStatus:
    """Signal the process's whole tree (``keeper.signal``); audited."""
    row, _ = _live(ctx, principal, sandbox_id, handle)
    st = keeper.signal(ctx.runtime, row.container_id, handle, signo, grace_ms=grace_ms)
    audit_event(ctx, principal, row, "sandbox.process.signal", {"handle": handle, "signal": signo})
    return st


def release(ctx: ServiceContext, principal: Principal, sandbox_id: str, handle: int) -> None:
    """Kill the process's tree and forget the handle; audited."""
    row, _ = _live(ctx, principal, sandbox_id, handle)
    keeper.release(ctx.runtime, row.container_id, handle)
    forget(sandbox_id, handle)
    audit_event(ctx, principal, row, "sandbox.process.release", {"handle": handle})
