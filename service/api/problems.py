"""RFC 9457 problem+json responses for every error the API returns, and their OpenAPI
declarations (``error_responses(...)`` on each route, the ``Problem`` schema in the components)."""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from service import logs
from service.errors import CrucibleError, QuotaExceeded
from service.schemas import Problem

log = logging.getLogger("crucible.api")
PROBLEM = "application/problem+json"
PROBLEM_REF = "#/components/schemas/Problem"

# What each error status means on this API (the descriptions in the OpenAPI document).
ERROR_DESCRIPTIONS: dict[int, str] = {
    400: "Invalid request: a value the schema allows but the service cannot accept, a body "
    "that is not JSON or not UTF-8, JSON nested too deep, a header given twice, or a "
    "control character in the path (``field`` names it)",
    401: "Missing, unknown or revoked API key",
    403: "The API key lacks the admin scope",
    404: "No such object for this tenant (another tenant's object is also not found)",
    408: "No part of the request body arrived for ``body_idle_timeout_s``; the connection "
    "is closed",
    409: "The object's state does not allow the operation",
    413: "The request body exceeds the configured limit",
    422: "The request does not match the schema (``errors`` lists every field)",
    429: "Over the tenant's quota or request rate limit; retry after ``Retry-After`` seconds",
    502: "The sandbox runtime (the container engine) or the verifier failed",
    503: "No sandbox could be started now",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` entries for the given error statuses, each a problem+json
    body (``Problem``). What every route of a kind can return (401/403 from its
    dependencies, 400/413 for a body, 422 for parameters) ``install_openapi`` adds.

    Raises:
        KeyError: a status with no entry in ``ERROR_DESCRIPTIONS``.
    """
    return {
        status: {
            "description": ERROR_DESCRIPTIONS[status],
            "content": {PROBLEM: {"schema": {"$ref": PROBLEM_REF}}},
        }
        for status in statuses
    }


def problem_body(
    status: int, title: str, detail: str, *, instance: str, field: str | None = None
) -> dict[str, Any]:
    """The JSON object of one problem (RFC 9457 members plus ``field``)."""
    body: dict[str, Any] = {
        "type": "about:blank",
        "title": title,
        "status": status,
        "detail": detail,
        "instance": instance,
    }
    if field is not None:
        body["field"] = field
    rid = logs.request_id.get()
    if rid is not None:
        body["request_id"] = rid
    return body


async def send_problem(
    scope: Any,
    send: Any,
    status: int,
    title: str,
    detail: str,
    *,
    field: str | None,
    close: bool = False,
    request_id: str | None = None,
) -> None:
    """Answer a problem+json straight on an ASGI ``send`` (for middlewares that answer
    before any route runs). ``close``: add ``Connection: close``; ``request_id``: carry it
    in the body and in ``X-Request-ID`` (a layer outside ``RequestIdMiddleware``)."""
    body = problem_body(status, title, detail, instance=scope["path"], field=field)
    headers = [(b"content-type", PROBLEM.encode())]
    if request_id is not None:
        body["request_id"] = request_id
        headers.append((b"x-request-id", request_id.encode()))
    payload = json.dumps(body).encode()
    headers.append((b"content-length", str(len(payload)).encode()))
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


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
    body = problem_body(status, title, detail, instance=request.url.path, field=field)
    if errors is not None:
        body["errors"] = errors
    return JSONResponse(body, status_code=status, media_type=PROBLEM, headers=headers)


def crucible_error_response(exc: CrucibleError, *, request: Request) -> JSONResponse:
    """The problem+json answer to ``exc`` (the app's ``CrucibleError`` handler, and the exec
    lane's): its status, title, detail and field; ``Retry-After`` on a 429 (quota or rate
    limit), ``WWW-Authenticate`` on a 401; a 5xx is logged as a warning."""
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


def _field_of(loc: tuple[Any, ...] | list[Any]) -> str:
    """The dotted field of a validation error's location, without its leading source
    (``("query", "path")`` is the query parameter ``path``, not nothing)."""
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header", "cookie"):
        parts = parts[1:]
    return ".".join(parts) or "body"


def install(app: FastAPI) -> None:
    """Register the exception handlers on ``app``."""

    @app.exception_handler(CrucibleError)
    async def _crucible(request: Request, exc: CrucibleError) -> JSONResponse:
        return crucible_error_response(exc, request=request)

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
        # Starlette answers these outside every middleware: the request id comes from the scope.
        rid = request.scope.get(logs.SCOPE_KEY)
        token = logs.request_id.set(rid)
        try:
            log.exception("unhandled error on %s %s", request.method, request.url.path)
            return problem(
                500,
                "Internal error",
                f"{type(exc).__name__}: unexpected server error",
                request=request,
                headers={"X-Request-ID": rid} if rid else None,
            )
        finally:
            logs.request_id.reset(token)


def _calls(dependant: Any) -> set[Any]:
    """Every dependency callable of a route, transitively."""
    found = set()
    for sub in dependant.dependencies:
        found.add(sub.call)
        found |= _calls(sub)
    return found


def install_openapi(app: FastAPI, routers: list[Any]) -> None:
    """Make ``/openapi.json`` declare every error response as problem+json (``routers``:
    the ``APIRouter``s included in ``app``, whose routes are inspected).

    Per route: 400 (a header given twice, a control character in the path: the request
    limits and the edge refuse them on every route), 401 and 429 (the tenant's rate limit)
    when it authenticates (``get_principal`` among its dependencies), 403 when it needs the
    admin scope, 422 (problem+json, replacing FastAPI's own shape) when it has parameters
    or a body, 408 and 413 when it takes a body; plus what the route declares with
    ``error_responses``. The ``Problem`` schema is added to
    the components.
    """
    from fastapi.openapi.utils import get_openapi
    from fastapi.routing import APIRoute

    from service.api.deps import get_admin, get_principal

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        doc = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        components = doc.setdefault("components", {}).setdefault("schemas", {})
        components["Problem"] = Problem.model_json_schema()
        for name in ("HTTPValidationError", "ValidationError"):
            components.pop(name, None)
        for route in (r for router in routers for r in router.routes):
            if not isinstance(route, APIRoute) or not route.include_in_schema:
                continue
            calls = _calls(route.dependant)
            implied = [400]
            if get_principal in calls:
                implied += [401, 429]  # authenticated: the tenant's rate limit applies
            if get_admin in calls:
                implied.append(403)
            if route.body_field is not None:
                implied += [408, 413]
            dep = route.dependant
            if route.body_field is not None or dep.query_params or dep.path_params:
                implied.append(422)
            for method in route.methods:
                op = doc["paths"][route.path_format].get(method.lower())
                if op is None:
                    continue
                responses = op.setdefault("responses", {})
                for status, entry in error_responses(*implied).items():
                    responses[str(status)] = entry
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
