"""``DockerRuntime.exec_async``: a one-shot exec over the channel, awaited on the event loop.

The blocking ``exec`` costs a worker-thread hop each way (the route's, and every blocking
read on the channel socket). Here the request record is sent and the reply's frames read
with the loop's own socket calls (``loop.sock_sendall`` / ``sock_recv``), so the REST exec
route runs without a thread. Only the common case takes this path: a container with a live
channel whose spare handler is at hand (``ControlChannel.open_nowait``), whose metadata is
cached and whose pids baseline is known. Everything else (no channel or ``docker exec``,
a frozen sandbox, the first exec in a container, a handler that could not start the
command, an exit 137 whose OOM must be asked of the engine) is served by the blocking
``exec`` on a worker thread, so results and errors are the same on both paths.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from typing import TYPE_CHECKING

from starlette.concurrency import run_in_threadpool

from service.errors import SandboxError
from service.runtime import channel
from service.runtime.base import ExecRequest, ExecResult, HandlerLost
from service.runtime.protocol import (
    FRAME_ERROR,
    ExecCollector,
    FrameDecoder,
    encode_exec,
    with_identity,
)

if TYPE_CHECKING:
    from service.runtime.docker import DockerRuntime

_READ_MARGIN_S = 30.0  # as the blocking path: slack over the exec's timeout and grace
_NOT_STARTED = (b"internal", b"spawn")  # handler errors before any process existed


class _Fallback(Exception):
    """Nothing ran: the blocking ``exec`` serves the request."""


async def exec_async(runtime: DockerRuntime, container_id: str, request: ExecRequest) -> ExecResult:
    """Run ``request`` to completion like ``DockerRuntime.exec`` (same result, same errors:
    ``InvalidRequest``, ``NotFound``, ``Conflict``, ``SandboxError``), awaiting the channel's
    I/O on the running loop (module docstring). A cancelled caller's command is stopped
    (SIGTERM to its process group, SIGKILL after the grace)."""
    with runtime._meta_lock:
        control = runtime._channels.get(container_id)
        meta = runtime._meta.get(container_id)
        seen = container_id in runtime._pids
    sock = None
    if control is not None and meta is not None and seen and container_id not in runtime._frozen:
        with contextlib.suppress(channel.Unavailable):  # the blocking path falls back for good
            sock = control.open_nowait(prefetch=False)  # asked for once this one answered
    if sock is None:
        return await run_in_threadpool(runtime.exec, container_id, request)
    assert control is not None and meta is not None
    record = with_identity(
        encode_exec(request, grace_ms=runtime._kill_grace_ms), request.user or meta.user or ""
    )
    timeout_s = request.timeout_s + runtime._kill_grace_ms / 1000 + _READ_MARGIN_S
    max_bytes = 2 * request.max_output_bytes + 2 * request.observe_bytes + (1 << 20)
    disk_hits = runtime._disk.hits(container_id)
    collector = ExecCollector()
    t0 = time.monotonic()
    try:
        try:
            result = await _converse(sock, record, collector, timeout_s, max_bytes, container_id)
        finally:
            control.prefetch_nowait()  # the next spare forks while this answer goes back
    except _Fallback:
        return await run_in_threadpool(runtime.exec, container_id, request)
    except HandlerLost as e:
        result = await run_in_threadpool(runtime._lost_result, container_id, collector, t0, e)
    except asyncio.CancelledError:
        if collector.pid is not None and collector.result is None:
            pid, user = collector.pid, request.user
            asyncio.get_running_loop().run_in_executor(
                None, lambda: runtime._cancel(container_id, pid, user=user)
            )
        raise

    def finish() -> ExecResult:
        return runtime._finish(
            container_id,
            result,
            oom_known=collector.oom_known,
            pids_reclaimed=False,
            disk_hits=disk_hits,
        )

    if not collector.oom_known and result.exit_code == 137:  # the engine is asked
        return await run_in_threadpool(finish)
    return finish()  # reads one cgroup file: microseconds


async def _converse(
    sock: socket.socket,
    record: bytes,
    collector: ExecCollector,
    timeout_s: float,
    max_bytes: int,
    container_id: str,
) -> ExecResult:
    """Send ``record`` on the handler ``sock`` and read frames into ``collector`` until the
    result (closing ``sock``). Raises ``_Fallback`` when the handler could not start the
    command, ``SandboxError`` when the channel broke or either bound was passed, and what an
    ``X`` frame stands for."""
    what = f"exec in container {container_id}"
    loop = asyncio.get_running_loop()
    decoder = FrameDecoder()
    received, first = 0, True
    try:
        sock.setblocking(False)
        async with asyncio.timeout(timeout_s):
            try:
                await loop.sock_sendall(sock, record)
            except OSError as e:
                raise SandboxError(f"{what}: sending the request on the channel failed: {e}") from e
            while True:
                data = await loop.sock_recv(sock, 1 << 16)
                if not data:
                    raise HandlerLost(f"{what}: the channel closed without a result")
                received += len(data)
                if received > max_bytes:
                    raise SandboxError(f"{what}: the reply exceeds {max_bytes} bytes")
                for frame in decoder.feed(data):
                    if first:
                        first = False
                        kind = frame.payload.split(b"\n", 1)[0]
                        if frame.kind == FRAME_ERROR and kind in _NOT_STARTED:
                            raise _Fallback
                    item = collector.add(frame)  # raises what an X frame stands for
                    if isinstance(item, ExecResult):
                        return item
    except TimeoutError as e:  # the handler stopped (SIGSTOP) or hangs: the sandbox's doing
        raise HandlerLost(f"{what}: no result on the channel within the timeout") from e
    except OSError as e:  # reset: the handler was killed mid-reply
        raise HandlerLost(f"{what}: the channel failed: {e}") from e
    finally:
        sock.close()
