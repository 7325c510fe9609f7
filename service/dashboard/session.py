"""Dashboard sessions and CSRF tokens: HMAC-signed, expiring, bound to a live API key.

A session cookie is ``<payload>.<mac>`` where ``payload`` is base64url of the JSON
``{"k": key id, "exp": unix seconds, "n": 128-bit nonce}`` and ``mac`` is base64url of
``HMAC-SHA256(secret, "session:" + payload)``. The cookie names a key, never its secret;
every request re-reads the key, so revoking it ends its sessions at once.

CSRF tokens are synchronizer tokens derived from the session:
``HMAC-SHA256(secret, "csrf:" + nonce)``; every POST form carries one and a request whose
token does not match its session's is refused (403). The sign-in form, which has no
session yet, uses a short-lived pre-session cookie the same way (``"login:" + nonce``).
The cookies are HttpOnly and SameSite=Strict (and Secure when served over HTTPS).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass

from sqlalchemy.orm import Session

from service.db.models import ApiKey
from service.tenants import Principal

SESSION_COOKIE = "crucible_session"
LOGIN_COOKIE = "crucible_login"
LOGIN_TTL_S = 600
"""How long a sign-in form stays valid (seconds)."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class SessionData:
    """What a valid session cookie says: the key, its expiry (unix s) and its nonce."""

    key_id: str
    expires_at: float
    nonce: str


class Signer:
    """Signs and checks session cookies and CSRF tokens with one secret.

    Args:
        secret: the signing key; None makes a random one (sessions end with the process).
    """

    def __init__(self, secret: str | None) -> None:
        self._key = (secret or secrets.token_hex(32)).encode()

    def _mac(self, purpose: str, text: str) -> str:
        return _b64(hmac.new(self._key, f"{purpose}:{text}".encode(), hashlib.sha256).digest())

    def issue(self, key_id: str, *, ttl_s: int, now: float | None = None) -> str:
        """A session cookie value for ``key_id`` valid ``ttl_s`` seconds."""
        body = {"k": key_id, "exp": int((now or time.time()) + ttl_s), "n": secrets.token_hex(16)}
        payload = _b64(json.dumps(body, separators=(",", ":")).encode())
        return f"{payload}.{self._mac('session', payload)}"

    def read(self, cookie: str | None, *, now: float | None = None) -> SessionData | None:
        """The session a cookie holds; None when absent, forged, malformed or expired."""
        if not cookie or cookie.count(".") != 1 or len(cookie) > 512:
            return None
        payload, mac = cookie.split(".")
        # bytes, not str: compare_digest refuses non-ASCII str (a cookie Starlette decoded
        # as latin-1 was a 500, found by a fuzzing trial)
        expected = self._mac("session", payload).encode()
        if not hmac.compare_digest(mac.encode("utf-8", "surrogateescape"), expected):
            return None
        try:
            body = json.loads(_unb64(payload))
            data = SessionData(str(body["k"]), float(body["exp"]), str(body["n"]))
        except (ValueError, KeyError, TypeError):
            return None
        return data if data.expires_at > (now or time.time()) else None

    def csrf(self, nonce: str, *, purpose: str = "csrf") -> str:
        """The CSRF token of a session (``purpose="csrf"``) or a sign-in form (``"login"``)."""
        return self._mac(purpose, nonce)

    def csrf_ok(self, nonce: str | None, token: str | None, *, purpose: str = "csrf") -> bool:
        """True when ``token`` is the CSRF token of ``nonce`` (constant-time compare)."""
        if not nonce or not token:
            return False
        expected = self.csrf(nonce, purpose=purpose).encode()
        return hmac.compare_digest(token.encode("utf-8", "surrogateescape"), expected)


def principal_of(session: Session, data: SessionData) -> Principal | None:
    """The principal of a session's key; None when the key is gone or revoked."""
    key = session.get(ApiKey, data.key_id)
    if key is None or key.revoked_at is not None:
        return None
    return Principal(key.tenant_id, key.id, frozenset(filter(None, key.scopes.split(","))))
