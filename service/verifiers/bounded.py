"""Bounded execution of verifier work: a function runs in a separate process with a
wall-clock limit and an address-space limit, so work on an agent's output (parsing an
answer, loading and measuring a mesh) can neither slow the control plane's API nor take
its memory.

How: a *zygote* process (``python -c``, started once per control-plane process, with the
verifier modules in ``PRELOAD`` imported) forks one fresh child per call. Per call the
parent makes a socket pair and passes one end to the zygote (``SCM_RIGHTS`` over the
zygote's control socket); the zygote forks, and the child, in a session of its own,
writes its pid, lowers its priority (``nice`` +10), sets ``RLIMIT_AS`` to ``memory_mb``
and ``RLIMIT_CPU`` to the wall limit (rounded up), reads ``(fn, args)`` (pickled), runs
it and writes the outcome back (pickled). The parent waits at most ``timeout_s`` for it;
past that the child's process group is killed (SIGKILL; the zygote reaps it). Nothing is
forked from the multi-threaded control plane itself, and no ``__main__`` is re-imported
(what ``multiprocessing``'s spawn and forkserver methods do). At most ``MAX_CONCURRENT``
children of one tenant run at once, and one more of another's (further calls wait for a
slot, granted fairly between tenants: ``fairslots``; the wait does not count against their
limit), so a burst of verifications cannot take every core, and one tenant's cannot hold
another's up.

Outcomes: the result; the exception ``fn`` raised, re-raised in the parent (one that
cannot be pickled becomes ``RuntimeError`` with its text); or ``BoundExceeded`` with
``cause`` ``timeout`` (past the wall limit), ``memory`` (a ``MemoryError`` in the child)
or ``crashed`` (the child died without an answer: a signal, a C extension's abort, an
allocation refused below Python). Whether an exceeded bound is the agent's outcome or
Crucible's failure is the caller's decision. ``WorkerUnavailable``: no worker could be
started (Crucible's own failure).

``fn`` must be a module-level function importable by name, its arguments and result
picklable. Results are unpickled in the control plane: only Crucible's own code runs in
the child, on the agent's data.
"""

from __future__ import annotations

import contextlib
import math
import os
import pickle
import resource
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from service.verifiers.fairslots import FairSlots

T = TypeVar("T")
BoundCause = Literal["timeout", "memory", "crashed"]

#: Modules the zygote imports once, so each child starts with them loaded (a few ms per
#: call instead of ~0.6 s of imports).
PRELOAD = ("service.verifiers.geometry", "service.verifiers.normalize", "service.verifiers.cad",
           "service.verifiers.document")  # fmt: skip
#: Children of one tenant running at once, across every caller in this process (the pool
#: holds one more, for another tenant: ``fairslots``).
MAX_CONCURRENT = max(1, (os.cpu_count() or 2) - 1)
#: Largest pickled request or result, in bytes.
MAX_MESSAGE_BYTES = 256 << 20

_HEADER = struct.Struct("!Q")
_slots = FairSlots(total=MAX_CONCURRENT + 1, per_tenant=MAX_CONCURRENT)


class BoundExceeded(Exception):
    """The work ran past one of its bounds; ``cause`` says which, ``limit`` its value
    (seconds for ``timeout``, MiB for ``memory``)."""

    def __init__(self, cause: BoundCause, message: str, *, limit: float | None = None) -> None:
        super().__init__(message)
        self.cause = cause
        self.limit = limit
        self.message = message


class WorkerUnavailable(Exception):
    """No worker process could be started (the host, not the work)."""


# --------------------------------------------------------------------------- framing


def _send(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(_HEADER.pack(len(payload)) + payload)


def _recv_exact(sock: socket.socket, n: int, deadline: float | None) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            # poll, not select: select() refuses descriptors above FD_SETSIZE (1024), which
            # a control plane holding many sandboxes' sockets reaches
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            if left <= 0 or not poller.poll(left * 1000):
                raise TimeoutError
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def _recv(sock: socket.socket, deadline: float | None) -> bytes:
    (n,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size, deadline))
    if n > MAX_MESSAGE_BYTES:
        raise EOFError
    return _recv_exact(sock, n, deadline)


# --------------------------------------------------------------------------- the zygote


def _zygote_main(control_fd: int) -> None:
    """The zygote's loop (runs in its own process): receive a call's socket, fork a child."""
    for name in PRELOAD:
        __import__(name)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    control = socket.socket(fileno=control_fd)
    while True:
        try:
            _, fds, _, _ = socket.recv_fds(control, 1, 1)
        except OSError:
            return
        if not fds:
            return  # the control plane went away
        if os.fork() == 0:
            control.close()
            _child(socket.socket(fileno=fds[0]))
            os._exit(0)
        os.close(fds[0])


def _child(sock: socket.socket) -> None:
    """Runs in a forked child: report the pid, set the limits, run, answer once."""
    os.setsid()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _send(sock, str(os.getpid()).encode())
    try:
        fn, args, memory_mb, cpu_s = pickle.loads(_recv(sock, None))
        os.nice(10)
        limit = int(memory_mb) << 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
        out: tuple[str, Any] = ("ok", fn(*args))
    except MemoryError:
        out = ("memory", None)
    except BaseException as e:  # every failure is reported, never lost
        out = ("raise", e)
    try:
        data = pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
    except MemoryError:
        data = pickle.dumps(("memory", None))
    except Exception as e:  # an unpicklable result or exception
        data = pickle.dumps(("raise", RuntimeError(f"{type(e).__name__}: {e}")))
    _send(sock, data)
    sock.close()


class _Zygote:
    """The control plane's handle on its zygote process (started on first use)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._control: socket.socket | None = None

    def _start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        code = (
            f"import sys; sys.path[:] = {sys.path!r}; "
            f"from service.verifiers.bounded import _zygote_main; _zygote_main({theirs.fileno()})"
        )
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", code],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                close_fds=True,
                start_new_session=True,
            )
        finally:
            theirs.close()
        self._control = ours

    def hand_over(self, fd: int) -> None:
        """Pass ``fd`` (one end of a call's socket pair) to the zygote, starting it (again)
        when it is not running. Raises ``WorkerUnavailable``."""
        with self._lock:
            for attempt in range(2):
                try:
                    if self._proc is None or self._proc.poll() is not None:
                        self._start()
                    assert self._control is not None
                    socket.send_fds(self._control, [b"R"], [fd])
                    return
                except OSError as e:
                    self._proc = None
                    if attempt:
                        raise WorkerUnavailable(f"cannot start a verifier worker: {e}") from e


_ZYGOTE = _Zygote()


# --------------------------------------------------------------------------- the call


def run_bounded(
    fn: Callable[..., T], *args: Any, timeout_s: float, memory_mb: int, what: str = "the work"
) -> T:
    """``fn(*args)`` in a fresh child process, within ``timeout_s`` seconds of wall clock and
    ``memory_mb`` MiB of address space (module docstring).

    ``what`` names the work in the messages (``"measuring the mesh"``).

    Raises:
        BoundExceeded: past the time or memory limit, or the child died without answering.
        WorkerUnavailable: no child process could be started.
        Exception: whatever ``fn`` raised, re-raised here.
    """
    if timeout_s <= 0 or memory_mb <= 0:
        raise ValueError("timeout_s and memory_mb must be positive")
    request = pickle.dumps(
        (fn, args, memory_mb, max(1, math.ceil(timeout_s))), protocol=pickle.HIGHEST_PROTOCOL
    )
    with _slots.slot():
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid: int | None = None
        answered = False
        try:
            try:
                _ZYGOTE.hand_over(theirs.fileno())
            finally:
                theirs.close()
            try:
                pid = int(_recv(ours, time.monotonic() + 30.0))
            except (EOFError, TimeoutError, ValueError, OSError) as e:
                raise WorkerUnavailable(f"the verifier worker did not start: {e!r}") from e
            deadline = time.monotonic() + timeout_s
            try:
                _send(ours, request)
                kind, value = pickle.loads(_recv(ours, deadline))
                answered = True
            except TimeoutError:
                raise BoundExceeded(
                    "timeout", f"{what} took longer than {timeout_s:g} s", limit=timeout_s
                ) from None
            except (EOFError, OSError, pickle.UnpicklingError):
                raise BoundExceeded(
                    "crashed", f"{what} crashed (the worker died without an answer)"
                ) from None
        finally:
            ours.close()
            if pid is not None and not answered:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
    if kind == "ok":
        return value
    if kind == "memory":
        raise BoundExceeded(
            "memory", f"{what} needed more than {memory_mb} MiB of memory", limit=memory_mb
        )
    raise value
