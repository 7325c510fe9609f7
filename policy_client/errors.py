"""Errors the client raises, mapped from the API's problem+json responses::

ClientError                    any failure talking to Crucible
├── TransportError             the server could not be reached (after retries)
└── APIError                   the server answered with a problem (``status``, ``field``)
    ├── BadRequest             400, 413, 422
    │   ├── PathOutsideRoot    400 a path or tar member escapes the allowed root
    │   ├── QuotaNeverFits     400 asks more than the whole quota (retrying cannot help)
    │   ├── PayloadTooLarge    413 body above the server's limit
    │   └── TaskFormatError    422 a task folder is malformed
    ├── Unauthorized           401, 403
    │   └── Forbidden          403 the key lacks the scope
    ├── NotFoundError          404
    ├── ConflictError          409
    ├── QuotaError             429 (``retry_after_s``)
    └── ServerError            5xx
        ├── SandboxError       502 the sandbox runtime failed
        │   └── CapacityError  503 no sandbox could be started
        └── VerifierError      502 the verifier crashed or timed out

Each server problem (``service.errors``) maps to the class of the same name, by its status and
``title`` (``tests/unit/test_client_errors.py`` fails if one goes unmapped).
"""

from __future__ import annotations

from typing import Any

import httpx


class ClientError(Exception):
    """Root of every error ``policy_client`` raises."""


class TransportError(ClientError):
    """Network failure after the allowed retries."""


class APIError(ClientError):
    """A problem+json answer; ``status``, ``title``, ``detail``, ``field`` from the body."""

    def __init__(
        self,
        status: int,
        title: str,
        detail: str,
        field: str | None = None,
        body: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{status} {title}: {detail}" + (f" (field {field})" if field else ""))
        self.status, self.title, self.detail, self.field = status, title, detail, field
        self.body = body or {}


class BadRequest(APIError):
    """The request was malformed or invalid."""


class Unauthorized(APIError):
    """Missing, unknown or insufficient API key."""


class NotFoundError(APIError):
    """No such object (or another tenant's)."""


class ConflictError(APIError):
    """The object is in the wrong state (e.g. exec on a released sandbox)."""


class QuotaError(APIError):
    """Over quota; retry after ``retry_after_s`` seconds."""

    retry_after_s: float = 1.0


class ServerError(APIError):
    """The server failed (5xx)."""


class PathOutsideRoot(BadRequest):
    """A file path, tar member or link target resolves outside the allowed root."""


class QuotaNeverFits(BadRequest):
    """The request needs more than the tenant's whole quota: a retry cannot succeed."""


class PayloadTooLarge(BadRequest):
    """The request body is above the server's limit."""


class TaskFormatError(BadRequest):
    """A task folder is malformed (``detail`` names the file and the field)."""


class Forbidden(Unauthorized):
    """The API key is valid but lacks the scope the route needs."""


class SandboxError(ServerError):
    """The sandbox runtime failed (Docker error, container vanished)."""


class CapacityError(SandboxError):
    """No sandbox could be provided right now (retried by the client like any 503)."""


class SandboxStopped(ConflictError):
    """The sandbox's container is not running (it stopped, e.g. everything in it was
    killed): its end state is what it was when it stopped, and can still be verified."""


class VerifierError(ServerError):
    """The verifier itself failed: an infrastructure error, never a reward of 0."""


_BY_TITLE: dict[tuple[int, str], type[APIError]] = {
    (400, "Path outside the allowed root"): PathOutsideRoot,
    (400, "Request exceeds the quota"): QuotaNeverFits,
    (413, "Payload too large"): PayloadTooLarge,
    (422, "Malformed task"): TaskFormatError,
    (403, "Forbidden"): Forbidden,
    (502, "Sandbox runtime error"): SandboxError,
    (503, "No capacity"): CapacityError,
    (502, "Verifier error"): VerifierError,
    (409, "Sandbox not running"): SandboxStopped,
}

_BY_STATUS: dict[int, type[APIError]] = {
    400: BadRequest,
    413: BadRequest,
    422: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFoundError,
    409: ConflictError,
    429: QuotaError,
}


def error_from_problem(body: dict[str, Any]) -> APIError:
    """The typed error for a problem object (``status``, ``title``, ``detail``, ``field``),
    e.g. the ``{"type": "error", "problem": ...}`` line that ends a streaming exec whose
    command could not run after the response had begun."""
    status = int(body.get("status", 500) or 500)
    title = str(body.get("title", ""))
    cls = _BY_TITLE.get((status, title)) or _BY_STATUS.get(
        status, ServerError if status >= 500 else APIError
    )
    return cls(status, title, str(body.get("detail", "")), body.get("field"), body)


def raise_for_problem(response: httpx.Response) -> None:
    """Raise the typed error for a 4xx/5xx response; return for anything else."""
    if response.status_code < 400:
        return
    try:
        body = response.json()
    except ValueError:
        body = {"title": response.reason_phrase, "detail": response.text[:500]}
    title = str(body.get("title", "")) if isinstance(body, dict) else ""
    if not isinstance(body, dict):
        body = {"detail": str(body)[:500]}
    cls = _BY_TITLE.get((response.status_code, title)) or _BY_STATUS.get(
        response.status_code, ServerError if response.status_code >= 500 else APIError
    )
    err = cls(
        response.status_code,
        title,
        str(body.get("detail", "")),
        body.get("field"),
        body,
    )
    if isinstance(err, QuotaError):
        try:
            err.retry_after_s = float(response.headers.get("retry-after", "1"))
        except ValueError:
            err.retry_after_s = 1.0
    raise err
