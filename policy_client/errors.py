"""Errors the client raises, mapped from the API's problem+json responses::

ClientError                    any failure talking to Crucible
├── TransportError             the server could not be reached (after retries)
└── APIError                   the server answered with a problem (``status``, ``field``)
    ├── BadRequest             400, 413, 422
    ├── Unauthorized           401, 403
    ├── NotFoundError          404
    ├── ConflictError          409
    ├── QuotaError             429 (``retry_after_s``)
    └── ServerError            5xx
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


_BY_STATUS: dict[int, type[APIError]] = {
    400: BadRequest,
    413: BadRequest,
    422: BadRequest,
    401: Unauthorized,
    403: Unauthorized,
    404: NotFoundError,
    409: ConflictError,
    429: QuotaError,
}


def raise_for_problem(response: httpx.Response) -> None:
    """Raise the typed error for a 4xx/5xx response; return for anything else."""
    if response.status_code < 400:
        return
    try:
        body = response.json()
    except ValueError:
        body = {"title": response.reason_phrase, "detail": response.text[:500]}
    cls = _BY_STATUS.get(
        response.status_code, ServerError if response.status_code >= 500 else APIError
    )
    err = cls(
        response.status_code,
        str(body.get("title", "")),
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
