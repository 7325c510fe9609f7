"""``Idempotency-Key``: a retried request gets the first request's answer, not a second effect.

Workers retry through control-plane restarts; a request whose answer was lost (the server
died after committing, or the connection dropped) must not lease a second sandbox, claim a
second item or start a second group. A client sends ``Idempotency-Key: <1-200 visible
ASCII characters>`` on the calls listed in ``KEYED`` and the same key on every retry.

The first request inserts a ``pending`` row (per tenant and key, with a sha256 of method,
path, query and body, and this process's boot id), runs, and stores its status and body
before the answer's last byte is sent (a client that has the answer and retries at once gets
it replayed, never a 503); a replay of a ``done`` key gets them back byte for byte with
``Idempotent-Replayed: true``. A replay while the first still runs gets 503 with
``Retry-After: 1``; a ``pending`` row of an earlier boot (the server died mid-request) is
taken over and the request runs again, which the keyed operations tolerate (start reuses the
claim's live episodes, verify and complete are idempotent on their own; a re-run claim or
lease at worst holds one extra claim or sandbox, which its lease returns). The same key with
a different request is a 422. Only a success (200, 201, 204) is kept: an error answer means
nothing happened (a 4xx changes nothing stored), so its key is forgotten and a retry runs
again, as Stripe does ("results are only saved if an API endpoint started executing"). Kept,
a 4xx was replayed to a retry that had fixed what it named (a ``Content-Type``, which the
digest does not cover), and 409, 429 and 5xx may change on a retry anyway. An answer that
could not be stored still goes out, and its key is forgotten too. The tenant is the route's
own principal (the key cache, ``service.keycache``): a key revoked outside the control plane
but still cached was served by the route while this middleware, reading the row, passed the
request on unkeyed (a retry leased twice). Keys are kept ``RETAIN_S`` seconds.

Exec is not keyed: a command runs again when its request is retried (documented in
docs/architecture.md); the SDK does not retry it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import uuid
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, update
from sqlalchemy.exc import IntegrityError
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.db.engine import Database
from service.db.models import IdempotencyKey, utcnow
from service.errors import AuthError
from service.keycache import KeyCache

log = logging.getLogger("crucible.idempotency")

HEADER = "idempotency-key"
BOOT_ID = uuid.uuid4().hex  # this process; a pending row of another boot was cut off
RETAIN_S = 24 * 3600
KEPT_STATUSES = frozenset({200, 201, 204})  # a success: something happened
KEY_RE = re.compile(r"^[\x21-\x7e]{1,200}$")
KEYED = tuple(
    (method, re.compile(pattern))
    for method, pattern in (
        ("POST", r"^/v1/sandboxes$"),
        ("POST", r"^/v1/episodes$"),
        ("POST", r"^/v1/episodes/[^/]+/verify$"),
        ("POST", r"^/v1/jobs$"),
        ("POST", r"^/v1/jobs/[^/]+/claim$"),
        ("POST", r"^/v1/work-items/[^/]+/complete$"),
    )
)


def keyed(method: str, path: str) -> bool:
    """True when ``method path`` honours ``Idempotency-Key``."""
    return any(m == method and p.match(path) for m, p in KEYED)


def _problem(status: int, title: str, detail: str, **extra: Any) -> tuple[int, bytes]:
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail, **extra}
    return status, json.dumps(body).encode()


class _Outcome:
    """What ``begin`` decided: run the request, replay a stored answer, or refuse."""

    def __init__(
        self, action: str, status: int = 0, body: bytes = b"", media_type: str = ""
    ) -> None:
        self.action, self.status, self.body, self.media_type = action, status, body, media_type


def begin(db: Database, tenant_id: str, key: str, scope: str, digest: str) -> _Outcome:
    """Claim ``key`` for this request, or say how to answer a replay."""
    for _ in range(3):
        with db.session() as s:
            row = s.get(IdempotencyKey, (tenant_id, key))
            if row is None:
                try:
                    with s.begin_nested():
                        s.add(
                            IdempotencyKey(
                                tenant_id=tenant_id,
                                key=key,
                                scope=scope,
                                request_sha256=digest,
                                state="pending",
                                owner=BOOT_ID,
                            )
                        )
                except IntegrityError:
                    continue  # a racing first request: read it again
                return _Outcome("run")
            if row.request_sha256 != digest:
                status, body = _problem(
                    422,
                    "Idempotency-Key reused",
                    f"Idempotency-Key {key!r} was first used for another request ({row.scope})",
                    field="Idempotency-Key",
                )
                return _Outcome("answer", status, body, "application/problem+json")
            if row.state == "done":
                resp = row.response or {}
                return _Outcome(
                    "replay",
                    row.status_code or 200,
                    resp.get("body", "").encode(),
                    resp.get("media_type", "application/json"),
                )
            if row.owner == BOOT_ID:
                status, body = _problem(
                    503, "Request in progress", f"the request with key {key!r} is still running"
                )
                return _Outcome("busy", status, body, "application/problem+json")
            got = s.execute(
                update(IdempotencyKey)
                .where(
                    IdempotencyKey.tenant_id == tenant_id,
                    IdempotencyKey.key == key,
                    IdempotencyKey.owner == row.owner,
                    IdempotencyKey.state == "pending",
                )
                .values(owner=BOOT_ID)
                .execution_options(synchronize_session=False)
            ).rowcount
            if got:
                return _Outcome("run")
    status, body = _problem(503, "Request in progress", f"key {key!r} is contended")
    return _Outcome("busy", status, body, "application/problem+json")


def finish(
    db: Database, tenant_id: str, key: str, *, status: int, body: bytes, media_type: str
) -> None:
    """Store the answer of a request that ran (or forget the key when it may change)."""
    if status not in KEPT_STATUSES:
        forget(db, tenant_id, key)
        return
    with db.session() as s:
        s.execute(
            update(IdempotencyKey)
            .where(
                IdempotencyKey.tenant_id == tenant_id,
                IdempotencyKey.key == key,
                IdempotencyKey.owner == BOOT_ID,
            )
            .values(
                state="done",
                status_code=status,
                response={"body": body.decode("utf-8", "replace"), "media_type": media_type},
                finished_at=utcnow(),
            )
            .execution_options(synchronize_session=False)
        )


def forget(db: Database, tenant_id: str, key: str) -> None:
    """Delete this process's pending row for ``key``: a retry runs the request again."""
    with db.session() as s:
        s.execute(
            delete(IdempotencyKey).where(
                IdempotencyKey.tenant_id == tenant_id,
                IdempotencyKey.key == key,
                IdempotencyKey.owner == BOOT_ID,
            )
        )


def prune(db: Database) -> int:
    """Forget keys older than ``RETAIN_S``; returns how many."""
    with db.session() as s:
        return s.execute(
            delete(IdempotencyKey).where(
                IdempotencyKey.created_at < utcnow() - timedelta(seconds=RETAIN_S)
            )
        ).rowcount


def _tenant(keys: KeyCache, authorization: str) -> str | None:
    """The tenant the route will act for, through the same key cache as the route (one
    answer for both layers), or None when the key is refused (the route answers 401)."""
    scheme, _, token = authorization.partition(" ")
    try:
        return keys.authenticate(token.strip() if scheme.lower() == "bearer" else None).tenant_id
    except AuthError:
        return None  # the route answers 401 (and audits it)


class IdempotencyMiddleware:
    """Pure ASGI: applies ``begin``/``finish`` around the ``KEYED`` routes."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not keyed(scope["method"], scope["path"]):
            await self.app(scope, receive, send)
            return
        headers = {k.decode().lower(): v.decode("latin-1") for k, v in scope["headers"]}
        key = headers.get(HEADER)
        if key is None:
            await self.app(scope, receive, send)
            return
        if not KEY_RE.match(key):
            status, body = _problem(
                400,
                "Bad Idempotency-Key",
                "Idempotency-Key must be 1 to 200 visible ASCII characters",
                field="Idempotency-Key",
            )
            await _answer(send, status, body, "application/problem+json")
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        raw = b"".join(chunks)
        ctx = scope["app"].state.ctx
        db = ctx.db
        # on the loop, as the route's own authentication (a cached key is read from memory)
        tenant_id = _tenant(ctx.keys, headers.get("authorization", ""))
        replayed = False

        async def replay_receive() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": raw, "more_body": False}

        if tenant_id is None:
            await self.app(scope, replay_receive, send)
            return
        target = scope["path"].encode()
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        digest = hashlib.sha256(scope["method"].encode() + b" " + target + b"\n" + raw).hexdigest()
        label = f"{scope['method']} {scope['path']}"[:300]
        outcome = await run_in_threadpool(begin, db, tenant_id, key, label, digest)
        if outcome.action != "run":
            extra = [(b"idempotent-replayed", b"true")] if outcome.action == "replay" else []
            if outcome.action == "busy":
                extra.append((b"retry-after", b"1"))
            await _answer(send, outcome.status, outcome.body, outcome.media_type, extra)
            return
        captured: dict[str, Any] = {"status": 500, "media_type": "application/json", "body": []}
        stored = False

        async def store() -> None:
            nonlocal stored
            if stored:
                return
            stored = True
            try:
                await run_in_threadpool(
                    finish,
                    db,
                    tenant_id,
                    key,
                    status=captured["status"],
                    body=b"".join(captured["body"]),
                    media_type=captured["media_type"],
                )
            except Exception:  # noqa: BLE001 - the answer still goes out
                # Not stored: the key must not stay pending (every retry a 503 for a day);
                # forgotten, a retry runs again, as after a crash.
                log.exception("idempotency: the answer for key %r was not stored", key)
                with contextlib.suppress(Exception):
                    await run_in_threadpool(forget, db, tenant_id, key)

        async def capture(message: Message) -> None:
            if message["type"] == "http.response.start":
                captured["status"] = message["status"]
                for k, v in message.get("headers", []):
                    if k.lower() == b"content-type":
                        captured["media_type"] = v.decode("latin-1")
            elif message["type"] == "http.response.body":
                captured["body"].append(message.get("body", b""))
                if not message.get("more_body", False):
                    # stored before its last byte goes out: a client that has the answer
                    # and retries at once gets the replay, not a 503 "still running"
                    await store()
            await send(message)

        try:
            await self.app(scope, replay_receive, capture)
        finally:
            await store()  # the route raised, or the client went away before the end


async def _answer(
    send: Send,
    status: int,
    body: bytes,
    media_type: str,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", media_type.encode()),
                (b"content-length", str(len(body)).encode()),
                *(extra or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
