"""RFC 9457 problem+json responses for every error the API returns."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.errors import CrucibleError, QuotaExceeded

log = logging.getLogger("crucible.api")
PROBLEM = "application/problem+json"


def problem(
    status: int,
    title: str,
    detail: str,
    *,
    request: Request,
    field: str | None = None,
    errors: list[dict[str, Any]] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """Build one problem+json response."""
    body: dict[str, Any] = {
        "type": "about:blank",
        "title": title,
        "status": status,
        "detail": detail,
        "instance": request.url.path,
    }
    if field is not None:
        body["field"] = field
    if errors is not None:
        body["errors"] = errors
    return JSONResponse(body, status_code=status, media_type=PROBLEM, headers=headers)


def _field_of(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    return ".".join(parts) or "body"


def install(app: FastAPI) -> None:
    """Register the exception handlers on ``app``."""

    @app.exception_handler(CrucibleError)
    async def _crucible(request: Request, exc: CrucibleError) -> JSONResponse:
        headers = None
        if isinstance(exc, QuotaExceeded):
            headers = {"Retry-After": str(exc.retry_after_s)}
        if exc.status >= 500:
            log.warning("%s %s: %s", request.method, request.url.path, exc.detail)
        if exc.status == 401:
            headers = {"WWW-Authenticate": "Bearer"}
        return problem(
            exc.status, exc.title, exc.detail, request=request, field=exc.field, headers=headers
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errs = [
            {
                "field": _field_of(e.get("loc", ())),
                "message": e.get("msg", ""),
                "type": e.get("type", ""),
            }
            for e in exc.errors()
        ]
        if any(e["type"] == "json_invalid" for e in errs):
            return problem(
                400,
                "Malformed JSON",
                "the request body is not valid JSON",
                request=request,
                field="body",
                errors=errs,
            )
        first = errs[0] if errs else {"field": "body", "message": "invalid"}
        return problem(
            422,
            "Validation failed",
            f"{first['field']}: {first['message']}",
            request=request,
            field=first["field"],
            errors=errs,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return problem(
            exc.status_code,
            str(exc.detail),
            str(exc.detail),
            request=request,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return problem(
            500, "Internal error", f"{type(exc).__name__}: unexpected server error", request=request
        )
