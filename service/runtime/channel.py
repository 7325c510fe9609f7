"""The exec channel: requests to a sandbox's idle supervisor over a unix socket.

A ``docker exec`` costs ~45 ms here (the engine starts a process in the container through
runc), about as much as a short command itself. Every sandbox's main process is
``crucible-exec --idle``; with a channel directory it also listens on
``CHANNEL_MOUNT/ctl.sock``, a bind mount of a per-sandbox directory on the engine's host.
The control plane connects there, writes one request record (``protocol``) with the identity
to take, and reads the same frames a ``docker exec`` of the supervisor would print: ~1 ms
of transport instead of ~45.

Trust, both ways:
- The supervisor serves only peers outside the container's pid namespace (``SO_PEERCRED``
  pid 0): nothing inside the sandbox can use the socket to run as another user.
- Before sending anything, the control plane checks its peer: the process must run
  ``/opt/crucible/crucible-exec`` (the read-only volume) in this container's cgroup, so a
  socket or symlink the agent planted in the directory is never spoken to.

``Unavailable`` means nothing was sent (no socket yet, a container made without a channel,
an engine on another host, a peer that fails the check): the caller uses ``docker exec``.
Once a request is sent, failures are errors, never retried elsewhere (the command may have
run).
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

from service.errors import SandboxError
from service.runtime.protocol import FRAME_ERROR, FRAME_RESULT, Frame, FrameDecoder

CHANNEL_MOUNT = "/opt/crucible-ctl"
SOCKET_NAME = "ctl.sock"
SUPERVISOR_EXE = "/opt/crucible/crucible-exec"
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
CONNECT_TIMEOUT_S = 5.0
# The supervisor answers at once (an exec's ``S`` frame comes right after its fork): a longer
# silence before the first frame means it cannot run (a container paused behind our back).
FIRST_FRAME_TIMEOUT_S = 15.0


class Unavailable(Exception):
    """No channel to talk to; nothing was sent."""


def socket_path_in_sandbox() -> str:
    """Where the supervisor listens, inside the sandbox."""
    return f"{CHANNEL_MOUNT}/{SOCKET_NAME}"


def connect(directory: Path, container_id: str) -> socket.socket:
    """A connection to the supervisor listening in ``directory`` (the host side of the
    sandbox's channel mount), its peer checked (module docstring).

    The socket is reached through ``/proc/self/fd`` of the opened directory, so the path
    length limit of unix sockets (108 bytes) never applies. Raises ``Unavailable``.
    """
    try:
        dir_fd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        raise Unavailable(f"no channel directory: {e}") from None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_TIMEOUT_S)
        sock.connect(f"/proc/self/fd/{dir_fd}/{SOCKET_NAME}")
        pid, _, _ = _PEERCRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        )
        _check_peer(pid, container_id)
    except (OSError, Unavailable) as e:
        sock.close()
        raise Unavailable(f"channel of container {container_id}: {e}") from None
    finally:
        os.close(dir_fd)
    return sock


def _check_peer(pid: int, container_id: str) -> None:
    if pid <= 0:
        raise Unavailable("peer has no pid here")
    exe = os.readlink(f"/proc/{pid}/exe")
    cgroups = Path(f"/proc/{pid}/cgroup").read_text()
    if exe != SUPERVISOR_EXE or container_id not in cgroups:
        raise Unavailable(f"peer {pid} ({exe}) is not this sandbox's supervisor")


def frames(
    sock: socket.socket, record: bytes, *, read_timeout_s: float, what: str
) -> Iterator[Frame]:
    """Send ``record`` (sent before this returns: errors raise here) and return an iterator
    of the reply's frames up to the final ``R`` or ``X``. ``read_timeout_s``: the longest
    silence tolerated, in seconds. The socket is closed when the iterator ends.

    Raises ``SandboxError`` (the connection broke, or ended without a result).
    """
    try:
        sock.settimeout(min(read_timeout_s, FIRST_FRAME_TIMEOUT_S))
        sock.sendall(record)
    except OSError as e:
        sock.close()
        raise SandboxError(f"{what}: sending the request on the channel failed: {e}") from e
    return _read(sock, what, read_timeout_s)


def _read(sock: socket.socket, what: str, read_timeout_s: float) -> Iterator[Frame]:
    decoder = FrameDecoder()
    first = True
    try:
        while data := sock.recv(1 << 16):
            if first:
                first = False
                sock.settimeout(read_timeout_s)
            for frame in decoder.feed(data):
                yield frame
                if frame.kind in (FRAME_RESULT, FRAME_ERROR):
                    return
        raise SandboxError(f"{what}: the channel closed without a result")
    except TimeoutError as e:
        state = "the supervisor did not answer" if first else "no output within the timeout"
        raise SandboxError(f"{what}: {state} on the channel") from e
    except OSError as e:
        raise SandboxError(f"{what}: the channel failed: {e}") from e
    finally:
        sock.close()
