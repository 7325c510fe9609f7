"""Task image builds: attempts, logs per attempt, failure classes, cancellation.

A build (``bld_...``) is one task image wanted by one or more requesters (a job id, or
``None`` for a request outside any job). It runs up to ``build_attempts`` attempts; each
attempt has its own log file, ``<data_dir>/logs/builds/<build id>/attempt-<n>.log``,
written line by line (readable while it runs), and the build's state is kept next to it in
``build.json`` (what the API and ``crucible builds`` read).

Failure classes (``classify``, patterns in ``data/network_errors.toml``): output that shows a
**network** failure (name resolution, connections, timeouts, proxies) or an engine transport
error is transient and retried after ``build_retry_delay_s`` (doubling); a **TLS** failure
(no CA for the index) and everything else (a Dockerfile syntax error, a missing file, a RUN
step that fails) is deterministic: one attempt, and the failure is remembered for those
exact inputs (content hash), so asking again fails at once without building.

Cancelling: ``cancel_job`` drops a job from every build's requesters; a build left with no
requester is cancelled (its connection closed, so the engine stops it). ``cancel_all`` is
called at shutdown, so nothing waits for a build.
"""

from __future__ import annotations

import contextvars
import json
import re
import threading
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Literal

from service.errors import CrucibleError, NotFound
from service.ids import new_id
from service.images import BuildCancelled, ImageBuildError

__all__ = ["BuildCancelled", "BuildTracker", "TaskBuildFailed", "classify", "on_behalf_of"]

DATA_FILE = Path(__file__).resolve().parent / "data" / "network_errors.toml"
MAX_BUILDS_KEPT = 500  # in memory; files stay on disk

Failure = Literal["network", "tls", "deterministic", "cancelled"]
State = Literal["running", "built", "failed", "cancelled"]

_requester: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "crucible_build_requester", default=None
)
_tenant: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "crucible_build_tenant", default=None
)


@contextmanager
def on_behalf_of(job_id: str | None, *, tenant_id: str | None = None) -> Iterator[None]:
    """Builds started or joined inside this block are the job's (``cancel_job`` can stop
    them) and, with ``tenant_id``, visible to that tenant (``Build.tenants``)."""
    token = _requester.set(job_id)
    tenant_token = _tenant.set(tenant_id)
    try:
        yield
    finally:
        _tenant.reset(tenant_token)
        _requester.reset(token)


def current_requester() -> str | None:
    """The job id set by ``on_behalf_of`` (None outside a job)."""
    return _requester.get()


@lru_cache(maxsize=1)
def _patterns() -> dict[str, re.Pattern[str]]:
    data = tomllib.loads(DATA_FILE.read_text(encoding="utf-8"))
    return {
        kind: re.compile("|".join(re.escape(p) for p in data[kind]["patterns"]), re.IGNORECASE)
        for kind in ("tls", "network")
    }


def classify(text: str) -> Literal["network", "tls", "deterministic"]:
    """What a failure's output says: ``tls`` (a certificate not verified: a missing CA),
    ``network`` (transient), else ``deterministic``. TLS wins over network."""
    pats = _patterns()
    if pats["tls"].search(text):
        return "tls"
    if pats["network"].search(text):
        return "network"
    return "deterministic"


class TaskBuildFailed(CrucibleError):
    """A task's image does not build, the same way every time (its Dockerfile, a missing
    file, a failing step, a certificate): not retried; ``build_id`` names its log."""

    status = 422
    title = "Task image build failed"

    def __init__(self, detail: str, *, build_id: str) -> None:
        super().__init__(detail, field="task_id")
        self.build_id = build_id


@dataclass
class Attempt:
    """One attempt: ``n`` from 1, times in ISO 8601 UTC, ``outcome`` once it ended."""

    n: int
    log: str
    started_at: str
    ended_at: str | None = None
    outcome: Literal["running", "built", "failed", "cancelled"] = "running"
    failure: Failure | None = None
    reason: str | None = None


@dataclass
class Build:
    """One wanted task image and its attempts (``state`` as the module docstring says).

    ``requesters``: job ids (None: outside a job); ``tenants``: who asked for it (the
    tenants that may read it through the API; admins read every build)."""

    id: str
    task: str
    repository: str
    digest: str
    created_at: str
    state: State = "running"
    tag: str | None = None
    requesters: list[str | None] = field(default_factory=list)
    tenants: list[str] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    error: str | None = None

    def public(self) -> dict[str, object]:
        """A JSON-able view (requesters and log paths included)."""
        return asdict(self)


def _now() -> str:
    return datetime.now(UTC).isoformat()


class BuildTracker:
    """Runs task builds with retries and remembers their attempts (thread-safe).

    ``logs_dir``: ``<data_dir>/logs/builds``. ``attempts`` and ``retry_delay_s`` as
    ``Settings.build_attempts`` / ``build_retry_delay_s``.
    """

    def __init__(self, logs_dir: Path, *, attempts: int = 3, retry_delay_s: float = 2.0) -> None:
        self.logs_dir = logs_dir
        self.max_attempts = attempts
        self.retry_delay_s = retry_delay_s
        self._lock = threading.Lock()
        self._builds: dict[str, Build] = {}
        self._cancel: dict[str, threading.Event] = {}
        self._failed: dict[str, TaskBuildFailed] = {}  # digest -> remembered failure

    # ---------------------------------------------------------------- running

    def run(
        self,
        *,
        task: str,
        repository: str,
        digest: str,
        attempt_fn: Callable[[Path, threading.Event], str],
    ) -> str:
        """Build ``task`` (inputs hashed as ``digest``) with ``attempt_fn(log_path, cancel)``,
        which returns the image tag or raises ``ImageBuildError``.

        Raises ``TaskBuildFailed`` (deterministic, remembered per digest; TLS included),
        ``BuildCancelled`` (every requester was cancelled), ``ImageBuildError`` (transient
        failures on every attempt).
        """
        with self._lock:
            known = self._failed.get(digest)
        if known is not None:
            self.join(known.build_id)  # this requester may read the log the error names
            raise known
        build = Build(
            id=new_id("bld"),
            task=task,
            repository=repository,
            digest=digest,
            created_at=_now(),
            requesters=[current_requester()],
            tenants=[t] if (t := _tenant.get()) is not None else [],
        )
        cancel = threading.Event()
        with self._lock:
            self._builds[build.id] = build
            self._cancel[build.id] = cancel
            while len(self._builds) > MAX_BUILDS_KEPT:
                oldest = next(iter(self._builds))
                self._builds.pop(oldest)
                self._cancel.pop(oldest, None)
        try:
            return self._attempts(build, cancel, attempt_fn)
        finally:
            with self._lock:
                self._cancel.pop(build.id, None)
            self._save(build)

    def _attempts(
        self,
        build: Build,
        cancel: threading.Event,
        attempt_fn: Callable[[Path, threading.Event], str],
    ) -> str:
        folder = self.logs_dir / build.id
        folder.mkdir(parents=True, exist_ok=True)
        delay = self.retry_delay_s
        for n in range(1, self.max_attempts + 1):
            attempt = Attempt(n=n, log=str(folder / f"attempt-{n}.log"), started_at=_now())
            build.attempts.append(attempt)
            self._save(build)
            try:
                tag = attempt_fn(Path(attempt.log), cancel)
            except BuildCancelled as e:
                self._end(build, attempt, "cancelled", "cancelled", e.detail)
                raise
            except ImageBuildError as e:
                kind = classify(_log_text(Path(attempt.log)) + "\n" + e.detail)
                self._end(build, attempt, "failed", kind, e.detail)
                if kind != "network":
                    failed = TaskBuildFailed(_explain(build, kind, e.detail), build_id=build.id)
                    with self._lock:
                        self._failed[build.digest] = failed
                    raise failed from e
                if n == self.max_attempts:
                    raise
                if cancel.wait(delay):
                    build.state = "cancelled"
                    raise BuildCancelled(f"building {build.task} was cancelled") from e
                delay *= 2
                continue
            attempt.outcome, attempt.ended_at = "built", _now()
            build.state, build.tag = "built", tag
            return tag
        raise AssertionError("unreachable")  # pragma: no cover

    def _end(
        self, build: Build, attempt: Attempt, outcome: str, kind: Failure, reason: str
    ) -> None:
        attempt.outcome = outcome  # type: ignore[assignment]
        attempt.failure, attempt.reason, attempt.ended_at = kind, reason[-4000:], _now()
        build.state = "cancelled" if outcome == "cancelled" else "failed"
        build.error = reason[-4000:]
        self._save(build)

    def _save(self, build: Build) -> None:
        folder = self.logs_dir / build.id
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / "build.json.tmp"
        tmp.write_text(json.dumps(build.public(), indent=1))
        tmp.replace(folder / "build.json")

    # ---------------------------------------------------------------- joining and cancelling

    def join(self, build_id: str) -> None:
        """Add the current requester to a running build another caller started."""
        with self._lock:
            build = self._builds.get(build_id)
            if build is not None and current_requester() not in build.requesters:
                build.requesters.append(current_requester())
            tenant = _tenant.get()
            if build is not None and tenant is not None and tenant not in build.tenants:
                build.tenants.append(tenant)

    def running_for(self, digest: str) -> str | None:
        """The id of the running build of ``digest``, if any."""
        with self._lock:
            for b in self._builds.values():
                if b.digest == digest and b.state == "running":
                    return b.id
        return None

    def cancel_job(self, job_id: str) -> list[str]:
        """Drop ``job_id`` from every running build; cancel those left with no requester.
        Returns the ids cancelled."""
        cancelled = []
        with self._lock:
            for b in self._builds.values():
                if b.state != "running" or job_id not in b.requesters:
                    continue
                b.requesters = [r for r in b.requesters if r != job_id]
                if not b.requesters and b.id in self._cancel:
                    self._cancel[b.id].set()
                    cancelled.append(b.id)
        return cancelled

    def cancel_all(self) -> None:
        """Cancel every running build (shutdown)."""
        with self._lock:
            for event in self._cancel.values():
                event.set()

    def forget_failures(self) -> None:
        """Forget remembered deterministic failures (after a build setting changed)."""
        with self._lock:
            self._failed.clear()

    # ---------------------------------------------------------------- reading

    def list(self) -> list[Build]:
        """Builds of this process, newest first."""
        with self._lock:
            return list(reversed(self._builds.values()))

    def get(self, build_id: str) -> Build:
        """One build; ``NotFound`` (field ``build_id``) when unknown to this process."""
        with self._lock:
            found = self._builds.get(build_id)
        if found is None:
            raise NotFound(f"unknown build {build_id!r}", field="build_id")
        return found


def _log_text(path: Path, limit: int = 1 << 20) -> str:
    """The last ``limit`` bytes of a log (missing: empty)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - limit))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _explain(build: Build, kind: str, detail: str) -> str:
    head = f"task {build.task}: its image does not build (build {build.id}, not retried)"
    if kind == "tls":
        head += (
            "; a certificate was not verified: set CRUCIBLE_BUILD_CA_BUNDLE to the CA bundle "
            "of your network (e.g. /etc/ssl/certs/ca-certificates.crt)"
        )
    lines = [ln for ln in detail.splitlines() if not ln.strip().startswith("full log:")]
    return head + "\n" + "\n".join(lines[-16:])


def read_log(
    logs_dir: Path, build_id: str, attempt: int | None, *, offset: int = 0
) -> tuple[bytes, int]:
    """Bytes of one attempt's log from ``offset`` (the last attempt when None) and the next
    offset. Reads the files on disk, so it works while the build runs and in another process.

    Raises ``NotFound`` (field ``build_id`` or ``attempt``).
    """
    if not re.fullmatch(r"bld_[A-Za-z0-9]+", build_id):
        raise NotFound(f"unknown build {build_id!r}", field="build_id")
    meta = logs_dir / build_id / "build.json"
    try:
        build = json.loads(meta.read_text())
    except (OSError, ValueError):
        raise NotFound(f"unknown build {build_id!r}", field="build_id") from None
    attempts = build.get("attempts") or []
    n = attempt if attempt is not None else len(attempts)
    if not 1 <= n <= len(attempts):
        raise NotFound(f"build {build_id} has no attempt {n}", field="attempt")
    path = logs_dir / build_id / f"attempt-{n}.log"
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            data = fh.read(4 << 20)
    except OSError:
        data = b""
    return data, offset + len(data)


def load_build(logs_dir: Path, build_id: str) -> dict[str, object]:
    """A build's ``build.json`` from disk; ``NotFound`` when there is none."""
    if not re.fullmatch(r"bld_[A-Za-z0-9]+", build_id):
        raise NotFound(f"unknown build {build_id!r}", field="build_id")
    try:
        data: dict[str, object] = json.loads((logs_dir / build_id / "build.json").read_text())
    except (OSError, ValueError):
        raise NotFound(f"unknown build {build_id!r}", field="build_id") from None
    return data
