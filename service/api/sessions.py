"""Routes under /v1/sandboxes/{id}/sessions: persistent shells, PTY or not."""

from __future__ import annotations

import base64

from fastapi import APIRouter, Query, status
from pydantic import Field

from service import sessions
from service.api.deps import Ctx, CurrentPrincipal
from service.api.problems import error_responses
from service.schemas import _Model

router = APIRouter(prefix="/v1/sandboxes", tags=["sessions"])


class SessionIn(_Model):
    """``POST /v1/sandboxes/{id}/sessions``: a shell (bash: ``run`` knows when a command
    ends), on a pseudo-terminal of ``rows`` x ``cols`` or on pipes."""

    shell: str = Field("/bin/bash", min_length=1, max_length=4096)
    pty: bool = True
    rows: int = Field(24, ge=1, le=1000)
    cols: int = Field(80, ge=1, le=1000)
    env: dict[str, str] = Field(default_factory=dict, max_length=256)
    cwd: str | None = Field(None, min_length=1, max_length=4096)
    max_output_bytes: int | None = Field(None, ge=1024)
    user: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="Run as this user (name, uid or uid:gid); default the template's user. "
        "Another user than the template's is 403 unless the template allows root.",
    )


class SessionOut(_Model):
    """A session: its id, the kept process's handle, and its terminal."""

    id: str
    sandbox_id: str
    handle: int
    pty: bool
    rows: int
    cols: int
    can_run: bool


class SessionList(_Model):
    """The sandbox's sessions."""

    sessions: list[SessionOut]


class RunIn(_Model):
    """One command line; answered when the shell prompts again or after ``timeout_s``."""

    command: str = Field(min_length=1, max_length=1 << 20)
    timeout_s: float = Field(60.0, gt=0, le=24 * 3600)


class RunOut(_Model):
    """What the terminal showed while the command ran; ``exit_code`` None on timeout."""

    output: str
    output_b64: str
    exit_code: int | None
    timed_out: bool
    truncated: bool
    duration_ms: float


class KeysIn(_Model):
    """Keys for the terminal: ``text``, then ``keys`` names (``Enter``, ``C-c``, ``Up``...;
    others sent as text), then raw ``data_b64``."""

    keys: list[str] = Field(default_factory=list, max_length=1024)
    text: str | None = Field(None, max_length=1 << 20)
    data_b64: str | None = None


class ScreenOut(_Model):
    """The terminal as an emulator renders it: ``display`` rows, ``cursor`` [row, col],
    ``scrollback`` lines (oldest first)."""

    display: list[str]
    cursor: list[int]
    scrollback: list[str]
    bytes_total: int
    dropped: int
    running: bool
    exit_code: int | None


class ResizeIn(_Model):
    """A new terminal size."""

    rows: int = Field(ge=1, le=1000)
    cols: int = Field(ge=1, le=1000)


def session_out(s: sessions.Session) -> SessionOut:
    """Session -> API schema."""
    return SessionOut(
        id=s.id,
        sandbox_id=s.sandbox_id,
        handle=s.handle,
        pty=s.pty,
        rows=s.rows,
        cols=s.cols,
        can_run=s.marks,
    )


@router.post(
    "/{sandbox_id}/sessions",
    status_code=status.HTTP_201_CREATED,
    response_model=SessionOut,
    responses=error_responses(404, 409, 502),
)
def create(sandbox_id: str, body: SessionIn, ctx: Ctx, principal: CurrentPrincipal) -> SessionOut:
    """Start a shell session (409 without the exec channel)."""
    s = sessions.create(
        ctx,
        principal,
        sandbox_id,
        shell=body.shell,
        pty=body.pty,
        rows=body.rows,
        cols=body.cols,
        env={k: v.encode() for k, v in body.env.items()},
        cwd=body.cwd,
        max_output_bytes=body.max_output_bytes,
        user=body.user,
    )
    return session_out(s)


@router.get(
    "/{sandbox_id}/sessions", response_model=SessionList, responses=error_responses(404, 409)
)
def list_(sandbox_id: str, ctx: Ctx, principal: CurrentPrincipal) -> SessionList:
    """The sandbox's sessions."""
    return SessionList(
        sessions=[session_out(s) for s in sessions.list_sessions(ctx, principal, sandbox_id)]
    )


@router.post(
    "/{sandbox_id}/sessions/{session_id}/run",
    response_model=RunOut,
    responses=error_responses(404, 409, 502),
)
def run(
    sandbox_id: str, session_id: str, body: RunIn, ctx: Ctx, principal: CurrentPrincipal
) -> RunOut:
    """Run one command line; cwd, env and shell state persist between calls."""
    res = sessions.run(
        ctx, principal, sandbox_id, session_id, body.command, timeout_s=body.timeout_s
    )
    return RunOut(
        output=res.output.decode("utf-8", "replace"),
        output_b64=base64.b64encode(res.output).decode(),
        exit_code=res.exit_code,
        timed_out=res.timed_out,
        truncated=res.truncated,
        duration_ms=res.duration_ms,
    )


@router.post(
    "/{sandbox_id}/sessions/{session_id}/keys",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=error_responses(404, 409, 502),
)
def keys(
    sandbox_id: str, session_id: str, body: KeysIn, ctx: Ctx, principal: CurrentPrincipal
) -> None:
    """Send keys or text to the terminal (a REPL, a pager, Ctrl-C)."""
    data = sessions.encode_keys(text=body.text, keys=body.keys, data_b64=body.data_b64)
    sessions.send_keys(ctx, principal, sandbox_id, session_id, data)


@router.get(
    "/{sandbox_id}/sessions/{session_id}/screen",
    response_model=ScreenOut,
    responses=error_responses(404, 409, 502),
)
def screen(
    sandbox_id: str,
    session_id: str,
    ctx: Ctx,
    principal: CurrentPrincipal,
    wait_s: float = Query(0.0, ge=0, le=600, description="Wait for new output first."),
) -> ScreenOut:
    """The screen and scrollback as a terminal emulator renders them."""
    v = sessions.screen(ctx, principal, sandbox_id, session_id, wait_s=wait_s)
    return ScreenOut(
        display=v.display,
        cursor=list(v.cursor),
        scrollback=v.scrollback,
        bytes_total=v.bytes_total,
        dropped=v.dropped,
        running=v.running,
        exit_code=v.exit_code,
    )


@router.post(
    "/{sandbox_id}/sessions/{session_id}/resize",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=error_responses(404, 409, 502),
)
def resize(
    sandbox_id: str, session_id: str, body: ResizeIn, ctx: Ctx, principal: CurrentPrincipal
) -> None:
    """Resize the terminal (its foreground job gets SIGWINCH)."""
    sessions.resize(ctx, principal, sandbox_id, session_id, body.rows, body.cols)


@router.delete(
    "/{sandbox_id}/sessions/{session_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=error_responses(404, 409, 502),
)
def close(sandbox_id: str, session_id: str, ctx: Ctx, principal: CurrentPrincipal) -> None:
    """End the shell and everything it started."""
    sessions.close(ctx, principal, sandbox_id, session_id)
