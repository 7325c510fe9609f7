"""Request limits, applied before a route sees the request (pure ASGI middleware).

- Body size: a declared ``Content-Length`` over the limit is a 413 before any byte is read;
  a chunked body is counted as it arrives and refused as soon as it passes the limit, so
  memory stays bounded by it. The limit is ``max_body_bytes``; file uploads
  (``PUT /v1/sandboxes/{id}/files``) have their own, ``max_upload_bytes``, enforced by
  their route as they stream.
- A JSON body (``application/json``, ``*/*+json``, and a body without ``Content-Type``,
  which FastAPI 0.165 no longer reads as JSON (a 422) but is checked all the same) must be
  UTF-8 (RFC 8259 section 8.1) and nested at most ``max_json_depth`` levels; otherwise a
  400 naming the problem, before the parser (whose recursion a deep document would
  exhaust) runs.
- A header that says one thing (``Content-Length``, ``Content-Type``, ``Authorization``,
  ``Idempotency-Key``) given twice is a 400 naming it: the layers read different copies
  (this middleware the last ``Content-Type``, FastAPI the first; the idempotency
  middleware filed a request under the last key's tenant while the route acted as the
  first's), so a duplicate walked around the UTF-8 and depth checks and crossed tenants'
  idempotency records (trial 27). Checked on every route, uploads too.
- A ``Content-Length`` is read by ``declared_length``, which never raises (``int()`` of
  4,301 leading zeros did: a 500 on every route, before authentication).

A refused request never reaches a route, so nothing stored changes.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.problems import send_problem

# Routes that stream their body themselves under their own limit (method, path pattern).
_OWN_LIMIT = ((b"PUT", re.compile(r"^/v1/sandboxes/[^/]+/files$")),)
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def json_depth_exceeds(body: bytes, max_depth: int) -> bool:
    """True when ``body``'s brackets outside strings nest deeper than ``max_depth``.

    Strings are removed first (a bracket inside one does not nest), then the remaining
    brackets are counted; a malformed body is left to the parser.
    """
    brackets = _JSON_STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    depth = 0
    for b in brackets:
        depth += 1 if b in (0x5B, 0x7B) else -1
        if depth > max_depth:
            return True
    return False


# Headers with one value each: a request that repeats one is refused (module docstring).
SINGLE_HEADERS = (b"content-length", b"content-type", b"authorization", b"idempotency-key")
_MAX_LENGTH_DIGITS = 18  # 10**18 bytes is past every limit; int() of it is cheap


def declared_length(value: bytes | None) -> int | None:
    """A ``Content-Length`` value in bytes (RFC 9110 section 8.6: ASCII digits, leading
    zeros allowed; blanks around it ignored), or None when absent or not a number. A value
    of more than 18 significant digits is 10**18, past any limit. Never raises (Python's
    ``int()`` refuses strings of over 4,300 digits)."""
    if value is None:
        return None
    digits = value.strip(b" \t")
    if not digits or not digits.isdigit():  # bytes.isdigit: ASCII digits only
        return None
    digits = digits.lstrip(b"0") or b"0"
    return int(digits) if len(digits) <= _MAX_LENGTH_DIGITS else 10**_MAX_LENGTH_DIGITS


def repeated_header(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The first of ``SINGLE_HEADERS`` that ``headers`` (ASGI: lower-case names) carries
    more than once, or None."""
    seen: set[bytes] = set()
    for name, _ in headers:
        if name in SINGLE_HEADERS:
            if name in seen:
                return name
            seen.add(name)
    return None


def _is_json(content_type: str | None) -> bool:
    if content_type is None:
        return True
    media = content_type.split(";")[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


class RequestLimitsMiddleware:
    """Refuse oversized bodies (413), non-UTF-8 or too deeply nested JSON (400).

    ``limits`` returns ``(max_body_bytes, max_json_depth)``; it is called per request, so
    the settings of the app's context apply (tests build apps with their own).
    """

    def __init__(self, app: ASGIApp, *, limits: Callable[[Scope], tuple[int, int]]) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        repeated = repeated_header(scope["headers"])
        if repeated is not None:
            name = repeated.decode("latin-1").title()
            await _refuse(
                scope,
                send,
                400,
                "Repeated header",
                f"{name} is given more than once; give it once",
                field=name,
            )
            return
        if any(scope["method"].encode() == m and p.match(scope["path"]) for m, p in _OWN_LIMIT):
            await self.app(scope, receive, send)
            return
        max_bytes, max_depth = self.limits(scope)
        headers = dict(scope["headers"])
        declared = declared_length(headers.get(b"content-length"))
        if declared is not None and declared > max_bytes:
            await _refuse(
                scope,
                send,
                413,
                "Payload too large",
                f"the body of {declared} bytes exceeds the limit of {max_bytes} bytes",
            )
            return
        body = bytearray()
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > max_bytes:
                await _refuse(
                    scope,
                    send,
                    413,
                    "Payload too large",
                    f"the body exceeds the limit of {max_bytes} bytes",
                )
                return
        content_type = headers.get(b"content-type")
        if body and _is_json(content_type.decode("latin-1") if content_type else None):
            try:
                body.decode("utf-8")
            except UnicodeDecodeError as e:
                await _refuse(
                    scope,
                    send,
                    400,
                    "Body is not UTF-8",
                    f"a JSON body must be UTF-8: invalid byte at offset {e.start}",
                )
                return
            if json_depth_exceeds(bytes(body), max_depth):
                await _refuse(
                    scope,
                    send,
                    400,
                    "JSON nested too deep",
                    f"the JSON body nests deeper than {max_depth} levels",
                )
                return
        await self.app(scope, replay(bytes(body), receive), send)


def replay(body: bytes, receive: Receive, *, more: bool = False) -> Receive:
    """A ``receive`` that hands the buffered ``body`` over once (``more``: the rest, if any,
    follows from the client's), then defers to the client's."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": more}
        return await receive()

    return replayed


async def _refuse(
    scope: Scope, send: Send, status: int, title: str, detail: str, *, field: str = "body"
) -> None:
    await send_problem(scope, send, status, title, detail, field=field, close=True)
