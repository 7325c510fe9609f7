"""Routes under /v1/sandboxes: lease, list, get, exec, files, heartbeat, snapshot, release."""

from __future__ import annotations

import asyncio
import base64
import binascii
import codecs
import contextlib
import json
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote

from fastapi import APIRouter, Query, Request, Response, status
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from service import episodes, files, sandboxes
from service.api.deps import Ctx, CurrentPrincipal
from service.api.limits import declared_length
from service.api.problems import error_responses, problem_body
from service.context import ServiceContext
from service.db.models import Sandbox, Snapshot
from service.errors import CrucibleError, InvalidRequest, PayloadTooLarge
from service.metrics import EXEC_LATENCY, EXECS
from service.runtime.base import ExecChunk, ExecRequest, ExecResult
from service.sandbox_user import with_user
from service.schemas import (
    ExecIn,
    ExecOut,
    FileOut,
    HeartbeatIn,
    LeaseRequest,
    SandboxList,
    SandboxOut,
    SnapshotOut,
)
from service.tenants import Principal

router = APIRouter(prefix="/v1/sandboxes", tags=["sandboxes"])


def sandbox_out(row: Sandbox) -> SandboxOut:
    """DB row -> API schema."""
    return SandboxOut(
        id=row.id,
        template=row.template,
        state=row.state,
        image=row.image,
        cpus=row.cpus,
        memory_mb=row.memory_mb,
        created_at=row.created_at,
        leased_at=row.leased_at,
        expires_at=row.expires_at,
        ended_at=row.ended_at,
        metadata=row.metadata_ or {},
        source_snapshot_id=row.source_snapshot_id,
        failure=row.failure,
    )


def snapshot_out(snap: Snapshot) -> SnapshotOut:
    """DB row -> API schema."""
    return SnapshotOut(
        id=snap.id,
        sandbox_id=snap.sandbox_id,
        template=snap.template,
        created_at=snap.created_at,
        bytes=snap.bytes,
        expires_at=snap.expires_at,
    )


def exec_out(res: ExecResult, *, b64: bool) -> ExecOut:
    """Runtime result -> API schema (text with U+FFFD for invalid UTF-8; base64 on request)."""
    return ExecOut(
        exit_code=res.exit_code,
        signal=res.signal,
        timed_out=res.timed_out,
        oom_killed=res.oom_killed,
        pids_limit_hit=res.pids_limit_hit,
        disk_limit_hit=res.disk_limit_hit,
        stdout=res.stdout.decode("utf-8", "replace"),
        stderr=res.stderr.decode("utf-8", "replace"),
        stdout_b64=base64.b64encode(res.stdout).decode() if b64 else None,
        stderr_b64=base64.b64encode(res.stderr).decode() if b64 else None,
        stdout_bytes=res.stdout_total_bytes,
        stderr_bytes=res.stderr_total_bytes,
        stdout_truncated=res.stdout_truncated,
        stderr_truncated=res.stderr_truncated,
        duration_ms=res.duration_ms,
        handler_lost=res.handler_lost,
    )


def _b64(value: str, field: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as e:
        raise InvalidRequest(f"{field} is not valid base64", field=field) from e


def _observe(res: ExecResult) -> None:
    outcome = (
        "timeout"
        if res.timed_out
        else "oom"
        if res.oom_killed
        else "ok"
        if res.exit_code == 0
        else "nonzero"
    )
    EXECS.labels(outcome).inc()
    EXEC_LATENCY.observe(res.duration_ms / 1000)


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=SandboxOut,
    responses=error_responses(404, 409, 429, 502, 503),
)
async def lease(body: LeaseRequest, ctx: Ctx, principal: CurrentPrincipal) -> Response:
    """Lease a sandbox from the template's warm pool (a cold start only when it is empty).

    On the event loop: the claim's group commit is awaited without holding a worker thread
    (``sandboxes.lease_async``). The answer is serialized once (``lease_json``). Also served
    by the fast lane (``service.api.fastlane``) without this route's routing and
    dependencies; both call ``lease_json``."""
    return Response(
        await lease_json(ctx, principal, body),
        status_code=status.HTTP_201_CREATED,
        media_type="application/json",
    )


async def lease_json(ctx: ServiceContext, principal: Principal, body: LeaseRequest) -> bytes:
    """Lease per ``body`` (``sandboxes.lease_async``: its audit event durable before it
    returns) and return the sandbox's ``SandboxOut`` as JSON bytes: the same body FastAPI's
    ``response_model`` path gives, built once (that path would validate and encode it again).

    Raises:
        CrucibleError: what ``lease_async`` raises (404 unknown template, 400 bad limits or
        TTL, 429 over quota, 502/503...), each answered as problem+json by the caller.
    """
    limits = body.limits
    row = await sandboxes.lease_async(
        ctx,
        principal,
        template=body.template,
        ttl_s=body.ttl_s,
        metadata=body.metadata,
        cpus=limits.cpus if limits else None,
        memory_mb=limits.memory_mb if limits else None,
    )
    return sandbox_out(row).model_dump_json().encode()


@router.get("", response_model=SandboxList)
def list_(ctx: Ctx, principal: CurrentPrincipal, include_ended: bool = False) -> SandboxList:
    """The caller's sandboxes (live ones; ``include_ended`` adds the last ended ones)."""
    rows = sandboxes.list_sandboxes(ctx, principal, include_ended=include_ended)
    return SandboxList(sandboxes=[sandbox_out(r) for r in rows])


@router.get("/{sandbox_id}", response_model=SandboxOut, responses=error_responses(404))
def get(sandbox_id: str, ctx: Ctx, principal: CurrentPrincipal) -> SandboxOut:
    """One sandbox: state, limits, lease expiry."""
    return sandbox_out(sandboxes.get_owned(ctx, principal, sandbox_id))


@router.post(
    "/{sandbox_id}/exec",
    response_model=ExecOut,
    responses={
        200: {"content": {"application/x-ndjson": {}}},
        **error_responses(404, 409, 502),
    },
)
async def exec_(
    sandbox_id: str,
    body: ExecIn,
    ctx: Ctx,
    principal: CurrentPrincipal,
    stream: bool = Query(False, description="Stream NDJSON chunks, then the result."),
) -> Response:
    """Run a command. ``?stream=true`` answers NDJSON lines: chunks, then ``{"type":"result"}``.

    Runs on the event loop: the one-shot path awaits the channel and the audit's group
    commit (``sandboxes.exec_command_async``); what blocks (a ``user`` check, the streaming
    start) goes to a worker thread. The one-shot path is also served by the fast lane
    (``service.api.fastlane``) without this route's routing and dependencies; both call
    ``exec_json``."""
    if not stream:
        payload = await exec_json(ctx, principal, sandbox_id, body)
        return Response(payload, media_type="application/json")
    req = await exec_request(ctx, principal, sandbox_id, body)
    items = await run_in_threadpool(sandboxes.exec_stream, ctx, principal, sandbox_id, req)
    path = f"/v1/sandboxes/{sandbox_id}/exec"
    return StreamingResponse(
        _ndjson(items, b64=body.output_b64, request_path=path), media_type="application/x-ndjson"
    )


async def exec_request(
    ctx: ServiceContext, principal: Principal, sandbox_id: str, body: ExecIn
) -> ExecRequest:
    """The runtime's request for ``body`` (env and stdin decoded, limits applied, the
    ``user`` resolved on a worker thread when given).

    Raises:
        InvalidRequest: bad base64 in ``env_b64``/``stdin_b64``, or both stdin forms (400).
        CrucibleError: what ``build_exec_request`` or ``with_user`` raise (400, 403, 404).
    """
    env = {k: v.encode() for k, v in body.env.items()}
    env.update({k: _b64(v, f"env_b64.{k}") for k, v in body.env_b64.items()})
    if body.stdin is not None and body.stdin_b64 is not None:
        raise InvalidRequest("give stdin or stdin_b64, not both", field="stdin_b64")
    stdin = (
        _b64(body.stdin_b64, "stdin_b64")
        if body.stdin_b64 is not None
        else (body.stdin or "").encode()
    )
    req = sandboxes.build_exec_request(
        ctx,
        cmd=body.cmd,
        timeout_s=body.timeout_s,
        cwd=body.cwd,
        env=env,
        stdin=stdin,
        max_output_bytes=body.max_output_bytes,
    )
    if body.user is not None:  # reads the sandbox's template: a worker thread
        req = await run_in_threadpool(with_user, ctx, principal, sandbox_id, req, body.user)
    return req


async def exec_json(
    ctx: ServiceContext, principal: Principal, sandbox_id: str, body: ExecIn
) -> bytes:
    """Run a one-shot exec and return its ``ExecOut`` as JSON bytes, once the audit event
    is durable (``sandboxes.exec_command_async``).

    Raises:
        CrucibleError: what ``exec_request`` and ``exec_command_async`` raise (400, 404,
        409, 502...), each answered as problem+json by the caller.
    """
    req = await exec_request(ctx, principal, sandbox_id, body)
    res = await sandboxes.exec_command_async(ctx, principal, sandbox_id, req)
    _observe(res)
    return exec_out(res, b64=body.output_b64).model_dump_json().encode()


# Threads that read streaming execs: one per stream while it runs (the default executor's
# few threads would queue streams behind each other).
_STREAM_READERS = ThreadPoolExecutor(max_workers=128, thread_name_prefix="crucible-stream")


async def _ndjson(
    items: sandboxes.AuditedExecStream, *, b64: bool, request_path: str
) -> AsyncIterator[bytes]:
    """NDJSON lines of a streaming exec. A thread reads the exec; a client that goes away
    (the response is cancelled) cancels the command at once: SIGTERM to its process group,
    SIGKILL after the grace. A Crucible error after the response began (a ``cwd`` that is
    not a directory, found when the command starts) is the last line,
    ``{"type": "error", "problem": {...}}`` (problem+json's members)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[ExecChunk | ExecResult | Exception | None] = asyncio.Queue()

    def put(item: ExecChunk | ExecResult | Exception | None) -> None:
        with contextlib.suppress(RuntimeError):  # the event loop is gone: nobody listens
            loop.call_soon_threadsafe(queue.put_nowait, item)

    def pump() -> None:
        try:
            for item in items:
                put(item)
        except Exception as e:  # handed to the response below, or dropped once cancelled
            put(e)
            return
        put(None)

    loop.run_in_executor(_STREAM_READERS, pump)
    decoders = {s: codecs.getincrementaldecoder("utf-8")("replace") for s in ("stdout", "stderr")}
    finished = False
    try:
        while (item := await queue.get()) is not None:
            if isinstance(item, CrucibleError):
                # The response has begun: the problem goes in-band as the last line (the
                # client raises it), never as a broken stream.
                finished = True
                problem = problem_body(
                    item.status,
                    item.title,
                    item.detail,
                    instance=request_path,
                    field=getattr(item, "field", None),
                )
                yield (json.dumps({"type": "error", "problem": problem}) + "\n").encode()
                return
            if isinstance(item, Exception):
                finished = True
                raise item
            if isinstance(item, ExecResult):
                _observe(item)
                line = {"type": "result", "result": exec_out(item, b64=b64).model_dump()}
            else:
                line = {"type": item.stream, "data": decoders[item.stream].decode(item.data)}
                if b64:
                    line["data_b64"] = base64.b64encode(item.data).decode()
            yield (json.dumps(line) + "\n").encode()
        finished = True
    finally:
        if not finished:
            loop.run_in_executor(_STREAM_READERS, items.cancel)


@router.post(
    "/{sandbox_id}/heartbeat", response_model=SandboxOut, responses=error_responses(404, 409)
)
def heartbeat(
    sandbox_id: str, ctx: Ctx, principal: CurrentPrincipal, body: HeartbeatIn | None = None
) -> SandboxOut:
    """Extend the lease to now + ``ttl_s``."""
    ttl = body.ttl_s if body else None
    return sandbox_out(sandboxes.heartbeat(ctx, principal, sandbox_id, ttl_s=ttl))


@router.delete("/{sandbox_id}", response_model=SandboxOut, responses=error_responses(404, 409, 502))
def release(sandbox_id: str, ctx: Ctx, principal: CurrentPrincipal) -> SandboxOut:
    """Release the lease; the sandbox is destroyed, never handed to anyone else. ``409``
    while its episode is being verified."""
    episodes.refuse_while_verifying(ctx, sandbox_id)
    return sandbox_out(sandboxes.release(ctx, principal, sandbox_id))


@router.post(
    "/{sandbox_id}/snapshots",
    status_code=status.HTTP_201_CREATED,
    response_model=SnapshotOut,
    responses=error_responses(404, 409, 429, 502),
)
def snapshot(sandbox_id: str, ctx: Ctx, principal: CurrentPrincipal) -> SnapshotOut:
    """Freeze the sandbox's filesystem; fork it with ``POST /v1/snapshots/{id}/fork``.
    ``409`` while its episode is being verified."""
    episodes.refuse_while_verifying(ctx, sandbox_id)
    return snapshot_out(sandboxes.snapshot(ctx, principal, sandbox_id))


async def _read_body(request: Request, limit: int) -> bytes:
    declared = declared_length(request.headers.get("content-length", "").encode("latin-1"))
    if declared is not None and declared > limit:
        raise PayloadTooLarge(
            f"upload of {declared} bytes exceeds the limit of {limit}", field="body"
        )
    buf = bytearray()
    async for chunk in request.stream():
        buf += chunk
        if len(buf) > limit:
            raise PayloadTooLarge(f"upload exceeds the limit of {limit} bytes", field="body")
    return bytes(buf)


@router.put(
    "/{sandbox_id}/files",
    response_model=FileOut,
    responses=error_responses(400, 404, 408, 409, 413, 502),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                "application/x-tar": {"schema": {"type": "string", "format": "binary"}},
            },
        }
    },
)
async def put_file(
    sandbox_id: str,
    request: Request,
    ctx: Ctx,
    principal: CurrentPrincipal,
    path: str = Query(..., min_length=1, max_length=4096),
) -> FileOut:
    """Upload the body to ``path`` (parents created); ``Content-Type: application/x-tar``
    extracts a tar into directory ``path`` instead."""
    data = await _read_body(request, ctx.settings.max_upload_bytes)
    is_tar = request.headers.get("content-type", "").split(";")[0].strip() == "application/x-tar"
    resolved, n = await run_in_threadpool(
        files.put, ctx, principal, sandbox_id, path=path, data=data, is_tar=is_tar
    )
    return FileOut(path=resolved, bytes=n, kind="tar" if is_tar else "file")


def content_disposition(path: str, kind: str) -> str:
    """``attachment`` with the file's base name (a tar: ``<name>.tar``), per RFC 6266: an
    ASCII ``filename`` fallback (other characters as ``_``) and ``filename*`` in UTF-8,
    percent-encoded (RFC 8187, formerly 5987), so any name fits a Latin-1 header."""
    name = path.rstrip("/").rpartition("/")[2] or "root"
    if kind == "tar":
        name += ".tar"
    fallback = "".join(c if 0x20 <= ord(c) < 0x7F and c not in '"\\%' else "_" for c in name)
    encoded = quote(name.encode("utf-8", "surrogateescape"), safe="")
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{encoded}"


@router.get(
    "/{sandbox_id}/files",
    responses={
        200: {
            "content": {"application/octet-stream": {}, "application/x-tar": {}},
            "headers": {
                "X-Crucible-Path": {
                    "description": "The resolved path, percent-encoded UTF-8 (RFC 3986)",
                    "schema": {"type": "string"},
                },
                "X-Crucible-Kind": {"schema": {"type": "string", "enum": ["file", "tar"]}},
            },
        },
        **error_responses(400, 404, 409, 502),
    },
)
def get_file(
    sandbox_id: str,
    ctx: Ctx,
    principal: CurrentPrincipal,
    path: str = Query(..., min_length=1, max_length=4096),
) -> StreamingResponse:
    """Download ``path``: a regular file as bytes, a directory as a tar. The resolved path
    comes back in ``X-Crucible-Path`` (percent-encoded) and ``Content-Disposition``."""
    dl = files.get(ctx, principal, sandbox_id, path=path)
    media = "application/octet-stream" if dl.kind == "file" else "application/x-tar"
    response = StreamingResponse(
        dl.chunks,
        media_type=media,
        headers={
            "Content-Length": str(dl.size),
            "Content-Disposition": content_disposition(dl.path, dl.kind),
            "X-Crucible-Path": quote(dl.path.encode("utf-8", "surrogateescape"), safe="/"),
            "X-Crucible-Kind": dl.kind,
        },
    )
    files.audit_download(ctx, principal, sandbox_id, dl)  # only once the response is sound
    return response
