"""The fast lane: one-shot exec and lease without the framework's per-request machinery.

An exec of ``echo hi`` spent about half of the event loop's CPU between uvicorn and the
endpoint, and a lease burst of 128 about the same share of its own: Starlette's routing
over every route, FastAPI's dependency resolution and body handling, and each
middleware's ``send`` wrapper. ``FastLane`` is a pure ASGI middleware, outermost of the
app's own, that recognises a request it fully understands and serves it in one place;
anything else goes on, untouched, to the full stack (the reference). Its routes (``ROUTES``:
method, path pattern, the body's pydantic model, the handler) are:

- ``POST /v1/sandboxes/<id>/exec``, one-shot (``ExecIn``, ``api.sandboxes.exec_json``): 200;
- ``POST /v1/sandboxes`` (``LeaseRequest``, ``api.sandboxes.lease_json``: the lease route's
  own code, ``sandboxes.lease_async``): 201.

- served: one of those, with no query string and no ``root_path``; no ``Idempotency-Key``
  header on a route that key covers (``idempotency.keyed``: the lease; the
  ``IdempotencyMiddleware`` of the full stack handles those); tracing off;
  ``Settings.fast_lane`` on; exactly one ``Content-Length`` (at most ``max_body_bytes``), one
  ``Content-Type`` of ``application/json`` (optionally ``; charset=utf-8``), at most one
  ``Authorization``, ``X-Request-ID`` and ``Idempotency-Key``; a UTF-8 body within
  ``max_json_depth`` that ``json.loads`` reads and the route's model accepts (as FastAPI
  reads and validates it); a key that authenticates.
- passed on (the full stack answers, with the body replayed as received): everything
  else, so every 400/401/413/422 of the request's shape comes from the reference path,
  and a refused key is audited there (``auth.failed``). Nothing is changed before a
  request is passed on (authentication only reads).

A served request gets what the full stack gives it: the request id (``X-Request-ID``,
the context variable, the scope key for the 500 handler), the access log line and the
HTTP metrics under the route's template, the tenant's rate limit (429 with
``Retry-After``), the same service call (the route's handler: its audit event durable
before the answer) and the same problem+json for every ``CrucibleError``
(``problems.crucible_error_response``). An unexpected exception propagates to Starlette's
server-error handler, as from the route. ``tests/integration/api/test_exec_lane.py`` and
``test_lease_lane.py`` send the same requests both ways and compare statuses, bodies,
headers and audit events.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import cast

from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from service import idempotency, logs, tracing
from service.api.limits import SINGLE_HEADERS, declared_length, json_depth_exceeds, replay
from service.api.problems import crucible_error_response
from service.api.sandboxes import exec_json, lease_json
from service.context import ServiceContext
from service.errors import CrucibleError
from service.metrics import HTTP_LATENCY, HTTP_REQUESTS
from service.schemas import ExecIn, LeaseRequest
from service.tenants import Principal

_JSON = frozenset({b"application/json", b"application/json; charset=utf-8"})
# The request headers the lane reads, and those the full stack refuses twice
# (``limits.SINGLE_HEADERS``: Idempotency-Key among them); a request repeating one goes to
# the full stack (which answers it: 400 naming it, or the first copy of X-Request-ID).
_READ = frozenset(
    {b"content-length", b"content-type", b"authorization", b"x-request-id", *SINGLE_HEADERS}
)
_IDEMPOTENCY_KEY = idempotency.HEADER.encode()

# (ctx, principal, the path's match, the validated body) -> the answer's JSON bytes
Handler = Callable[[ServiceContext, Principal, "re.Match[str]", BaseModel], Awaitable[bytes]]


@dataclass(frozen=True)
class LaneRoute:
    """One route the lane serves: ``method`` and ``path`` (a full match, no query string),
    ``template`` (the full stack's route path, for metrics and the access log), the body's
    ``model``, the ``handler`` (the route's own code) and the success ``status``."""

    method: str
    path: re.Pattern[str]
    template: str
    model: type[BaseModel]
    handler: Handler
    status: int


async def _exec(
    ctx: ServiceContext, principal: Principal, match: re.Match[str], body: BaseModel
) -> bytes:
    return await exec_json(ctx, principal, match.group(1), cast(ExecIn, body))


async def _lease(
    ctx: ServiceContext, principal: Principal, _match: re.Match[str], body: BaseModel
) -> bytes:
    return await lease_json(ctx, principal, cast(LeaseRequest, body))


EXEC = LaneRoute(
    "POST",
    re.compile(r"/v1/sandboxes/([^/]+)/exec"),
    "/v1/sandboxes/{sandbox_id}/exec",
    ExecIn,
    _exec,
    200,
)
LEASE = LaneRoute("POST", re.compile(r"/v1/sandboxes"), "/v1/sandboxes", LeaseRequest, _lease, 201)
ROUTES = (EXEC, LEASE)
ROUTE = EXEC.template  # the exec route's template (metrics labels)


@dataclass
class LaneStats:
    """Requests the lane served and passed on (this process, every app)."""

    served: int = 0
    passed: int = 0


stats = LaneStats()


def _match(method: str, path: str) -> tuple[LaneRoute, re.Match[str]] | None:
    for route in ROUTES:
        if route.method == method and (m := route.path.fullmatch(path)) is not None:
            return route, m
    return None


class FastLane:
    """Serves the ``ROUTES`` requests it fully understands, passes every other request on
    (module docstring). Pure ASGI; the app's ``ServiceContext`` comes from ``scope["app"]``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["query_string"]
            or scope.get("root_path")
            or tracing.enabled()
            or (found := _match(scope["method"], scope["path"])) is None
        ):
            await self.app(scope, receive, send)
            return
        ctx: ServiceContext = scope["app"].state.ctx
        settings = ctx.settings
        if not settings.fast_lane:
            await self.app(scope, receive, send)
            return
        route, match = found
        keyed = idempotency.keyed(route.method, scope["path"])
        headers: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:
            if name in _READ:
                if name in headers:
                    return await self._pass(scope, receive, send)
                headers[name] = value
        if keyed and _IDEMPOTENCY_KEY in headers:  # the full stack's IdempotencyMiddleware
            return await self._pass(scope, receive, send)
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
                return await self._pass(scope, replay(bytes(chunks), receive, more=True), send)
            chunks += message.get("body", b"")
            if not message.get("more_body", False):
                break
        body = bytes(chunks)
        again = replay(body, receive)
        try:
            body.decode("utf-8")
            if not body or json_depth_exceeds(body, settings.max_json_depth):
                return await self._pass(scope, again, send)
            model = route.model.model_validate(json.loads(body))
        except (ValueError, ValidationError):  # not UTF-8, not JSON, not the route's model
            return await self._pass(scope, again, send)
        scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        try:
            principal = ctx.keys.authenticate(token.strip() if scheme.lower() == "bearer" else None)
        except Exception:  # noqa: BLE001 - a read only: the full stack answers (and audits a refusal)
            return await self._pass(scope, again, send)
        stats.served += 1
        await self._serve(scope, again, send, ctx, principal, route, match, model, headers)

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
        route: LaneRoute,
        match: re.Match[str],
        body: BaseModel,
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
                payload = await route.handler(ctx, principal, match, body)
            except CrucibleError as e:
                response = crucible_error_response(e, request=Request(scope))
                status = response.status_code
                response.raw_headers = [
                    *(h for h in response.raw_headers if h[0] != b"x-request-id"),
                    (b"x-request-id", rid.encode()),
                ]
                await response(scope, receive, send)
                return
            status = route.status
            await send(
                {
                    "type": "http.response.start",
                    "status": status,
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
            method, template = route.method, route.template
            HTTP_REQUESTS.labels(method, template, str(status)).inc()
            HTTP_LATENCY.labels(method, template).observe(elapsed_s)
            if logs.access_log.isEnabledFor(logging.INFO):
                duration_ms = round(elapsed_s * 1e3, 3)
                logs.access_log.info(
                    "%s %s %d %.1f ms",
                    method,
                    scope["path"].encode("unicode_escape").decode("ascii"),
                    status,
                    duration_ms,
                    extra={
                        "method": method,
                        "route": template,
                        "status": status,
                        "duration_ms": duration_ms,
                    },
                )
            logs.request_id.reset(token)
