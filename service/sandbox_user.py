"""The identity a request's ``user`` field asks for, checked against the sandbox's template.

One rule for exec, sessions and kept processes: omitted (or the template's own user) runs as
the template's user; any other user needs a template that allows root
(``service.templates.request_user``), else 403 naming ``user``. Nothing runs and nothing is
stored before the check.
"""

from __future__ import annotations

import dataclasses

from service.context import ServiceContext
from service.errors import InvalidRequest
from service.runtime.base import ExecRequest
from service.sandboxes import get_owned
from service.templates import request_user
from service.tenants import Principal


def with_user(
    ctx: ServiceContext, principal: Principal, sandbox_id: str, req: ExecRequest, user: str | None
) -> ExecRequest:
    """``req`` to run as ``user`` (None: the template's user, and ``req`` is returned as is,
    with no database read).

    Raises ``NotFound`` (not the caller's sandbox), ``Forbidden`` (403, field ``user``: the
    template does not allow another user), ``InvalidRequest`` (field ``user``: NUL or empty).
    """
    if user is None:
        return req
    if not user or "\0" in user:
        raise InvalidRequest("user must be a non-empty name, uid or uid:gid", field="user")
    row = get_owned(ctx, principal, sandbox_id)
    identity = request_user(ctx.templates.get(row.template), user)
    return req if identity is None else dataclasses.replace(req, user=identity)
