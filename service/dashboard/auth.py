"""Who is looking at a dashboard page: the session cookie's principal, and CSRF checks.

``Viewer`` is the dependency every page takes: a request without a valid session is sent to
the sign-in page (``SignInRequired``); every POST handler calls ``check_csrf`` first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated
from urllib.parse import parse_qs

from fastapi import Depends, Request

from service.api.deps import Ctx
from service.dashboard.session import SESSION_COOKIE, Signer, principal_of
from service.errors import Forbidden, InvalidRequest
from service.tenants import Principal

MAX_FORM_BYTES = 16 << 10
"""Largest dashboard form body; every form is a few short fields."""


class SignInRequired(Exception):
    """No valid session: the handler in ``service.dashboard`` redirects to the sign-in page."""

    def __init__(self, next_path: str) -> None:
        super().__init__(next_path)
        self.next_path = next_path


class PageNotFound(Exception):
    """A dashboard page for something that does not exist or is not the viewer's (404)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


@dataclass(frozen=True)
class Viewer:
    """The signed-in principal and the CSRF token its forms carry."""

    principal: Principal
    csrf: str
    nonce: str

    @property
    def is_admin(self) -> bool:
        """True for an admin key: every tenant's data, private verifier details."""
        return self.principal.is_admin

    @property
    def scope(self) -> str | None:
        """The tenant whose rows this viewer may read; None for an admin (all)."""
        return None if self.principal.is_admin else self.principal.tenant_id


def signer(request: Request) -> Signer:
    """The app's session signer (made once from the settings' session secret)."""
    state = request.app.state
    if getattr(state, "dashboard_signer", None) is None:
        state.dashboard_signer = Signer(state.ctx.settings.dashboard_session_secret)
    return state.dashboard_signer


def get_viewer(request: Request, ctx: Ctx) -> Viewer:
    """The viewer of this request.

    Raises:
        SignInRequired: no cookie, or a forged, expired or revoked-key session.
    """
    sign = signer(request)
    data = sign.read(request.cookies.get(SESSION_COOKIE))
    principal = None
    if data is not None:
        with ctx.db.read() as s:
            principal = principal_of(s, data)
    if data is None or principal is None:
        raise SignInRequired(request.url.path)
    return Viewer(principal, sign.csrf(data.nonce), data.nonce)


CurrentViewer = Annotated[Viewer, Depends(get_viewer)]


async def read_form(request: Request) -> dict[str, str]:
    """The urlencoded form of a POST (first value of each field).

    Raises:
        InvalidRequest: the body is larger than ``MAX_FORM_BYTES`` or not UTF-8.
    """
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        raise InvalidRequest(f"form larger than {MAX_FORM_BYTES} bytes", field="body")
    try:
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=32)
    except (UnicodeDecodeError, ValueError) as e:
        raise InvalidRequest("form is not UTF-8 urlencoded text", field="body") from e
    return {k: v[0] for k, v in fields.items()}


def check_csrf(request: Request, viewer: Viewer, form: dict[str, str]) -> None:
    """Refuse a POST whose ``csrf`` field is not this session's token.

    Raises:
        Forbidden: missing or wrong token (nothing is changed).
    """
    if not signer(request).csrf_ok(viewer.nonce, form.get("csrf")):
        raise Forbidden("missing or invalid CSRF token: reload the page", field="csrf")
