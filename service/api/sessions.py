"""Routes under /v1/sandboxes/{id}/sessions: persistent shells, PTY or not."""

from __future__ import annotations

import base64

from fastapi import APIRouter, Query, status
from pydantic import Field

from service import sessions
from service.api.deps import Ctx, CurrentPrincipal
from service.api.problems import error_responses
from service.runtime.keeper import KeptStatus
from service.schemas import _Model

router = APIRouter(prefix="/v1/sandboxes", tags=["sessions"])
# A session whose keeper is gone (killed in the sandbox): not running, status unknown.
_GONE = KeptStatus(
    pid=0,
    running=False,
    exit_code=None,
    signal=None,
    stdout_total=0,
    stderr_total=0,
    stdout_first=0,
    stderr_first=0,
    stdin_open=False,
    stdin_pending=0,
    marks=0,
    last_rc=-1,
    pty=False,
)


class SessionIn(_Model):
    """``POST /v1/sandboxes/{id}/sessions``: a shell (bash: ``run`` knows when a command
    ends), on a pseudo-terminal of ``rows`` x ``cols`` or on pipes."""

    shell: str = Field(
        "/bin/bash",
        min_length=1,
        max_length=4096,
        description="Absolute path of the shell. bash (by its file name) starts as "
        "`bash --norc --noprofile -i` and can `run`; any other shell gets keys and screen "
        "only (`can_run` false). A path that cannot be executed is a 400 naming `shell`.",
    )
    pty: bool = Field(
        True,
        description="On a pseudo-terminal (TERM=xterm-256color, job control, C-c works). "
        "False: on pipes (TERM=dumb): no foreground detection, C-c is a plain byte, a "
        "partly typed line cannot be erased; `run` output is the shell's stdout only.",
    )
    rows: int = Field(24, ge=1, le=1000, description="Terminal rows (rows x cols <= 32768).")
    cols: int = Field(80, ge=1, le=1000, description="Terminal columns (rows x cols <= 32768).")
    env: dict[str, str] = Field(
        default_factory=dict,
        max_length=256,
        description="Environment for the shell (over PS1='$ ' and TERM; PROMPT_COMMAND is "
        "the session's own).",
    )
    cwd: str | None = Field(
        None, min_length=1, max_length=4096, description="Start directory (400 if missing)."
    )
    max_output_bytes: int | None = Field(
        None,
        ge=1024,
        description="Terminal bytes kept in the sandbox for `screen` (the newest); also the "
        "cap of one `run`'s output (its head and tail kept). Default the exec default.",
    )
    user: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="Run as this user (name, uid or uid:gid); default the template's user. "
        "Another user than the template's is 403 unless the template allows root.",
    )


class SessionOut(_Model):
    """A session: its id, the kept process's handle, its terminal, and its shell's state."""

    id: str
    sandbox_id: str
    handle: int = Field(
        description="The kept process's handle in the sandbox (counts toward the 64 kept)."
    )
    pty: bool
    rows: int
    cols: int
    can_run: bool = Field(description="Whether `run` works: a bash session whose shell still runs.")
    running: bool = Field(
        description="Whether the shell still runs (false too when its keeper does not "
        "answer within 2 s: stopped or killed in the sandbox)."
    )
    exit_code: int | None = Field(
        description="The shell's exit status once it exited (128+N: killed by signal N)."
    )


class SessionList(_Model):
    """The sandbox's sessions."""

    sessions: list[SessionOut]


class RunIn(_Model):
    """One command line; answered when the shell prompts again or after ``timeout_s``. The
    line is written only while the shell is idle at its prompt; a shell still busy after
    1 s (an earlier run's command, a line sent with keys, a foreground program) is a 409
    saying why, with nothing written."""

    command: str = Field(
        min_length=1,
        max_length=1 << 20,
        description="Shell text without NUL; several lines run as one group ({ ...; }), "
        "answered at the prompt after all of them. On a terminal, a line partly typed with "
        "keys is erased first.",
    )
    timeout_s: float = Field(
        60.0,
        gt=0,
        le=24 * 3600,
        description="Seconds to wait for the prompt (at most the server's exec maximum). "
        "A timeout does not stop the command: it keeps running in the shell (later runs "
        "are 409 until it ends); send keys C-c to interrupt it.",
    )


class RunOut(_Model):
    """What the terminal showed while the command ran."""

    output: str = Field(
        description="The terminal's bytes between the command line and the next prompt, "
        "the echo of the line removed (UTF-8, invalid bytes replaced; CRLF on a terminal)."
    )
    output_b64: str = Field(description="`output`'s bytes, exactly (base64).")
    exit_code: int | None = Field(
        description="The command's $?; None when it timed out; the shell's exit status "
        "when the command ended the shell (`shell_exited`)."
    )
    timed_out: bool = Field(description="No prompt within timeout_s: the command still runs.")
    truncated: bool = Field(
        description="Output over max_output_bytes (head and tail kept), or bytes lost "
        "from the ring in the sandbox."
    )
    duration_ms: float
    shell_exited: bool = Field(
        description="The shell is gone (the command was `exit`, or killed it): the session "
        "takes no more runs or keys (409); close it."
    )


class KeysIn(_Model):
    """Keys for the terminal, sent in this order: ``text``, then ``keys``, then ``data_b64``.
    Keys never wait (read the ``screen``); on a terminal C-c flushes what was typed ahead."""

    keys: list[str] = Field(
        default_factory=list,
        max_length=1024,
        description="Key names, tmux's (service/terminal_keys.toml): Enter, Tab, BSpace, "
        "Escape, Space, Up, Down, Right, Left, Home, End, PageUp, PageDown, Delete, C-a, C-b, "
        "C-c, C-d, C-e, C-k, C-l, C-r, C-u, C-w, C-z, C-\\. Any other string is sent as its "
        "own text.",
    )
    text: str | None = Field(
        None, max_length=1 << 20, description="Text typed as is (UTF-8; \n is Enter)."
    )
    data_b64: str | None = Field(None, description="Raw bytes (base64), sent last.")


class ScreenOut(_Model):
    """The terminal as an emulator renders it: ``display`` rows, ``cursor`` [row, col],
    ``scrollback`` lines (oldest first)."""

    display: list[str]
    cursor: list[int]
    scrollback: list[str]
    bytes_total: int = Field(description="Terminal bytes so far (an absolute offset).")
    dropped: int = Field(
        description="Bytes not rendered by this read: lost from the ring in the sandbox "
        "between reads, or past the emulator's time budget per read."
    )
    running: bool = Field(description="Whether the shell still runs.")
    exit_code: int | None = Field(description="The shell's exit status once it exited.")


class ResizeIn(_Model):
    """A new terminal size (rows x cols <= 32768)."""

    rows: int = Field(ge=1, le=1000)
    cols: int = Field(ge=1, le=1000)


def session_out(s: sessions.Session, st: KeptStatus | None = None) -> SessionOut:
    """Session (and its shell's state; none: a session just started) -> API schema."""
    running = True if st is None else st.running
    return SessionOut(
        id=s.id,
        sandbox_id=s.sandbox_id,
        handle=s.handle,
        pty=s.pty,
        rows=s.rows,
        cols=s.cols,
        can_run=s.marks and running,
        running=running,
        exit_code=None if st is None else st.exit_code,
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
        sessions=[
            session_out(s, st or _GONE)
            for s, st in sessions.list_sessions(ctx, principal, sandbox_id)
        ]
    )


@router.post(
    "/{sandbox_id}/sessions/{session_id}/run",
    response_model=RunOut,
    responses=error_responses(404, 409, 502),
)
def run(
    sandbox_id: str, session_id: str, body: RunIn, ctx: Ctx, principal: CurrentPrincipal
) -> RunOut:
    """Run one command line; cwd, env and shell state persist between calls. 409 when the
    shell is busy (nothing written) or exited."""
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
        shell_exited=res.shell_exited,
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
