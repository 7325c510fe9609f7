"""The live event stream as server-sent events: ``GET /v1/events`` (API key) and
``GET /dashboard/live/events`` (dashboard session).

Each event is ``event: <action>`` / ``data: <json>`` (see ``service.events``); a tenant sees
its own events, an admin every tenant's and the pools'. ``actions`` keeps the events whose
action starts with one of its comma-separated prefixes. A request must accept
``text/event-stream`` (``EventSource`` does; anything else is a 400 naming ``accept``, so a
client that would read the body to its end is told instead of held). A gap (the replica
lost its link to Redis) is sent as ``event: gap``: a client re-reads what it shows. A
comment line every 15 s keeps proxies from closing the stream; the stream ends after
``max_s`` seconds and the client reconnects (``retry: 1000``, as ``EventSource`` does), so
a stopping server never waits longer than that on an open stream.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from service.api.deps import Ctx, CurrentPrincipal
from service.api.problems import error_responses
from service.dashboard.auth import CurrentViewer
from service.errors import InvalidRequest
from service.events import EventBus

router = APIRouter(tags=["events"])

QUEUE_MAX = 1000
KEEPALIVE_S = 15.0
_GAP: dict[str, Any] = {"action": "gap"}

Actions = Annotated[
    str | None,
    Query(
        max_length=500,
        pattern=r"^[a-z_.,]*$",
        description="Comma-separated action prefixes to keep, e.g. 'sandbox.,record.'.",
    ),
]
MaxS = Annotated[float, Query(gt=0, le=600, description="Seconds before the stream ends.")]


async def _stream(
    request: Request, bus: EventBus, *, scope: str | None, prefixes: tuple[str, ...], max_s: float
) -> AsyncIterator[bytes]:
    """SSE lines of the events ``scope`` (a tenant id; None: all) may see."""
    loop = asyncio.get_running_loop()
    q: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=QUEUE_MAX)

    def put(ev: dict[str, Any]) -> None:
        if q.full():  # a slow client: tell it to re-read instead of growing without bound
            while not q.empty():
                q.get_nowait()
            ev = _GAP
        q.put_nowait(ev)

    def on_event(ev: dict[str, Any]) -> None:
        if scope is not None and ev.get("tenant_id") != scope:
            return
        if prefixes and not str(ev.get("action", "")).startswith(prefixes):
            return
        loop.call_soon_threadsafe(put, ev)

    stop = bus.listen(on_event, lambda: loop.call_soon_threadsafe(put, _GAP))
    deadline = time.monotonic() + max_s
    sent = time.monotonic()
    try:
        yield b"retry: 1000\n: connected\n\n"
        while time.monotonic() < deadline and not await request.is_disconnected():
            try:
                ev = await asyncio.wait_for(q.get(), timeout=1.0)
            except TimeoutError:
                if time.monotonic() - sent >= KEEPALIVE_S:
                    sent = time.monotonic()
                    yield b": keep-alive\n\n"
                continue
            sent = time.monotonic()
            data = json.dumps(ev, default=str, separators=(",", ":"))
            yield f"event: {ev['action']}\ndata: {data}\n\n".encode()
    finally:
        stop()


def _response(
    request: Request, bus: EventBus, scope: str | None, actions: str | None, max_s: float
) -> StreamingResponse:
    if "text/event-stream" not in request.headers.get("accept", ""):
        raise InvalidRequest(
            "this endpoint streams server-sent events: send 'Accept: text/event-stream'",
            field="accept",
        )
    prefixes = tuple(p for p in (actions or "").split(",") if p)
    return StreamingResponse(
        _stream(request, bus, scope=scope, prefixes=prefixes, max_s=max_s),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


@router.get(
    "/v1/events",
    summary="Live events (server-sent events)",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}}, **error_responses(400)},
)
def api_events(
    request: Request,
    ctx: Ctx,
    principal: CurrentPrincipal,
    actions: Actions = None,
    max_s: MaxS = 60.0,
) -> StreamingResponse:
    """Stream pool, sandbox, snapshot, episode, job, key and record events as they commit."""
    scope = None if principal.is_admin else principal.tenant_id
    return _response(request, ctx.events, scope, actions, max_s)


@router.get("/dashboard/live/events", include_in_schema=False)
def dashboard_events(
    request: Request, ctx: Ctx, viewer: CurrentViewer, actions: Actions = None, max_s: MaxS = 60.0
) -> StreamingResponse:
    """The same stream for the dashboard's live view (session cookie, the viewer's scope)."""
    return _response(request, ctx.events, viewer.scope, actions, max_s)
