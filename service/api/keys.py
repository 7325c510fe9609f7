"""API keys over HTTP (admin): revoke. A revoke is refused by every replica at once (the
key cache drops it on the ``key.revoke`` event, see ``service.keycache``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response

from service import tenants
from service.api.deps import AdminPrincipal, Ctx
from service.errors import NotFound

router = APIRouter(tags=["keys"])

KeyId = Annotated[str, Path(max_length=32, pattern=r"^[0-9a-f]+$", description="The key id.")]


@router.delete("/v1/keys/{key_id}", status_code=204, summary="Revoke an API key")
def revoke(key_id: KeyId, ctx: Ctx, admin: AdminPrincipal) -> Response:
    """Revoke ``key_id``: its next request on any replica is a 401.

    Raises:
        NotFound: no live key has that id.
    """
    with ctx.db.session() as s:
        if not tenants.revoke_key(s, key_id):
            raise NotFound(f"no live API key {key_id}")
    ctx.keys.drop(key_id)
    return Response(status_code=204)
