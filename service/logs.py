"""Log records of the control plane: a request id per request, human or JSON lines.

``RequestIdMiddleware`` gives every HTTP request an id: the caller's ``X-Request-ID`` when it
is a plausible id (1 to 128 characters of ``[A-Za-z0-9._:-]``), else a new one (a header
with anything else is never echoed, so it cannot forge log lines or response headers). The
id is returned in the response's ``X-Request-ID``, set in a context variable that every log
record of that request carries (``request_id``), put in problem+json bodies
(``service.api.problems``), and logged once per request in an access line
(``crucible.access``: method, route, status, duration_ms). An unhandled error's 500 is
answered outside this middleware; its handler takes the id from the scope (``SCOPE_KEY``)
so that answer and its log line carry it too.

``configure(fmt)`` installs one root handler on stderr: ``human`` (the CLI default) or
``json`` (one object a line: ts, level, logger, message, request_id, trace_id and any
``extra=`` fields; ``CRUCIBLE_LOG_FORMAT=json``, the compose stack's setting).
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import secrets
import sys
import time
from datetime import UTC, datetime
from typing import Any, Literal

from starlette.types import ASGIApp, Message, Receive, Scope, Send

LogFormat = Literal["human", "json"]
HEADER = "x-request-id"
SCOPE_KEY = "crucible.request_id"  # the id in the ASGI scope, for handlers outside the context
BODY_TIMED_OUT = "crucible.body_timed_out"  # set by api.edge: the client got a 408
_VALID_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "crucible_request_id", default=None
)
access_log = logging.getLogger("crucible.access")

# LogRecord's own attributes: everything else on a record came from ``extra=``.
_RESERVED = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "request_id"}


def new_request_id() -> str:
    """A fresh request id (16 hex characters)."""
    return secrets.token_hex(8)


def accept_request_id(value: str | None) -> str:
    """``value`` when it is a plausible request id, else a new one."""
    if value is not None and _VALID_ID.fullmatch(value):
        return value
    return new_request_id()


class RequestIdFilter(logging.Filter):
    """Sets ``record.request_id`` (the current request's, or ``-``) on every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Always passes the record on."""
        record.request_id = request_id.get() or "-"
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts (UTC ISO 8601), level, logger, message, request_id,
    trace_id (when a span is recording), exc (a traceback), and ``extra=`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON (values that are not JSON become strings)."""
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None) or request_id.get(),
        }
        from service import tracing  # late: tracing imports nothing from here

        trace_id = tracing.current_trace_id()
        if trace_id:
            out["trace_id"] = trace_id
        for key, value in vars(record).items():
            if key not in _RESERVED and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


HUMAN_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"


def configure(fmt: LogFormat = "human", *, level: str = "INFO") -> None:
    """Send every log record to stderr in ``fmt``, at ``level`` and above (replaces the
    root logger's handlers; uvicorn's loggers propagate to it)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(HUMAN_FORMAT))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers.clear()
        lg.propagate = True


def unanswered_status(scope: Scope, code: int | None) -> int:
    """The status to record for a request: ``code`` when an answer started, else 408 when
    the edge timed its body out (the client got one), else 499 (nginx's "client closed
    request": the client left before any answer)."""
    if code is not None:
        return code
    return 408 if scope.get(BODY_TIMED_OUT) else 499


class RequestIdMiddleware:
    """Assigns the request id, returns it in ``X-Request-ID`` and writes the access line
    (pure ASGI: no body buffering; the access line is one in-memory log call)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = None
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                incoming = value.decode("latin-1")
                break
        rid = accept_request_id(incoming)
        scope[SCOPE_KEY] = rid
        token = request_id.set(rid)
        t0 = time.perf_counter()
        status: dict[str, int | None] = {"code": None}

        async def _send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                message["headers"] = [
                    *(h for h in message.get("headers", []) if h[0].lower() != b"x-request-id"),
                    (b"x-request-id", rid.encode()),
                ]
            await send(message)

        try:
            await self.app(scope, receive, _send)
        except BaseException:
            status["code"] = status["code"] or 500
            raise
        finally:
            status["code"] = unanswered_status(scope, status["code"])
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            duration_ms = round((time.perf_counter() - t0) * 1e3, 3)
            if access_log.isEnabledFor(logging.INFO):
                access_log.info(
                    "%s %s %d %.1f ms",
                    scope["method"],
                    scope["path"].encode("unicode_escape").decode("ascii"),  # no forged lines
                    status["code"],
                    duration_ms,
                    extra={
                        "method": scope["method"],
                        "route": route,
                        "status": status["code"],
                        "duration_ms": duration_ms,
                    },
                )
            request_id.reset(token)
