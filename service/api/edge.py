"""The connection's edge: what is checked before any other layer (the fast lane included)
sees a request (pure ASGI, outermost).

- **The request target.** A path whose decoded form holds an ASCII control character
  (U+0000 to U+001F, U+007F) is a 400 naming ``path``. Starlette's route patterns end in
  ``$``, which also matches before a final newline, so ``/v1/sandboxes%0A`` was served as
  ``/v1/sandboxes`` (and the idempotency middleware's patterns matched it the same way); no
  route takes such a character, so none is lost.
- **NUL in the query.** A query parameter whose name or value decodes to U+0000 is a 400
  naming it: PostgreSQL's text refuses NUL, so a filter carrying one
  (``GET /v1/audit?action=%00``) was a 500 there (trial 29); no parameter takes one.
- **The body's idle deadline.** uvicorn times out an idle kept-alive connection, not a
  body that stops arriving: a request that declared a body and never sent it held its
  connection and its handler forever. While a body is incomplete, each wait for its next
  part is bounded by ``body_idle_timeout_s`` (nginx's ``client_body_timeout``: between two
  reads, not the whole body). When it passes, the inner layers see the client as gone
  (``http.disconnect``, which each already handles; what they send then goes nowhere, as
  for a client that left) and the client gets a 408 with ``Connection: close``, unless an
  answer had started; the access log and metrics record that 408 (``logs.BODY_TIMED_OUT``
  in the scope), and a client that left with no answer as 499, not 500 (trial 29: anyone
  could inflate the 5xx rate). An answer that starts before the body ended (a 401 or 413
  of an upload) closes the connection: no handler waits for the rest, so no deadline
  bounded a client trickling it. Nothing stored changes: every route reads its whole body
  before it acts, and an upload that stops is not kept.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from urllib.parse import parse_qsl

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service import logs
from service.api.problems import send_problem

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Set in the scope when the body's idle deadline passed: the inner layers (access log,
# metrics) record the 408 the client gets, not the 500 of "no answer started".
TIMED_OUT = logs.BODY_TIMED_OUT


class EdgeMiddleware:
    """Refuse a control character in the path (400), time out a stalled body (408).

    ``idle_timeout_s`` returns the body's idle deadline in seconds for the app serving a
    scope (called per request, so the settings of the app's context apply).
    """

    def __init__(self, app: ASGIApp, *, idle_timeout_s: Callable[[Scope], float]) -> None:
        self.app = app
        self.idle_timeout_s = idle_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if _CONTROL.search(scope["path"]):
            await _answer(
                send,
                400,
                "Bad request target",
                "the path holds a control character (U+0000 to U+001F, U+007F)",
                "path",
                scope,
                close=_has_body(scope["headers"]),
            )
            return
        if b"%00" in scope["query_string"]:
            name = _nul_parameter(scope["query_string"])
            await _answer(
                send,
                400,
                "Bad query parameter",
                f"query parameter {name!r} holds a NUL character (U+0000)",
                name,
                scope,
                close=_has_body(scope["headers"]),
            )
            return
        if not _has_body(scope["headers"]):
            await self.app(scope, receive, send)
            return
        limit = self.idle_timeout_s(scope)
        state = {"complete": False, "timed_out": False, "started": False}

        async def bounded() -> Message:
            if state["timed_out"]:
                return {"type": "http.disconnect"}  # gone, for the inner layers, for good
            if state["complete"]:
                return await receive()  # after the body: a disconnect, whenever it comes
            try:
                async with asyncio.timeout(limit):
                    message = await receive()
            except TimeoutError:
                state["timed_out"] = True
                scope[TIMED_OUT] = True
                return {"type": "http.disconnect"}
            if message["type"] != "http.request" or not message.get("more_body", False):
                state["complete"] = True
            return message

        async def watched(message: Message) -> None:
            if state["timed_out"] and not state["started"]:
                return  # the client is gone for the inner layers: what they send goes nowhere
            if message["type"] == "http.response.start":
                state["started"] = True
                if not state["complete"]:
                    # answered before the body ended (a 401 or 422 of an upload, a 413):
                    # no handler waits for the rest, so no deadline bounds it; close rather
                    # than keep a connection a client can trickle bytes into for ever
                    message = {**message, "headers": _with_close(message.get("headers", []))}
            await send(message)

        try:
            await self.app(scope, bounded, watched)
        except ClientDisconnect:  # a route streaming its body (an upload) saw it go
            if not state["timed_out"]:
                raise
        if state["timed_out"] and not state["started"]:
            await _answer(
                send,
                408,
                "Request body timed out",
                f"no part of the request body arrived for {limit:g} s",
                "body",
                scope,
                close=True,
            )


def _nul_parameter(query: bytes) -> str:
    """The name of the first query parameter whose name or value decodes to a NUL (its
    NULs removed), else ``query``."""
    for k, v in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
        if "\x00" in k + v:
            return k.replace("\x00", "") or "query"
    return "query"


def _with_close(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [*(h for h in headers if h[0].lower() != b"connection"), (b"connection", b"close")]


def _has_body(headers: list[tuple[bytes, bytes]]) -> bool:
    """True when the request declares a body: a ``Transfer-Encoding`` or a
    ``Content-Length`` other than 0."""
    for name, value in headers:
        if name == b"transfer-encoding":
            return True
        if name == b"content-length" and value.strip(b" \t").lstrip(b"0") != b"":
            return True
    return False


async def _answer(
    send: Send,
    status: int,
    title: str,
    detail: str,
    field: str,
    scope: Scope,
    *,
    close: bool = False,
) -> None:
    rid = scope.get(logs.SCOPE_KEY)  # set when the inner layers ran
    if rid is None:
        incoming = next((v for k, v in scope["headers"] if k == b"x-request-id"), None)
        rid = logs.accept_request_id(incoming.decode("latin-1") if incoming else None)
    await send_problem(scope, send, status, title, detail, field=field, close=close, request_id=rid)
