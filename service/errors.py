"""Crucible's exception hierarchy.

One root, one leaf per boundary crossed. The API maps each class to an RFC 9457
``application/problem+json`` response (see ``service.api.problems``)::

    CrucibleError                      500  (never raised bare on purpose)
    ├── InvalidRequest                 400/422  bad input the schema could not catch
    │   ├── PathOutsideRoot            400  a file path or tar member escapes the allowed root
    │   └── QuotaNeverFits             400  asks more than the whole quota (retrying cannot help)
    ├── AuthError                      401  missing or unknown API key
    │   └── Forbidden                  403  key lacks the scope (e.g. admin)
    ├── NotFound                       404  unknown id, or another tenant's object
    ├── Conflict                       409  state conflict (exec on a released sandbox, ...)
    ├── PayloadTooLarge                413  upload above ``max_upload_bytes``
    ├── QuotaExceeded                  429  tenant quota would be exceeded (``Retry-After``)
    ├── SandboxError                   502  the runtime (Docker) failed doing what was asked
    │   └── CapacityError              503  no sandbox could be started (pool empty, engine full)
    ├── TaskFormatError                422  a task folder is malformed (names file and field)
    └── VerifierError                  502  the verifier crashed or timed out (infra, not reward 0)
"""

from __future__ import annotations


class CrucibleError(Exception):
    """Root of every error Crucible raises on purpose.

    ``status`` is the HTTP status the API answers with; ``title`` a short constant
    summary; ``field`` optionally names the offending request field.
    """

    status: int = 500
    title: str = "Internal error"

    def __init__(self, detail: str, *, field: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.field = field


class InvalidRequest(CrucibleError):
    """Input passed schema validation but is still unacceptable."""

    status = 400
    title = "Invalid request"


class PathOutsideRoot(InvalidRequest):
    """A path (or tar member, or link target) resolves outside the allowed root."""

    title = "Path outside the allowed root"


class QuotaNeverFits(InvalidRequest):
    """The request needs more than the tenant's entire quota: a retry can never succeed."""

    title = "Request exceeds the quota"


class AuthError(CrucibleError):
    """The request carries no API key, or an unknown or revoked one."""

    status = 401
    title = "Unauthorized"


class Forbidden(AuthError):
    """The API key is valid but lacks the scope the route needs."""

    status = 403
    title = "Forbidden"


class NotFound(CrucibleError):
    """No such object for this tenant (another tenant's object is also 'not found')."""

    status = 404
    title = "Not found"


class Conflict(CrucibleError):
    """The object is not in a state that allows the operation."""

    status = 409
    title = "Conflict"


class PayloadTooLarge(CrucibleError):
    """The request body exceeds the configured limit."""

    status = 413
    title = "Payload too large"


class QuotaExceeded(CrucibleError):
    """The tenant's quota does not allow this lease; retry after ``retry_after_s`` seconds."""

    status = 429
    title = "Quota exceeded"

    def __init__(self, detail: str, *, field: str | None = None, retry_after_s: int = 5) -> None:
        super().__init__(detail, field=field)
        self.retry_after_s = retry_after_s


class SandboxError(CrucibleError):
    """The sandbox runtime failed (Docker error, container vanished, supervisor crash)."""

    status = 502
    title = "Sandbox runtime error"


class SandboxStopped(SandboxError):
    """The sandbox's container is not running (it stopped, was killed outside Crucible, or
    the kernel killed its init): a state of the sandbox, not a failure of the runtime, so
    409. A ``SandboxError`` still, so every path that scores a lost sandbox goes on doing
    so."""

    status = 409
    title = "Sandbox not running"


class CapacityError(SandboxError):
    """No sandbox could be provided right now."""

    status = 503
    title = "No capacity"


class TaskFormatError(CrucibleError):
    """A task folder is malformed; ``detail`` names the file and the field."""

    status = 422
    title = "Malformed task"


class VerifierError(CrucibleError):
    """The verifier itself failed (crash, timeout): an infrastructure error, never reward 0."""

    status = 502
    title = "Verifier error"
