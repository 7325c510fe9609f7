"""Terminal sessions: a persistent shell, on a pseudo-terminal or on pipes, kept by the
sandbox's supervisor (``service.runtime.keeper``), with a terminal emulator (``pyte``) here.

- ``run``: writes one command line and answers when the shell's next prompt is reported on
  the mark pipe (``PROMPT_COMMAND`` writes ``$?`` to fd 63, which the supervisor owns), so
  completion is known without scraping the output. A command of several lines is sent as
  one group (``{ ...\n}``), so the answer comes at the prompt after all of it (heredocs,
  quoted strings and ``if ... fi`` over lines included). The line is written only while the
  shell is idle at its prompt, so the next prompt is this line's (the keeper's ``prun``):
  not while an earlier run's command still runs, nor after keys that ended a line until
  the shell prompted again with nothing typed left unread, nor (on a terminal) while
  another process group holds the foreground. A shell still busy after 1 s (at most the
  run's ``timeout_s``) is a 409 saying why, and nothing is written. On a terminal a partly
  typed line (keys without Enter) is erased first (C-e C-u); without one it cannot be, and
  the run is a 409. A shell that exits during a run answers with its exit status
  (``shell_exited``); later runs and keys are 409s saying so.
- ``keys``: raw text or named keys (``terminal_keys.toml``) to the terminal.
- ``screen``: every byte the terminal showed since the last read, fed to a ``pyte``
  ``HistoryScreen``; returns the display, the cursor and the scrollback. The feed never
  raises on what the sandbox printed and stops at ``FEED_BUDGET_S`` (``feed_terminal``).
- ``resize``, ``close``.

The shell is ``bash --norc --noprofile -i`` (``PS1='$ '`` unless the caller sets it); any
other shell runs without ``run`` (``keys``/``screen`` work). cwd, env and shell state live in
the shell, so they persist between calls. Output caps, timeouts and audit events match exec.
"""

from __future__ import annotations

import base64
import logging
import math
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
# The function hands ``$?`` back to the shell without a fork: ``(exit $crucible_rc)`` forked
# a subshell at every prompt, which held the terminal's foreground just after the mark (a
# run right after looked busy) and cost ~0.3 ms.
MARK_COMMAND = (
    'crucible_rc=$?; __crucible_mark() { printf "\\033]133;D\\007"; '
    f'printf "%s\\n" "$crucible_rc" >&{keeper.MARK_FD}; return "$crucible_rc"; }}; '
    "__crucible_mark"
)
END_MARK = b"\x1b]133;D\x07"
READY_TIMEOUT_S = 5.0
LIST_ANSWER_S = 2.0  # a keeper stopped in the sandbox delays the list this long, then "gone"
HISTORY_LINES = 2000
_BRACKETED_PASTE_OFF = b"\x1b[?2004l\r"  # readline accepted the line (bash >= 5.1)
# The emulator's time per screen read, in seconds (wall clock). Every byte the sandbox's
# terminal printed is parsed here, in a server thread, under the session's lock, and pyte's
# cost per byte depends on the bytes: plain text is about 5 us a byte, but one DECALN
# (``ESC # 8``, 3 bytes) rewrites every cell (about 5 ms at 80x24), so a 1 MiB ring of them
# was 20 minutes of CPU in one read. Half the budget goes to the backlog from its start
# (normal output fits whole: about 100 KB of text), the other half to its newest bytes (so
# the prompt after a flood shows); what lies between, or past the budget, is not rendered
# and is counted in the read's ``dropped``. The budget is checked between pyte's events, so
# each half can overrun by one event, which touches at most rows * cols cells (~5 ms at
# 80x24, ~0.25 s at the largest screen the caller may choose: ``MAX_SCREEN_CELLS``).
FEED_BUDGET_S = 1.0
# A terminal's size: each side 1..1000, and at most this many cells. One full-screen
# event (DECALN, an erase) costs pyte 4 to 8 us a cell on a loaded 2-core host: 1000x1000
# was 2 to 6 s per event, past any budget; 32,768 cells (128x256, 100x327; Terminus uses
# 160x40) is ~0.15 to 0.25 s.
MAX_SCREEN_SIDE = 1000
MAX_SCREEN_CELLS = 32768
FEED_CHUNK_BYTES = 512  # fed per call to pyte (the budget is also checked between chunks)
TAIL_MIN_BYTES = 256  # the newest bytes fed once the budget's first half is spent
TAIL_MAX_BYTES = 64 * 1024
_log = logging.getLogger("crucible.sessions")
_now = time.perf_counter


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
    stream: GuardedStream
    fed: int = 0  # terminal bytes fed to the screen so far
    lock: threading.Lock = field(default_factory=threading.Lock)


_lock = threading.Lock()
_sessions: dict[str, Session] = {}


class _Overrun(Exception):
    """The stream's deadline passed (raised between two of pyte's events)."""


class GuardedStream(pyte.ByteStream):
    """A ``pyte.ByteStream`` that never raises on what it is fed: an exception out of pyte
    while it parses or applies one sequence (``ESC [ 4 J``: ``erase_in_display`` has no case
    for it; a CSI parameter of over 4300 digits: ``int()`` refuses it) skips that sequence,
    as a terminal ignores one it does not know, and counts it in ``errors``. The parser starts
    afresh (as pyte's own ``_send_to_parser`` does), and the bytes after it parse as usual.
    ``deadline`` (``time.perf_counter()``) is checked after each event: past it, ``feed``
    raises ``_Overrun`` (``feed_terminal`` then drops the stream)."""

    def __init__(self, screen: pyte.HistoryScreen, errors: int = 0) -> None:
        super().__init__(screen)
        self.errors = errors
        self.deadline = math.inf

    def _send_to_parser(self, data: str) -> bool | None:
        # pyte's own, inlined (this runs once per control character), plus the two guards.
        try:
            taking_text = self._parser.send(data)  # type: ignore[union-attr]
        except Exception as e:  # noqa: BLE001 - any sequence the emulator fails on is skipped
            self._initialize_parser()
            self.errors += 1
            _log.debug("terminal emulator skipped a sequence: %r", e)
            taking_text = True  # the fresh parser is at the ground state
        if taking_text and _now() > self.deadline:  # True: a sequence (an event) is done
            raise _Overrun
        return taking_text


def _new_screen(rows: int, cols: int) -> tuple[pyte.HistoryScreen, GuardedStream]:
    screen = pyte.HistoryScreen(cols, rows, history=HISTORY_LINES, ratio=0.5)
    screen.set_mode(pyte.modes.LNM)
    return screen, GuardedStream(screen)


@dataclass(frozen=True, slots=True)
class Fed:
    """What ``feed_terminal`` did: ``stream`` to feed next (a fresh one when bytes were
    skipped), ``dropped`` bytes not rendered (past the budget), ``errors`` sequences skipped
    because pyte failed on them."""

    stream: GuardedStream
    dropped: int
    errors: int


def _feed_chunks(stream: GuardedStream, data: bytes, pos: int) -> tuple[int, bool]:
    """Feed ``data[pos:]`` until the stream's deadline. Returns the offset fed up to and
    whether the deadline stopped a chunk midway (the chunk at that offset, partly fed)."""
    while pos < len(data):
        chunk = data[pos : pos + FEED_CHUNK_BYTES]
        try:
            stream.feed(chunk)
        except _Overrun:
            return pos, True
        except Exception as e:  # noqa: BLE001 - out of pyte's own loop (a draw): skip the chunk
            stream.errors += 1
            _log.debug("terminal emulator skipped %d bytes: %r", len(chunk), e)
        pos += len(chunk)
        if time.perf_counter() > stream.deadline:
            break
    return pos, False


def _resync(data: bytes, at: int) -> int:
    """A point at or after ``at`` to start parsing again: a newline (fed, so the tail starts
    on a fresh line), else an escape, else ``at``."""
    nl = data.find(b"\n", at)
    if nl >= 0:
        return nl
    esc = data.find(b"\x1b", at)
    return esc if esc >= 0 else at


def feed_terminal(
    screen: pyte.HistoryScreen,
    stream: GuardedStream,
    data: bytes,
    *,
    budget_s: float = FEED_BUDGET_S,
) -> Fed:
    """Feed ``data`` to the emulator within ``budget_s`` seconds (``FEED_BUDGET_S``); never
    raises on what ``data`` holds. Output that fits is fed whole, exactly as pyte would; past
    half the budget the backlog's middle is skipped and its newest bytes (what the remaining
    half is likely to parse, ``TAIL_MIN_BYTES``..``TAIL_MAX_BYTES``) are fed on a fresh
    parser; what the budget still leaves is dropped. Returns the stream to use next."""
    errors0 = stream.errors
    t0 = time.perf_counter()
    stream.deadline = t0 + budget_s / 2
    fed, stopped = _feed_chunks(stream, data, 0)
    rendered = fed
    if fed < len(data):
        spent = max(time.perf_counter() - t0, 1e-6)
        keep = int(min(TAIL_MAX_BYTES, max(TAIL_MIN_BYTES, fed / spent * budget_s / 4)))
        skip_to = fed + FEED_CHUNK_BYTES if stopped else fed  # a chunk partly fed: not again
        start = _resync(data, max(skip_to, len(data) - keep))
        stream = GuardedStream(screen, stream.errors)  # fresh parser and UTF-8 decoder
        if start < len(data):
            stream.deadline = time.perf_counter() + budget_s / 2
            end, _ = _feed_chunks(stream, data, start)
            rendered += end - start
            if end < len(data):  # the next read's bytes would start mid-sequence
                stream = GuardedStream(screen, stream.errors)
    stream.deadline = math.inf
    errors = stream.errors - errors0
    if errors:
        screen.ensure_hbounds()
        screen.ensure_vbounds()
        _log.info("terminal emulator skipped %d sequence(s) it failed on", errors)
    return Fed(stream=stream, dropped=len(data) - rendered, errors=errors)


def _is_bash(shell: str) -> bool:
    return Path(shell).name == "bash"


def check_size(rows: int, cols: int) -> None:
    """Refuse a terminal size the emulator cannot render within its budget.

    Raises:
        InvalidRequest: a side outside 1..``MAX_SCREEN_SIDE`` (field ``rows`` or ``cols``),
            or ``rows * cols`` over ``MAX_SCREEN_CELLS`` (field ``cols``).
    """
    for name, value in (("rows", rows), ("cols", cols)):
        if not 1 <= value <= MAX_SCREEN_SIDE:
            raise InvalidRequest(f"{name} must be 1..{MAX_SCREEN_SIDE}", field=name)
    if rows * cols > MAX_SCREEN_CELLS:
        raise InvalidRequest(
            f"rows x cols is {rows * cols} cells; at most {MAX_SCREEN_CELLS} (e.g. 128x256)",
            field="cols",
        )


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
    Raises ``InvalidRequest`` (sizes, cwd, env; a ``shell`` that cannot be executed),
    ``Conflict`` (no exec channel, sandbox not leased, 64 kept already, shell never
    prompted), ``NotFound``, ``Forbidden`` (``user``).
    """
    check_size(rows, cols)
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
        try:
            handle, pid = keeper.spawn(
                ctx.runtime,
                row.container_id,
                req,
                pty=pty,
                rows=rows,
                cols=cols,
                marks=marks,
                sandbox_id=sandbox_id,
            )
        except InvalidRequest as e:
            if e.field != "cmd":
                raise
            raise InvalidRequest(f"shell: {e.detail}", field="shell") from e
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


def list_sessions(
    ctx: ServiceContext, principal: Principal, sandbox_id: str
) -> list[tuple[Session, keeper.KeptStatus | None]]:
    """The sandbox's sessions, each with its shell's state now (None: its keeper is gone or
    does not answer, e.g. killed or stopped in the sandbox)."""
    row = get_live(ctx, principal, sandbox_id)
    with _lock:
        found = [s for s in _sessions.values() if s.sandbox_id == sandbox_id]
    out: list[tuple[Session, keeper.KeptStatus | None]] = []
    for sess in found:
        try:
            st: keeper.KeptStatus | None = keeper.status(
                ctx.runtime, row.container_id, sess.handle, answer_s=LIST_ANSWER_S
            )
        except CrucibleError:  # one unreachable keeper does not fail the list
            st = None
        out.append((sess, st))
    return out


def _exited(code: int | None, session_id: str) -> Conflict:
    return Conflict(
        f"the session's shell exited (exit code {code}): it takes no more runs or keys; "
        f"close it (DELETE .../sessions/{session_id}) and start another"
    )


def _shell_state(sess: Session, state: str) -> Conflict:
    """The 409 for a ``prun`` the keeper refused (``keeper.ShellState``)."""
    word, _, rest = state.partition(" ")
    if word == "exited":
        return _exited(int(rest) if rest.lstrip("-").isdigit() else None, sess.id)
    interrupt = (
        "interrupt it with keys C-c"
        if sess.pty
        else "a session without a terminal has no C-c: interrupt it from an exec (pkill -INT) "
        "or close the session"
    )
    if word == "partial":
        return Conflict(
            "the shell's input holds a partly typed line (keys without a line end since its "
            "last prompt), which a session without a terminal cannot erase: end it (keys "
            "Enter) and wait for the prompt, or close the session"
        )
    if rest == "run":
        why = "the command of an earlier run is still running (its prompt has not come back)"
    elif rest == "keys":
        why = (
            "a line sent with keys has not finished (no prompt since: it still runs, or the "
            "shell waits for the rest of it, as after an open quote)"
        )
    elif rest.startswith("foreground"):
        why = (
            f"process group {rest.split()[-1]} holds the terminal's foreground (a program "
            "started with keys)"
        )
    else:
        why = rest
    return Conflict(
        f"the shell is busy: {why}; nothing was written. Wait for its prompt (screen with "
        f"wait_s), or {interrupt}"
    )


def _gone(ctx: ServiceContext, container_id: str, sess: Session) -> Conflict | None:
    """The 409 for an op on a session whose shell exited (None when it still runs)."""
    try:
        st = keeper.status(ctx.runtime, container_id, sess.handle)
    except CrucibleError:
        return None
    return None if st.running else _exited(st.exit_code, sess.id)


@dataclass(frozen=True, slots=True)
class RunResult:
    """A command run in a session: ``output`` is what the terminal showed between the
    command line and the next prompt (the echo of the line removed), ``exit_code`` the
    shell's ``$?`` (None when it timed out; the shell's exit status when the command ended
    the shell: ``shell_exited``), ``duration_ms`` wall time in milliseconds."""

    output: bytes
    exit_code: int | None
    timed_out: bool
    truncated: bool
    duration_ms: float
    shell_exited: bool = False


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
    running (send ``C-c`` with ``keys``). Audited as ``sandbox.session.run``. ``Conflict``
    when the shell is busy or exited (``_shell_state``): nothing was written then."""
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
        try:
            out = keeper.run_line(
                ctx.runtime, row.container_id, sess.handle, line, wait_s=timeout_s
            )
        except keeper.ShellState as e:
            raise _shell_state(sess, e.state) from e
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
    exited = not out.status.running
    if out.done:
        exit_code: int | None = out.status.last_rc
    else:  # no prompt: still running (timed out), or the shell ended (``exit``)
        exit_code = out.status.exit_code if exited else None
    res = RunResult(
        output=data,
        exit_code=exit_code,
        timed_out=not out.done and not exited,
        truncated=truncated,
        duration_ms=(time.perf_counter() - t0) * 1000,
        shell_exited=exited,
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
            "shell_exited": res.shell_exited,
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
    try:
        st = keeper.write(ctx.runtime, row.container_id, sess.handle, data)
    except keeper.ShellState as e:  # the shell exited
        raise _shell_state(sess, e.state) from e
    except Conflict as e:  # a terminal's closed stdin: its shell exited?
        raise _gone(ctx, row.container_id, sess) or e from e
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
    (the ring in the sandbox overflowed between reads, or the emulator's ``FEED_BUDGET_S``
    ran out), ``running`` whether the shell lives, ``render_errors`` sequences the emulator
    failed on and skipped in this read."""

    display: list[str]
    cursor: tuple[int, int]
    scrollback: list[str]
    bytes_total: int
    dropped: int
    running: bool
    exit_code: int | None
    render_errors: int = 0


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
        fed = feed_terminal(sess.screen, sess.stream, out.data)
        sess.stream = fed.stream
        sess.fed = out.next
        scr = sess.screen
        try:
            display, history = _render(scr)
        except Exception as e:  # noqa: BLE001 - a state pyte cannot render: start it afresh
            _log.warning("terminal emulator could not render session %s: %r", sess.id, e)
            scr.reset()
            display, history = _render(scr)
        return ScreenView(
            display=display,
            cursor=(scr.cursor.y, scr.cursor.x),
            scrollback=history,
            bytes_total=out.next,
            dropped=out.dropped + fed.dropped,
            running=out.status.running,
            exit_code=out.status.exit_code,
            render_errors=fed.errors,
        )


def _render(scr: pyte.HistoryScreen) -> tuple[list[str], list[str]]:
    history = [_line(r, scr.columns) for r in scr.history.top]
    return [line.rstrip() for line in scr.display], history


def resize(
    ctx: ServiceContext,
    principal: Principal,
    sandbox_id: str,
    session_id: str,
    rows: int,
    cols: int,
) -> None:
    """Resize the terminal (and the emulator). ``Conflict`` for a session without a pty."""
    check_size(rows, cols)
    sess = get(ctx, principal, sandbox_id, session_id)
    row = get_live(ctx, principal, sandbox_id)
    try:
        keeper.resize(ctx.runtime, row.container_id, sess.handle, rows, cols)
    except Conflict as e:
        raise _gone(ctx, row.container_id, sess) or e from e
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
