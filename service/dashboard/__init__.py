"""The web dashboard for sandbox audit, served at ``/dashboard`` (server-rendered HTML).

``install(app)`` mounts it: the pages (``routes``), the static assets, and the handlers
that turn ``SignInRequired`` into a redirect to the sign-in page and ``PageNotFound`` into
an HTML 404.
"""

from __future__ import annotations

from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles

from service.dashboard.auth import PageNotFound, SignInRequired
from service.dashboard.render import SECURITY_HEADERS, STATIC_DIR, page
from service.dashboard.routes import router

__all__ = ["install", "router"]


def install(app: FastAPI) -> None:
    """Mount the dashboard on ``app`` (routes, ``/dashboard/static``, error pages)."""
    app.include_router(router)
    app.mount("/dashboard/static", StaticFiles(directory=STATIC_DIR), name="dashboard-static")

    @app.exception_handler(SignInRequired)
    async def _sign_in(request: Request, exc: SignInRequired) -> Response:
        target = "/dashboard/login"
        if exc.next_path.startswith("/dashboard") and exc.next_path != "/dashboard/login":
            target += "?next=" + quote(exc.next_path, safe="/")
        return Response(status_code=303, headers={"Location": target, **SECURITY_HEADERS})

    @app.exception_handler(PageNotFound)
    async def _not_found(request: Request, exc: PageNotFound) -> Response:
        return page(request, "404.html", status=404, viewer=None, nav="", detail=exc.detail)
