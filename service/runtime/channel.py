"""The exec channel: requests to a sandbox's idle supervisor without ``docker exec``.

A ``docker exec`` costs ~45 ms here (the engine starts a process in the container through
runc), about as much as a short command itself. Every sandbox's main process is
``crucible-exec --idle``; with a channel it is started as ``--idle --connect
CHANNEL_MOUNT/ctl.sock`` and connects, once, to a socket the control plane listens on in a
per-sandbox host directory, bind-mounted READ-ONLY at ``CHANNEL_MOUNT``:

1. ``Listener`` (host): a fresh root-only directory with a listening socket, made before the
   container exists.
2. The container starts; its supervisor connects at once, before anything of the agent's can
   run there. ``Listener.accept`` takes that one connection, checks the peer (it must run
   ``/opt/crucible/crucible-exec`` in this container's cgroup), then closes the listener and
   unlinks the socket: nothing can ever connect again, and the agent cannot write to the
   host (the mount is read-only). The empty directory stays while the container exists (the
   engine mounts it again for every archive call) and goes with ``DockerRuntime.destroy``.
3. Per request, ``ControlChannel.open`` sends ``N`` on that connection; the supervisor forks
   a handler on a fresh socketpair and passes the other end back (``SCM_RIGHTS``). The
   request record (``protocol``, with the identity to take) goes to the handler, which
   answers with the same frames a ``docker exec`` of the supervisor would print: ~1 ms of
   transport instead of ~45. The supervisor is not dumpable, so the agent's processes (same
   uid, no ``CAP_SYS_PTRACE``) cannot take its descriptors.

``Unavailable`` means nothing was sent (no channel for this container, the supervisor did
not hand over a handler in time: stopped, or gone): the caller uses ``docker exec``, and a
control connection that failed once is dropped for good. Once a record is sent, failures
are errors, never retried elsewhere (the command may have run). After a control-plane
restart, adopted sandboxes have no channel (there is no way back in): ``docker exec``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from service.errors import SandboxError
from service.runtime.base import HandlerLost
from service.runtime.protocol import FRAME_ERROR, FRAME_RESULT, Frame, FrameDecoder

CHANNEL_MOUNT = "/opt/crucible-ctl"
SOCKET_NAME = "ctl.sock"
SUPERVISOR_EXE = "/opt/crucible/crucible-exec"
ACCEPT_TIMEOUT_S = 5.0  # the supervisor connects within milliseconds of the start
OPEN_TIMEOUT_S = 2.0  # the supervisor hands over a handler within microseconds
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class Unavailable(Exception):
    """No channel to talk to; nothing was sent."""


class Full(Unavailable):
    """The supervisor refused a keeper: it keeps its maximum (``MAX_KEEPERS``) already."""


def socket_path_in_sandbox() -> str:
    """Where the supervisor connects, inside the sandbox."""
    return f"{CHANNEL_MOUNT}/{SOCKET_NAME}"


class Listener:
    """The host side of a sandbox's channel before the sandbox starts (module docstring).

    ``directory`` is bind-mounted read-only at ``CHANNEL_MOUNT``. Raises ``OSError`` when
    the directory or socket cannot be made.
    """

    def __init__(self, root: Path, sandbox_id: str) -> None:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.directory = root / sandbox_id
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory.mkdir(mode=0o700)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        dir_fd = os.open(self.directory, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            # Through /proc/self/fd, so the 108-byte limit of socket paths never applies.
            self._sock.bind(f"/proc/self/fd/{dir_fd}/{SOCKET_NAME}")
        except OSError:
            self.discard()
            raise
        finally:
            os.close(dir_fd)
        self._sock.listen(1)

    def accept(self, container_id: str) -> ControlChannel:
        """The supervisor's connection, its peer checked. Raises ``Unavailable``."""
        try:
            self._sock.settimeout(ACCEPT_TIMEOUT_S)
            conn, _ = self._sock.accept()
        except OSError as e:
            raise Unavailable(f"the supervisor of {container_id} did not connect: {e}") from None
        try:
            pid, _, _ = _PEERCRED.unpack(
                conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
            )
            _check_peer(pid, container_id)
        except (OSError, Unavailable) as e:
            conn.close()
            raise Unavailable(f"channel of {container_id}: {e}") from None
        return ControlChannel(conn)

    def close(self) -> None:
        """Stop listening and unlink the socket; the (empty) directory stays mounted."""
        self._sock.close()
        with contextlib.suppress(OSError):
            (self.directory / SOCKET_NAME).unlink()

    def discard(self) -> None:
        """``close``, and remove the directory too (the container was never made)."""
        self.close()
        shutil.rmtree(self.directory, ignore_errors=True)


def _check_peer(pid: int, container_id: str) -> None:
    if pid <= 0:
        raise Unavailable("the peer has no pid here")
    exe = os.readlink(f"/proc/{pid}/exe")
    cgroups = Path(f"/proc/{pid}/cgroup").read_text()
    if exe != SUPERVISOR_EXE or container_id not in cgroups:
        raise Unavailable(f"peer {pid} ({exe}) is not this sandbox's supervisor")


class ControlChannel:
    """The connection a sandbox's supervisor opened at start-up; thread-safe."""

    def __init__(self, conn: socket.socket) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self._dead = False
        # A handler asked for ahead of time ("N" sent, reply not read yet: ``_pending``),
        # then held ready (``_spare``): the fork and the hand-over leave the request path.
        self._pending = False
        self._spare: socket.socket | None = None

    def open_keeper(self) -> socket.socket:
        """A handler that may become a keeper (``spawn``). Raises ``Unavailable`` (no
        channel, or the supervisor keeps its maximum of processes already: then nothing
        fails for good)."""
        return self._handoff(b"K", "the supervisor keeps its maximum of processes", Full)

    def attach(self, handle: int) -> socket.socket:
        """A connected socket to keeper ``handle``. Raises ``Unavailable`` when no such
        keeper lives (released, or its sandbox restarted)."""
        return self._handoff(
            b"A" + struct.pack(">I", handle), f"no kept process {handle}", Unavailable
        )

    def _handoff(self, message: bytes, refusal: str, refused: type[Unavailable]) -> socket.socket:
        with self._lock:
            if self._dead:
                raise Unavailable("the channel failed before")
            self._collect()  # replies come in request order: the prefetched one first
            try:
                self._conn.settimeout(OPEN_TIMEOUT_S)
                self._conn.sendall(message)
                msg, fds, _, _ = socket.recv_fds(self._conn, 1, 1)
            except OSError as e:
                self._fail()
                raise Unavailable(f"no answer from the supervisor: {e}") from None
            if msg == b"E" and not fds:
                raise refused(refusal)
            if len(fds) != 1:
                for fd in fds:
                    os.close(fd)
                self._fail()
                raise Unavailable("the supervisor broke the channel protocol")
        return socket.socket(fileno=fds[0])

    def open(self) -> socket.socket:
        """A connected socket to a new handler. Raises ``Unavailable`` (then, and for good,
        the caller uses ``docker exec``).

        The handler comes from the spare asked for by the previous call when that one is
        still alive (a handler is identity-free until it reads its record, so any request
        may use it); the next spare is then asked for without waiting for it. A spare
        killed meanwhile (a fork-bomb reclaim kills everything but init and the
        supervisor) is dropped unused and a fresh handler asked for as before.
        """
        with self._lock:
            if self._dead:
                raise Unavailable("the channel failed before")
            self._collect()
            sock, self._spare = self._spare, None
            if sock is not None and not _alive(sock):
                sock.close()
                sock = None
            if sock is None:
                sock = self._fresh()
            try:
                self._conn.sendall(b"N")  # the next spare; its reply is read next time
                self._pending = True
            except OSError:
                self._fail()  # this call's handler still serves; the next one falls back
        return sock

    def open_nowait(self, *, prefetch: bool = True) -> socket.socket | None:
        """``open`` for an event loop: the spare handler when it is at hand at once, else
        None (another thread holds the channel, the spare's hand-over has not arrived yet,
        or it died: then ``open`` on a worker thread waits for one). Never blocks.

        With ``prefetch=False`` the next spare is not asked for here: the caller asks with
        ``prefetch_nowait`` once its command has answered, so the supervisor's fork of the
        next spare does not compete for the host's CPUs with the command's own start (on 2
        cores: the ask showed as ~0.4 ms of the exec's critical path).

        Raises ``Unavailable`` like ``open`` (the channel failed, for good).
        """
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if self._dead:
                raise Unavailable("the channel failed before")
            if self._pending:
                try:
                    self._conn.settimeout(0)
                    _, fds, _, _ = socket.recv_fds(self._conn, 1, 1)
                except BlockingIOError:
                    return None  # still being forked: the caller waits on a thread
                except OSError as e:
                    self._fail()
                    raise Unavailable(f"no handler from the supervisor: {e}") from None
                self._pending = False
                if len(fds) == 1:
                    self._spare = socket.socket(fileno=fds[0])
                else:  # a refusal or nothing: ``open`` asks afresh
                    for fd in fds:
                        os.close(fd)
            sock, self._spare = self._spare, None
            if sock is None:
                return None
            if not _alive(sock):
                sock.close()
                return None
            if prefetch:
                self._ask_spare()
            return sock
        finally:
            self._lock.release()

    def prefetch_nowait(self) -> None:
        """Ask for the next spare handler unless one is at hand or asked for already, or
        another thread holds the channel (it asks itself). Never blocks, never raises: a
        channel that fails here is marked dead and the next ``open`` says so."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            if not (self._dead or self._pending or self._spare is not None):
                self._ask_spare()
        finally:
            self._lock.release()

    def _ask_spare(self) -> None:
        """Send the supervisor the ask for the next spare (``_lock`` held); its reply is
        read by the next ``open`` or ``open_nowait``."""
        try:
            self._conn.settimeout(OPEN_TIMEOUT_S)
            self._conn.sendall(b"N")
            self._pending = True
        except OSError:
            self._fail()  # this call's handler still serves; the next one falls back

    def _fresh(self) -> socket.socket:
        """Ask for a handler and wait for it (``_lock`` held, nothing pending)."""
        try:
            self._conn.settimeout(OPEN_TIMEOUT_S)
            self._conn.sendall(b"N")
            _, fds, _, _ = socket.recv_fds(self._conn, 1, 1)
        except OSError as e:
            self._fail()
            raise Unavailable(f"no handler from the supervisor: {e}") from None
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            self._fail()
            raise Unavailable("the supervisor could not start a handler")
        return socket.socket(fileno=fds[0])

    def _collect(self) -> None:
        """Read the prefetched handler's reply into ``_spare`` (``_lock`` held). A refusal
        (no pid to fork with) leaves no spare; a broken connection raises ``Unavailable``."""
        if not self._pending:
            return
        self._pending = False
        try:
            self._conn.settimeout(OPEN_TIMEOUT_S)
            _, fds, _, _ = socket.recv_fds(self._conn, 1, 1)
        except OSError as e:
            self._fail()
            raise Unavailable(f"no handler from the supervisor: {e}") from None
        if len(fds) == 1:
            self._spare = socket.socket(fileno=fds[0])
        else:
            for fd in fds:
                os.close(fd)

    def _fail(self) -> None:
        self._dead = True
        self._conn.close()  # a handler passed late is closed with it: nothing runs
        if self._spare is not None:
            self._spare.close()  # the unused handler reads EOF and exits
            self._spare = None

    def close(self) -> None:
        """Drop the connection (the supervisor then just idles)."""
        with self._lock:
            self._fail()


def _alive(sock: socket.socket) -> bool:
    """True while the handler at the other end of ``sock`` has not gone (no EOF, no data:
    a handler says nothing before it has read its record)."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def frames(
    sock: socket.socket, record: bytes, *, read_timeout_s: float, max_bytes: int, what: str
) -> Iterator[Frame]:
    """Send ``record`` (sent before this returns: errors raise here) and return an iterator
    of the reply's frames up to the final ``R`` or ``X``. ``read_timeout_s`` (seconds)
    bounds the whole reply; ``max_bytes`` its size (what the request allows, with room for
    framing). The socket is closed when the iterator ends.

    Raises ``SandboxError`` (the connection broke, ended without a result, or the reply
    broke either bound).
    """
    try:
        sock.settimeout(read_timeout_s)
        sock.sendall(record)
    except OSError as e:
        sock.close()
        raise SandboxError(f"{what}: sending the request on the channel failed: {e}") from e
    return _read(sock, what, time.monotonic() + read_timeout_s, max_bytes)


def _read(sock: socket.socket, what: str, deadline: float, max_bytes: int) -> Iterator[Frame]:
    decoder = FrameDecoder()
    received = 0
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            sock.settimeout(left)
            data = sock.recv(1 << 16)
            if not data:
                raise HandlerLost(f"{what}: the channel closed without a result")
            received += len(data)
            if received > max_bytes:
                raise SandboxError(f"{what}: the reply exceeds {max_bytes} bytes")
            for frame in decoder.feed(data):
                yield frame
                if frame.kind in (FRAME_RESULT, FRAME_ERROR):
                    return
    except TimeoutError as e:  # the handler stopped (SIGSTOP) or hangs: the sandbox's doing
        raise HandlerLost(f"{what}: no result on the channel within the timeout") from e
    except OSError as e:  # reset: the handler was killed mid-reply
        raise HandlerLost(f"{what}: the channel failed: {e}") from e
    finally:
        sock.close()
