"""The exec lane: one-shot ``POST /v1/sandboxes/{id}/exec`` without the framework's per-request
machinery.

An exec of ``echo hi`` spent about half of the event loop's CPU between uvicorn and the
endpoint: Starlette's routing over every route, FastAPI's dependency resolution and body
handling, and each middleware's ``send`` wrapper. ``ExecLane`` is a pure ASGI middleware,
outermost of the app's own, that recognises a request it fully understands and serves it
in one place; anything else goes on, untouched, to the full stack (the reference):

- served: ``POST /v1/sandboxes/<id>/exec`` with no query string and no ``root_path`` (a
  route ``Idempotency-Key`` does not cover: exec is not keyed); tracing off;
  ``Settings.exec_fast_lane`` on; exactly one ``Content-Length`` (at most
  ``max_body_bytes``), one ``Content-Type`` of ``application/json`` (optionally
  ``; charset=utf-8``), at most one ``Authorization`` and ``X-Request-ID``; a UTF-8 body
  within ``max_json_depth`` that ``json.loads`` reads and ``ExecIn`` accepts (as FastAPI
  reads and validates it); a key that authenticates.
- passed on (the full stack answers, with the body replayed as received): everything
  else, so every 400/401/413/422 of the request's shape comes from the reference path,
  and a refused key is audited there (``auth.failed``). Nothing is changed before a
  request is passed on (authentication only reads).

A served request gets what the full stack gives it: the request id (``X-Request-ID``,
the context variable, the scope key for the 500 handler), the access log line and the
HTTP metrics under the route's template, the tenant's rate limit (429 with
``Retry-After``), the same service call (``sandboxes.exec_json``: channel, audit event
durable before the answer) and the same problem+json for every ``CrucibleError``
(``problems.crucible_error_response``). An unexpected exception propagates to Starlette's
server-error handler, as from the route. ``tests/integration/api/test_exec_lane.py`` sends
the same requests both ways and compares statuses, bodies, headers and audit events.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass

from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service import idempotency, logs, tracing
from service.api.limits import declared_length, json_depth_exceeds
from service.api.problems import crucible_error_response
from service.api.sandboxes import exec_json
from service.context import ServiceContext
from service.errors import CrucibleError
from service.metrics import HTTP_LATENCY, HTTP_REQUESTS
from service.schemas import ExecIn
from service.tenants import Principal

ROUTE = "/v1/sandboxes/{sandbox_id}/exec"
_PATH = re.compile(r"/v1/sandboxes/([^/]+)/exec")
_JSON = frozenset({b"application/json", b"application/json; charset=utf-8"})
# The request headers the lane reads; a request repeating one goes to the full stack
# (whose parts disagree on which copy counts).
_READ = frozenset({b"content-length", b"content-type", b"authorization", b"x-request-id"})


@dataclass
class LaneStats:
    """Requests the lane served and passed on (this process, every app)."""

    served: int = 0
    passed: int = 0


stats = LaneStats()


class ExecLane:
    """Serves one-shot execs it fully understands, passes every other request on (module
    docstring). Pure ASGI; the app's ``ServiceContext`` comes from ``scope["app"]``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or scope["query_string"]
            or scope.get("root_path")
            or tracing.enabled()
            or (match := _PATH.fullmatch(scope["path"])) is None
            or idempotency.keyed("POST", scope["path"])  # were exec ever keyed
        ):
            await self.app(scope, receive, send)
            return
        ctx: ServiceContext = scope["app"].state.ctx
        settings = ctx.settings
        if not settings.exec_fast_lane:
            await self.app(scope, receive, send)
            return
        headers: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:
            if name in _READ:
                if name in headers:
                    return await self._pass(scope, receive, send)
                headers[name] = value
        declared = declared_length(headers.get(b"content-length"))
        if (
            declared is None
            or declared > settings.max_body_bytes
            or headers.get(b"content-type", b"").lower() not in _JSON
        ):
            return await self._pass(scope, receive, send)
        chunks = bytearray()  # at most the declared length: uvicorn delivers no more
        while True:
            message = await receive()
            if message["type"] != "http.request":  # a disconnect: the full stack's answer
                return await self._pass(scope, _replay(bytes(chunks), receive, more=True), send)
            chunks += message.get("body", b"")
            if not message.get("more_body", False):
                break
        body = bytes(chunks)
        replay = _replay(body, receive, more=False)
        try:
            body.decode("utf-8")
            if not body or json_depth_exceeds(body, settings.max_json_depth):
                return await self._pass(scope, replay, send)
            exec_in = ExecIn.model_validate(json.loads(body))
        except (ValueError, ValidationError):  # not UTF-8, not JSON, not an ExecIn
            return await self._pass(scope, replay, send)
        scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        try:
            principal = ctx.keys.authenticate(token.strip() if scheme.lower() == "bearer" else None)
        except Exception:  # noqa: BLE001 - a read only: the full stack answers (and audits a refusal)
            return await self._pass(scope, replay, send)
        stats.served += 1
        await self._serve(scope, replay, send, ctx, principal, match.group(1), exec_in, headers)

    async def _pass(self, scope: Scope, receive: Receive, send: Send) -> None:
        stats.passed += 1
        await self.app(scope, receive, send)

    async def _serve(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        ctx: ServiceContext,
        principal: Principal,
        sandbox_id: str,
        body: ExecIn,
        headers: dict[bytes, bytes],
    ) -> None:
        incoming = headers.get(b"x-request-id")
        rid = logs.accept_request_id(incoming.decode("latin-1") if incoming else None)
        scope[logs.SCOPE_KEY] = rid
        token = logs.request_id.set(rid)
        t0 = time.perf_counter()
        status = 500
        try:
            try:
                if ctx.limiter.enabled:  # as get_principal: a Redis round trip, off the loop
                    await run_in_threadpool(ctx.limiter.check, principal.tenant_id)
                payload = await exec_json(ctx, principal, sandbox_id, body)
            except CrucibleError as e:
                response = crucible_error_response(e, request=Request(scope))
                status = response.status_code
                response.raw_headers = [
                    *(h for h in response.raw_headers if h[0] != b"x-request-id"),
                    (b"x-request-id", rid.encode()),
                ]
                await response(scope, receive, send)
                return
            status = 200
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-length", str(len(payload)).encode()),
                        (b"content-type", b"application/json"),
                        (b"x-request-id", rid.encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": payload})
        finally:
            elapsed_s = time.perf_counter() - t0
            code = str(status)
            HTTP_REQUESTS.labels("POST", ROUTE, code).inc()
            HTTP_LATENCY.labels("POST", ROUTE).observe(elapsed_s)
            if logs.access_log.isEnabledFor(logging.INFO):
                duration_ms = round(elapsed_s * 1e3, 3)
                logs.access_log.info(
                    "%s %s %d %.1f ms",
                    "POST",
                    scope["path"].encode("unicode_escape").decode("ascii"),
                    status,
                    duration_ms,
                    extra={
                        "method": "POST",
                        "route": ROUTE,
                        "status": status,
                        "duration_ms": duration_ms,
                    },
                )
            logs.request_id.reset(token)


def _replay(body: bytes, receive: Receive, *, more: bool) -> Receive:
    """A ``receive`` that hands ``body`` over once (``more``: the rest, if any, follows
    from the client's), then defers to the client's."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": more}
        return await receive()

    return replayed
