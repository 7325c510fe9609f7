"""Terminal sessions: a persistent shell, on a pseudo-terminal or on pipes, kept by the
sandbox's supervisor (``service.runtime.keeper``), with a terminal emulator (``pyte``) here.

- ``run``: writes one command line and answers when the shell's next prompt is reported on
  the mark pipe (``PROMPT_COMMAND`` writes ``$?`` to fd 63, which the supervisor owns), so
  completion is known without scraping the output. A command of several lines is sent as
  one group (``{ ...\n}``), so the answer comes at the prompt after all of it (heredocs,
  quoted strings and ``if ... fi`` over lines included).
- ``keys``: raw text or named keys (``terminal_keys.toml``) to the terminal.
- ``screen``: every byte the terminal showed since the last read, fed to a ``pyte``
  ``HistoryScreen``; returns the display, the cursor and the scrollback.
- ``resize``, ``close``.

The shell is ``bash --norc --noprofile -i`` (``PS1='$ '`` unless the caller sets it); any
other shell runs without ``run`` (``keys``/``screen`` work). cwd, env and shell state live in
the shell, so they persist between calls. Output caps, timeouts and audit events match exec.
"""

from __future__ import annotations

import base64
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyte

from service import processes
from service.context import ServiceContext
from service.errors import Conflict, CrucibleError, InvalidRequest, NotFound
from service.ids import new_id
from service.runtime import keeper
from service.runtime.base import ExecRequest
from service.sandbox_user import with_user
from service.sandboxes import get_live, runtime_failure
from service.tenants import Principal

KEYS: dict[str, str] = tomllib.loads((Path(__file__).with_name("terminal_keys.toml")).read_text())[
    "keys"
]
# OSC 133;D ("command finished", the FinalTerm shell-integration mark; emulators ignore it)
# to the terminal, then the exit status to the supervisor's mark pipe, before the prompt: when
# the mark arrives, the terminal bytes up to OSC 133;D are in (the supervisor reads the
# terminal before it counts the mark), and a run's output ends there.
MARK_COMMAND = (
    'crucible_rc=$?; printf "\\033]133;D\\007"; '
    f'printf "%s\\n" "$crucible_rc" >&{keeper.MARK_FD}; (exit $crucible_rc)'
)
END_MARK = b"\x1b]133;D\x07"
READY_TIMEOUT_S = 5.0
HISTORY_LINES = 2000
_BRACKETED_PASTE_OFF = b"\x1b[?2004l\r"  # readline accepted the line (bash >= 5.1)


@dataclass(slots=True)
class Session:
    """A session as the control plane knows it; ``screen`` is fed under ``lock``."""

    id: str
    sandbox_id: str
    tenant_id: str | None
    handle: int
    pty: bool
    marks: bool
    rows: int
    cols: int
    max_output_bytes: int
    screen: pyte.HistoryScreen
    stream: pyte.ByteStream
    fed: int = 0  # terminal bytes fed to the screen so far
    lock: threading.Lock = field(default_factory=threading.Lock)


_lock = threading.Lock()
_sessions: dict[str, Session] = {}


def _new_screen(rows: int, cols: int) -> tuple[pyte.HistoryScreen, pyte.ByteStream]:
    screen = pyte.HistoryScreen(cols, rows, history=HISTORY_LINES, ratio=0.5)
    screen.set_mode(pyte.modes.LNM)
    return screen, pyte.ByteStream(screen)


def _is_bash(shell: str) -> bool:
    return Path(shell).name == "bash"


def create(
    ctx: ServiceContext,
    principal: Principal,
    sandbox_id: str,
    *,
    shell: str = "/bin/bash",
    pty: bool = True,
    rows: int = 24,
    cols: int = 80,
    env: dict[str, bytes] | None = None,
    cwd: str | None = None,
    max_output_bytes: int | None = None,
    user: str | None = None,
) -> Session:
    """Start a shell session in a leased sandbox and wait (5 s at most) for its first prompt.

    ``max_output_bytes``: terminal bytes kept in the sandbox (the newest; default the exec
    default). ``user``: see ``service.sandbox_user.with_user`` (default the template's).
    Raises ``InvalidRequest`` (sizes, cwd, env), ``Conflict`` (no exec channel,
    sandbox not leased, shell never prompted), ``NotFound``, ``Forbidden`` (``user``).
    """
    if not (1 <= rows <= 1000 and 1 <= cols <= 1000):
        raise InvalidRequest("rows and cols must be 1..1000", field="rows")
    if not shell.startswith("/") or "\0" in shell:
        raise InvalidRequest("shell must be an absolute path", field="shell")
    cap = ctx.settings.default_max_output_bytes if max_output_bytes is None else max_output_bytes
    if not 1024 <= cap <= ctx.settings.max_output_bytes_limit:
        raise InvalidRequest(
            f"max_output_bytes must be 1024..{ctx.settings.max_output_bytes_limit}",
            field="max_output_bytes",
        )
    marks = _is_bash(shell)
    full_env: dict[str, bytes] = {"PS1": b"$ ", "TERM": b"xterm-256color" if pty else b"dumb"}
    full_env.update(env or {})
    if marks:
        full_env["PROMPT_COMMAND"] = MARK_COMMAND.encode()
    cmd = [shell, "--norc", "--noprofile", "-i"] if marks else [shell, "-i"]
    if marks and not pty:
        cmd.append("+m")  # no job control without a terminal
    req = ExecRequest(cmd=cmd, cwd=cwd, env=full_env, max_output_bytes=cap)
    req = with_user(ctx, principal, sandbox_id, req, user)
    row = get_live(ctx, principal, sandbox_id)
    details: dict[str, Any] = {"shell": shell, "pty": pty, "rows": rows, "cols": cols}
    try:
        handle, pid = keeper.spawn(
            ctx.runtime, row.container_id, req, pty=pty, rows=rows, cols=cols, marks=marks
        )
        if marks:
            _await_prompt(ctx, row.container_id, handle)
    except CrucibleError as e:
        processes.audit_event(
            ctx, principal, row, "sandbox.session.start", {**details, "error": e.detail}
        )
        raise runtime_failure(ctx, principal, sandbox_id, e) from e
    screen, stream = _new_screen(rows, cols)
    sess = Session(
        id=new_id("ses"),
        sandbox_id=sandbox_id,
        tenant_id=principal.tenant_id,
        handle=handle,
        pty=pty,
        marks=marks,
        rows=rows,
        cols=cols,
        max_output_bytes=cap,
        screen=screen,
        stream=stream,
    )
    with _lock:
        _sessions[sess.id] = sess
    processes.remember(
        sandbox_id,
        processes.Entry(handle=handle, pid=pid, kind="session", cmd=shell, started_at=time.time()),
    )
    processes.audit_event(
        ctx, principal, row, "sandbox.session.start", {**details, "session_id": sess.id}
    )
    return sess


def _await_prompt(ctx: ServiceContext, container_id: str, handle: int) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        st = keeper.status(ctx.runtime, container_id, handle)
        if st.marks >= 1:
            return
        if not st.running:
            raise Conflict(f"the shell exited at once (exit code {st.exit_code})")
        if time.monotonic() > deadline:
            keeper.release(ctx.runtime, container_id, handle)
            raise Conflict(f"the shell did not prompt within {READY_TIMEOUT_S:g} s")
        time.sleep(0.002)


def get(ctx: ServiceContext, principal: Principal, sandbox_id: str, session_id: str) -> Session:
    """The caller's session in this leased sandbox. ``NotFound`` otherwise."""
    get_live(ctx, principal, sandbox_id)
    with _lock:
        sess = _sessions.get(session_id)
    if sess is None or sess.sandbox_id != sandbox_id:
        raise NotFound(f"no session {session_id!r} in sandbox {sandbox_id}", field="session_id")
    return sess


def list_sessions(ctx: ServiceContext, principal: Principal, sandbox_id: str) -> list[Session]:
    """The sandbox's sessions."""
    get_live(ctx, principal, sandbox_id)
    with _lock:
        return [s for s in _sessions.values() if s.sandbox_id == sandbox_id]


@dataclass(frozen=True, slots=True)
class RunResult:
    """A command run in a session: ``output`` is what the terminal showed between the
    command line and the next prompt (the echo of the line removed), ``exit_code`` the
    shell's ``$?`` (None when it timed out), ``duration_ms`` wall time in milliseconds."""

    output: bytes
    exit_code: int | None
    timed_out: bool
    truncated: bool
    duration_ms: float


def _strip_echo(data: bytes, line: bytes) -> bytes:
    """Drop the terminal's echo of the command line (and readline's redraw) from ``data``."""
    cut = data.rfind(_BRACKETED_PASTE_OFF)
    if cut >= 0:
        return data[cut + len(_BRACKETED_PASTE_OFF) :]
    echo = line.replace(b"\n", b"\r\n")
    return data[len(echo) :] if data.startswith(echo) else data


def run(
    ctx: ServiceContext,
    principal: Principal,
    sandbox_id: str,
    session_id: str,
    command: str,
    *,
    timeout_s: float,
) -> RunResult:
    """Run one command line in the session (module docstring). On timeout the command keeps
    running (send ``C-c`` with ``keys``). Audited as ``sandbox.session.run``."""
    sess = get(ctx, principal, sandbox_id, session_id)
    if not sess.marks:
        raise Conflict("run needs a bash session (this shell reports no prompts)")
    if "\0" in command or not command.strip():
        raise InvalidRequest("command must be non-empty text without NUL", field="command")
    if timeout_s > ctx.settings.max_exec_timeout_s:
        raise InvalidRequest(
            f"timeout_s {timeout_s} exceeds the maximum {ctx.settings.max_exec_timeout_s}",
            field="timeout_s",
        )
    row = get_live(ctx, principal, sandbox_id)
    text = command.rstrip("\n")
    if "\n" in text:  # one compound command: answered at the prompt after all of it
        text = "{ " + text + "\n}"
    line = text.encode() + b"\n"
    t0 = time.perf_counter()
    try:
        out = keeper.run_line(ctx.runtime, row.container_id, sess.handle, line, wait_s=timeout_s)
    except CrucibleError as e:
        processes.audit_event(
            ctx,
            principal,
            row,
            "sandbox.session.run",
            {"session_id": sess.id, "cmd": command[:4096], "error": e.detail},
        )
        raise runtime_failure(ctx, principal, sandbox_id, e) from e
    data = out.data
    if out.done and (cut := data.rfind(END_MARK)) >= 0:
        data = data[:cut]
    data = _strip_echo(data, line) if sess.pty else data
    cap = sess.max_output_bytes
    truncated = len(data) > cap or out.dropped > 0
    if len(data) > cap:
        data = data[: cap - cap // 2] + data[len(data) - cap // 2 :]
    res = RunResult(
        output=data,
        exit_code=out.status.last_rc if out.done else None,
        timed_out=not out.done,
        truncated=truncated,
        duration_ms=(time.perf_counter() - t0) * 1000,
    )
    processes.audit_event(
        ctx,
        principal,
        row,
        "sandbox.session.run",
        {
            "session_id": sess.id,
            "cmd": command[:4096],
            "cmd_truncated": len(command) > 4096,
            "timeout_s": timeout_s,
            "exit_code": res.exit_code,
            "timed_out": res.timed_out,
            "output_bytes": len(out.data),
            "duration_ms": round(res.duration_ms, 3),
        },
    )
    return res


def encode_keys(*, text: str | None, keys: list[str] | None, data_b64: str | None) -> bytes:
    """The bytes for ``text`` (UTF-8), ``keys`` (names from ``terminal_keys.toml``, others
    as text) and ``data_b64`` (raw), in that order. ``InvalidRequest`` when nothing is given
    or the base64 is invalid."""
    out = text.encode() if text else b""
    for key in keys or []:
        out += KEYS.get(key, key).encode()
    if data_b64:
        try:
            out += base64.b64decode(data_b64, validate=True)
        except ValueError as e:
            raise InvalidRequest("data_b64 is not valid base64", field="data_b64") from e
    if not out:
        raise InvalidRequest("give keys, text or data_b64", field="keys")
    return out


def send_keys(
    ctx: ServiceContext, principal: Principal, sandbox_id: str, session_id: str, data: bytes
) -> keeper.KeptStatus:
    """Write ``data`` to the terminal; audited as ``sandbox.session.keys`` (with the bytes'
    length and their first 512 characters)."""
    sess = get(ctx, principal, sandbox_id, session_id)
    row = get_live(ctx, principal, sandbox_id)
    st = keeper.write(ctx.runtime, row.container_id, sess.handle, data)
    processes.audit_event(
        ctx,
        principal,
        row,
        "sandbox.session.keys",
        {"session_id": sess.id, "bytes": len(data), "keys": data[:512].decode("utf-8", "replace")},
    )
    return st


@dataclass(frozen=True, slots=True)
class ScreenView:
    """The terminal as rendered: ``display`` rows (``rows`` strings of ``cols`` characters),
    ``cursor`` (row, col), ``scrollback`` lines that scrolled off the top (oldest first),
    ``bytes_total`` terminal bytes so far, ``dropped`` bytes lost before they were rendered
    (the ring in the sandbox overflowed between reads), ``running`` whether the shell lives."""

    display: list[str]
    cursor: tuple[int, int]
    scrollback: list[str]
    bytes_total: int
    dropped: int
    running: bool
    exit_code: int | None


def _line(row: Any, cols: int) -> str:
    return "".join(row[x].data for x in range(cols)).rstrip()


def screen(
    ctx: ServiceContext,
    principal: Principal,
    sandbox_id: str,
    session_id: str,
    *,
    wait_s: float = 0.0,
) -> ScreenView:
    """Feed what the terminal showed since the last read to the emulator and render it.
    ``wait_s`` > 0 waits (seconds) for new output first."""
    sess = get(ctx, principal, sandbox_id, session_id)
    row = get_live(ctx, principal, sandbox_id)
    with sess.lock:
        out = keeper.read(
            ctx.runtime, row.container_id, sess.handle, offset=sess.fed, wait_s=wait_s
        )
        sess.stream.feed(out.data)
        sess.fed = out.next
        scr = sess.screen
        history = [_line(r, scr.columns) for r in scr.history.top]
        return ScreenView(
            display=[line.rstrip() for line in scr.display],
            cursor=(scr.cursor.y, scr.cursor.x),
            scrollback=history,
            bytes_total=out.next,
            dropped=out.dropped,
            running=out.status.running,
            exit_code=out.status.exit_code,
        )


def resize(
    ctx: ServiceContext,
    principal: Principal,
    sandbox_id: str,
    session_id: str,
    rows: int,
    cols: int,
) -> None:
    """Resize the terminal (and the emulator). ``Conflict`` for a session without a pty."""
    if not (1 <= rows <= 1000 and 1 <= cols <= 1000):
        raise InvalidRequest("rows and cols must be 1..1000", field="rows")
    sess = get(ctx, principal, sandbox_id, session_id)
    row = get_live(ctx, principal, sandbox_id)
    keeper.resize(ctx.runtime, row.container_id, sess.handle, rows, cols)
    with sess.lock:
        sess.screen.resize(rows, cols)
        sess.rows, sess.cols = rows, cols


def close(ctx: ServiceContext, principal: Principal, sandbox_id: str, session_id: str) -> None:
    """End the shell and everything it started; forget the session. Audited."""
    sess = get(ctx, principal, sandbox_id, session_id)
    row = get_live(ctx, principal, sandbox_id)
    keeper.release(ctx.runtime, row.container_id, sess.handle)
    with _lock:
        _sessions.pop(sess.id, None)
    processes.forget(sandbox_id, sess.handle)
    processes.audit_event(ctx, principal, row, "sandbox.session.close", {"session_id": sess.id})
