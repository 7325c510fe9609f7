"""Routes under /v1/sandboxes/{id}/processes: background processes with handles."""

from __future__ import annotations

import base64

from fastapi import APIRouter, Query, status
from pydantic import Field

from service import processes, sandboxes
from service.api.deps import Ctx, CurrentPrincipal
from service.api.problems import error_responses
from service.errors import InvalidRequest
from service.runtime.keeper import KeptStatus
from service.sandbox_user import with_user
from service.schemas import _Model

router = APIRouter(prefix="/v1/sandboxes", tags=["processes"])


class ProcessIn(_Model):
    """``POST /v1/sandboxes/{id}/processes``: start ``cmd`` detached. ``max_output_bytes``
    is what is kept of each stream (the newest bytes)."""

    cmd: str | list[str] = Field(
        min_length=1,
        description="A shell string (run by /bin/sh -c) or an argv list (a program that "
        "cannot be executed is a 400 naming `cmd`).",
    )
    cwd: str | None = Field(
        None, min_length=1, max_length=4096, description="Start directory (400 if missing)."
    )
    env: dict[str, str] = Field(
        default_factory=dict, max_length=256, description="Environment over the sandbox's."
    )
    max_output_bytes: int | None = Field(
        None,
        ge=0,
        description="Bytes kept of each stream (the newest; older ones are dropped and a "
        "read says how many). Default the exec default.",
    )
    user: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="Run as this user (name, uid or uid:gid); default the template's user. "
        "Another user than the template's is 403 unless the template allows root.",
    )


class ProcessOut(_Model):
    """A background process: ``exit_code`` None while it runs (128+N for signal N);
    ``*_bytes`` written so far, ``*_first`` the oldest offset still kept."""

    handle: int = Field(
        description="Names the process in later calls; it and its output stay until "
        "released (DELETE), even after it exited, and count toward the 64 kept."
    )
    pid: int = Field(description="Its pid inside the sandbox.")
    cmd: str
    running: bool
    exit_code: int | None = Field(description="None while it runs; 128+N: killed by signal N.")
    signal: int | None
    stdout_bytes: int = Field(description="Bytes it wrote to stdout so far (kept or not).")
    stderr_bytes: int = Field(description="Bytes it wrote to stderr so far (kept or not).")
    stdout_first: int = Field(
        description="The oldest stdout offset still kept: a read from before it loses "
        "`stdout_first - offset` bytes (its `dropped`)."
    )
    stderr_first: int = Field(description="The oldest stderr offset still kept.")
    stdin_open: bool
    stdin_pending: int = Field(description="Stdin bytes buffered that it has not read yet.")


class ProcessList(_Model):
    """The sandbox's background processes, oldest first."""

    processes: list[ProcessOut]


class OutputOut(_Model):
    """Bytes ``[offset, next)`` of a stream (``data`` as text, ``data_b64`` raw);
    ``dropped``: asked-for bytes that had left the kept window."""

    data: str = Field(description="The bytes as UTF-8 (invalid bytes replaced).")
    data_b64: str = Field(description="The bytes exactly (base64).")
    offset: int = Field(description="Where `data` starts: the asked offset, or later.")
    next: int = Field(description="The offset to read from next.")
    dropped: int = Field(
        description="Bytes from the asked offset on that had left the kept window "
        "(`max_output_bytes`) before this read: `offset` minus the asked offset."
    )
    process: ProcessOut


class StdinIn(_Model):
    """Bytes for the process's stdin: ``data`` (UTF-8) or ``data_b64``; ``close`` then closes it."""

    data: str | None = Field(None, description="Text (UTF-8). Give this or data_b64.")
    data_b64: str | None = Field(None, description="Raw bytes (base64).")
    close: bool = Field(False, description="Then close stdin (EOF); the bytes are written first.")


class SignalIn(_Model):
    """A signal for the whole tree (default SIGTERM, then SIGKILL after ``grace_ms``)."""

    signal: int = Field(
        15,
        ge=1,
        le=64,
        description="Sent to the process group and every descendant (however detached).",
    )
    grace_ms: int = Field(
        500,
        ge=0,
        le=60_000,
        description="SIGTERM only: then SIGKILL whatever is left after this many ms.",
    )


def process_out(entry: processes.Entry, st: KeptStatus) -> ProcessOut:
    """Entry and state -> API schema."""
    return ProcessOut(
        handle=entry.handle,
        pid=st.pid,
        cmd=entry.cmd,
        running=st.running,
        exit_code=st.exit_code,
        signal=st.signal,
        stdout_bytes=st.stdout_total,
        stderr_bytes=st.stderr_total,
        stdout_first=st.stdout_first,
        stderr_first=st.stderr_first,
        stdin_open=st.stdin_open,
        stdin_pending=st.stdin_pending,
    )


@router.post(
    "/{sandbox_id}/processes",
    status_code=status.HTTP_201_CREATED,
    response_model=ProcessOut,
    responses=error_responses(404, 409, 502),
)
def start(sandbox_id: str, body: ProcessIn, ctx: Ctx, principal: CurrentPrincipal) -> ProcessOut:
    """Start a background process; the handle outlives this call (409 without the exec channel)."""
    req = sandboxes.build_exec_request(
        ctx,
        cmd=body.cmd,
        timeout_s=1.0,
        cwd=body.cwd,
        env={k: v.encode() for k, v in body.env.items()},
        stdin=b"",
        max_output_bytes=body.max_output_bytes,
    )
    req = with_user(ctx, principal, sandbox_id, req, body.user)
    entry, st = processes.start(ctx, principal, sandbox_id, req)
    return process_out(entry, st)


@router.get(
    "/{sandbox_id}/processes", response_model=ProcessList, responses=error_responses(404, 409)
)
def list_(sandbox_id: str, ctx: Ctx, principal: CurrentPrincipal) -> ProcessList:
    """Every background process of the sandbox with its state."""
    rows = processes.list_processes(ctx, principal, sandbox_id)
    return ProcessList(processes=[process_out(e, st) for e, st in rows])


@router.get(
    "/{sandbox_id}/processes/{handle}",
    response_model=ProcessOut,
    responses=error_responses(404, 409, 502),
)
def get(sandbox_id: str, handle: int, ctx: Ctx, principal: CurrentPrincipal) -> ProcessOut:
    """One process's state and exit code."""
    return process_out(*processes.status(ctx, principal, sandbox_id, handle))


@router.get(
    "/{sandbox_id}/processes/{handle}/output",
    response_model=OutputOut,
    responses=error_responses(404, 409, 502),
)
def output(
    sandbox_id: str,
    handle: int,
    ctx: Ctx,
    principal: CurrentPrincipal,
    stream: str = Query("stdout", pattern="^(stdout|stderr)$"),
    offset: int = Query(0, ge=0, le=2**63 - 1),  # the keeper reads a u64 (2**64 was a 500)
    wait_s: float = Query(0.0, ge=0, le=600, description="Wait for bytes past offset."),
) -> OutputOut:
    """A stream's bytes from ``offset`` (kept while nobody read); ``next``: where to go on."""
    out = processes.read_output(
        ctx, principal, sandbox_id, handle, stream=stream, offset=offset, wait_s=wait_s
    )
    entry = processes.entry(sandbox_id, handle, kind="process")
    return OutputOut(
        data=out.data.decode("utf-8", "replace"),
        data_b64=base64.b64encode(out.data).decode(),
        offset=out.offset,
        next=out.next,
        dropped=out.dropped,
        process=process_out(entry, out.status),
    )


@router.post(
    "/{sandbox_id}/processes/{handle}/stdin",
    response_model=ProcessOut,
    responses=error_responses(404, 409, 502),
)
def stdin(
    sandbox_id: str, handle: int, body: StdinIn, ctx: Ctx, principal: CurrentPrincipal
) -> ProcessOut:
    """Write to a running process's stdin (409 when closed or 1 MiB is still unread)."""
    if body.data is not None and body.data_b64 is not None:
        raise InvalidRequest("give data or data_b64, not both", field="data_b64")
    data = body.data.encode() if body.data is not None else b""
    if body.data_b64 is not None:
        try:
            data = base64.b64decode(body.data_b64, validate=True)
        except ValueError as e:
            raise InvalidRequest("data_b64 is not valid base64", field="data_b64") from e
    st = processes.write_stdin(ctx, principal, sandbox_id, handle, data, close=body.close)
    return process_out(processes.entry(sandbox_id, handle, kind="process"), st)


@router.post(
    "/{sandbox_id}/processes/{handle}/signal",
    response_model=ProcessOut,
    responses=error_responses(404, 409, 502),
)
def signal(
    sandbox_id: str, handle: int, body: SignalIn, ctx: Ctx, principal: CurrentPrincipal
) -> ProcessOut:
    """Signal the process and everything it started (however it detached)."""
    st = processes.send_signal(
        ctx, principal, sandbox_id, handle, body.signal, grace_ms=body.grace_ms
    )
    return process_out(processes.entry(sandbox_id, handle, kind="process"), st)


@router.delete(
    "/{sandbox_id}/processes/{handle}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=error_responses(404, 409, 502),
)
def release(sandbox_id: str, handle: int, ctx: Ctx, principal: CurrentPrincipal) -> None:
    """Kill the process's tree and forget the handle."""
    processes.release(ctx, principal, sandbox_id, handle)
