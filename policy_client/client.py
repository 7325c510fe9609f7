"""The Crucible SDK: ``Client`` (sync) and ``AsyncClient`` over httpx, typed with the API's own
pydantic schemas.

    with Client(url, api_key) as client, client.sandbox("terminal") as sb:
        print(sb.exec("ls -la").stdout)

    async with AsyncClient(url, api_key) as client, client.sandbox("terminal") as sb:
        print((await sb.exec("ls -la")).stdout)

Every API call is an explicit, typed method on both clients (sandboxes, tasks, episodes,
jobs and work items, records); each builds its request with ``policy_client.calls`` so the
two clients cannot drift (``tests/unit/test_client.py`` checks they expose the same methods
with the same signatures). Calls safe to repeat are retried on transport errors and 502/503
with exponential backoff (``backoff_s`` doubling, at most ``MAX_BACKOFF_S``) until
``retry_deadline_s`` (default 90 s: a control-plane restart takes 5 to 20 s) has passed or
``retries`` retries were made (``None``: no count limit). Safe to repeat: reads, releases,
heartbeats, file uploads, cancellation, and the keyed calls (lease, episode start,
verification, job creation, claim, complete), which carry one ``Idempotency-Key`` across
their retries so a replay gets the first answer. Exec is never retried: a command would run
twice. Problems become typed exceptions (``policy_client.errors``).

Streaming exec: ``exec_stream`` yields ``ExecChunk``s (``stream`` ``stdout``/``stderr``,
``data``) as the command writes, then its ``ExecOut``; ``exec(..., on_stdout=f,
on_stderr=g)`` calls back per chunk and returns the ``ExecOut``. ``Sandbox`` (and
``AsyncSandbox``) bind a sandbox: ``exec``/``exec_stream``, files, ``snapshot``, ``fork``
(a context manager over the forks, released on exit), ``heartbeat``, ``release``, and an
opt-in ``keepalive(every_s)`` that heartbeats in the background until release.

    with client.sandbox("terminal", keepalive_s=20) as sb:
        sb.exec("make", on_stdout=print)
        with sb.fork(4) as forks:
            results = [f.exec("pytest -q") for f in forks]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from policy_client import calls
from policy_client.calls import Call
from policy_client.errors import TransportError, error_from_problem, raise_for_problem
from policy_client.schemas import (
    EpisodeGroupOut,
    EpisodeOut,
    ExecOut,
    FileOut,
    ForkOut,
    JobOut,
    OutputOut,
    ProcessList,
    ProcessOut,
    RewardPage,
    RewardRecord,
    RunOut,
    SandboxList,
    SandboxOut,
    ScreenOut,
    SessionList,
    SessionOut,
    SnapshotOut,
    TaskList,
    TaskOut,
    TemplateOut,
    VerifyIn,
    WorkItemOut,
)

log = logging.getLogger(__name__)
RETRY_STATUSES = (502, 503)
OnOutput = Callable[[str], Any]


@dataclass(frozen=True)
class ExecChunk:
    """Output a streaming exec received: ``data`` (UTF-8 text, invalid bytes replaced) on
    ``stream``; ``data_b64`` the raw bytes in base64 when asked with ``output_b64``."""

    stream: Literal["stdout", "stderr"]
    data: str
    data_b64: str | None = None


def _stream_item(line: bytes | str) -> ExecChunk | ExecOut:
    doc = json.loads(line)
    if doc.get("type") == "result":
        return ExecOut.model_validate(doc["result"])
    if doc.get("type") == "error":  # the command failed after the stream began
        raise error_from_problem(doc.get("problem") or {})
    return ExecChunk(doc["type"], doc.get("data", ""), doc.get("data_b64"))


def _deliver(item: ExecChunk, on_stdout: OnOutput | None, on_stderr: OnOutput | None) -> None:
    callback = on_stdout if item.stream == "stdout" else on_stderr
    if callback is not None:
        callback(item.data)


MAX_BACKOFF_S = 5.0
DEFAULT_RETRY_DEADLINE_S = 90.0


def _defaults(base_url: str | None, api_key: str | None) -> tuple[str, str]:
    url = base_url or os.environ.get("CRUCIBLE_URL", "http://127.0.0.1:8000")
    key = api_key or os.environ.get("CRUCIBLE_API_KEY", "")
    return url.rstrip("/"), key


class _Base:
    """What both clients share: defaults, retry policy, answer decoding."""

    def __init__(
        self,
        base_url: str | None,
        api_key: str | None,
        *,
        retries: int | None,
        backoff_s: float,
        retry_deadline_s: float,
    ) -> None:
        self.base_url, self.api_key = _defaults(base_url, api_key)
        self.retries, self.backoff_s = retries, backoff_s
        self.retry_deadline_s = retry_deadline_s
        self.headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _may_retry(self, call: Call, attempt: int, started: float) -> bool:
        """Whether attempt ``attempt`` (0-based, just failed) may be followed by another."""
        if not (call.idempotent or call.keyed):
            return False
        if self.retries is not None and attempt >= self.retries:
            return False
        return time.monotonic() - started + self._pause(attempt) <= self.retry_deadline_s

    def _unreachable(self, call: Call, e: Exception, attempt: int) -> TransportError:
        """The error for a call that could not reach the server, naming where it looked."""
        return TransportError(
            f"{call.method} {self.base_url}{call.path}: {e} (after {attempt + 1} attempts; "
            "is `crucible serve` running there? the URL comes from CRUCIBLE_URL)"
        )

    def _note_retry(self, call: Call, attempt: int, e: Exception) -> None:
        """Say once per call that the server is being waited for (a restart takes seconds;
        a server that is not there would otherwise be a silent wait of the whole deadline)."""
        if attempt == 0:
            log.warning(
                "cannot reach %s (%s); retrying %s %s for up to %.0f s",
                self.base_url,
                e,
                call.method,
                call.path,
                self.retry_deadline_s,
            )

    def _pause(self, attempt: int) -> float:
        """Seconds to wait before retry ``attempt + 1``."""
        return min(self.backoff_s * 2**attempt, MAX_BACKOFF_S)

    @staticmethod
    def _request_kwargs(call: Call, key: str | None) -> dict[str, Any]:
        headers = dict(call.headers)
        if key is not None:
            headers["Idempotency-Key"] = key
        kw: dict[str, Any] = {"params": call.params or None, "headers": headers or None}
        if call.json is not None:
            kw["json"] = call.json
        if call.content is not None:
            kw["content"] = call.content
        return kw

    def _finish(self, call: Call, response: httpx.Response) -> Any:
        raise_for_problem(response)
        return calls.parse(call, response.status_code, response.content)


class Client(_Base):
    """Synchronous client. ``timeout_s`` bounds each HTTP call (exec adds its own timeout);
    ``retry_deadline_s`` bounds the retries of one call, ``retries`` their count."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout_s: float = 120.0,
        retries: int | None = None,
        backoff_s: float = 0.2,
        retry_deadline_s: float = DEFAULT_RETRY_DEADLINE_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(
            base_url,
            api_key,
            retries=retries,
            backoff_s=backoff_s,
            retry_deadline_s=retry_deadline_s,
        )
        self._http = httpx.Client(
            base_url=self.base_url, headers=self.headers, timeout=timeout_s, transport=transport
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def run(self, call: Call, *, timeout_s: float | None = None) -> Any:
        """Execute one call (retrying the ones safe to repeat) and decode its answer."""
        key = uuid.uuid4().hex if call.keyed else None
        started, attempt = time.monotonic(), 0
        while True:
            kw = self._request_kwargs(call, key)
            if timeout_s is not None:
                kw["timeout"] = timeout_s
            try:
                response = self._http.request(call.method, call.path, **kw)
            except httpx.TransportError as e:
                if not self._may_retry(call, attempt, started):
                    raise self._unreachable(call, e, attempt) from e
                self._note_retry(call, attempt, e)
            else:
                if response.status_code not in RETRY_STATUSES or not self._may_retry(
                    call, attempt, started
                ):
                    return self._finish(call, response)
            time.sleep(self._pause(attempt))
            attempt += 1

    @contextmanager
    def sandbox(
        self, template: str, *, keepalive_s: float | None = None, **lease_options: Any
    ) -> Iterator[Sandbox]:
        """Lease a sandbox for the ``with`` block; it is released on exit. ``keepalive_s``:
        heartbeat it every that many seconds while the block runs (off by default)."""
        sb = Sandbox(self, self.lease(template, **lease_options))
        if keepalive_s:
            sb.keepalive(keepalive_s)
        try:
            yield sb
        finally:
            sb.release()

    # -- sandboxes --------------------------------------------------------------------------

    def lease(
        self,
        template: str,
        *,
        ttl_s: int | None = None,
        metadata: dict | None = None,
        cpus: float | None = None,
        memory_mb: int | None = None,
    ) -> SandboxOut:
        """Lease a sandbox of ``template`` for ``ttl_s`` seconds, optionally with its own
        ``cpus`` / ``memory_mb`` (``QuotaError`` when over quota)."""
        return self.run(
            calls.lease(template, ttl_s=ttl_s, metadata=metadata, cpus=cpus, memory_mb=memory_mb)
        )

    def list_sandboxes(self, *, include_ended: bool = False) -> SandboxList:
        """The caller's sandboxes (live ones unless ``include_ended``)."""
        return self.run(calls.list_sandboxes(include_ended=include_ended))

    def get_sandbox(self, sandbox_id: str) -> SandboxOut:
        """One sandbox."""
        return self.run(calls.get_sandbox(sandbox_id))

    def heartbeat(self, sandbox_id: str, *, ttl_s: int | None = None) -> SandboxOut:
        """Extend a sandbox's TTL (to ``ttl_s`` seconds from now, or its lease's TTL)."""
        return self.run(calls.heartbeat(sandbox_id, ttl_s))

    def release(self, sandbox_id: str) -> SandboxOut:
        """Release (destroy) a sandbox; releasing twice is fine."""
        return self.run(calls.release(sandbox_id))

    def exec(
        self,
        sandbox_id: str,
        cmd: str | list[str],
        *,
        timeout_s: float = 60.0,
        on_stdout: OnOutput | None = None,
        on_stderr: OnOutput | None = None,
        **options: Any,
    ) -> ExecOut:
        """Run a command (options: cwd, env, stdin, max_output_bytes, output_b64). With
        ``on_stdout``/``on_stderr`` it streams, calling them with each chunk of text."""
        if on_stdout is None and on_stderr is None:
            return self.run(
                calls.exec_(sandbox_id, cmd, timeout_s=timeout_s, **options),
                timeout_s=timeout_s + 30,
            )
        for item in self.exec_stream(sandbox_id, cmd, timeout_s=timeout_s, **options):
            if isinstance(item, ExecOut):
                return item
            _deliver(item, on_stdout, on_stderr)
        raise TransportError("the exec stream ended without a result")

    def exec_stream(
        self, sandbox_id: str, cmd: str | list[str], *, timeout_s: float = 60.0, **options: Any
    ) -> Iterator[ExecChunk | ExecOut]:
        """Run a command, yielding its output as it comes (``ExecChunk``), then its
        ``ExecOut``. Never retried (the command would run twice).

        Raises:
            TransportError: the connection broke. APIError (typed): the server refused.
        """
        call = calls.exec_(sandbox_id, cmd, timeout_s=timeout_s, **options)
        try:
            with self._http.stream(
                "POST",
                call.path,
                json=call.json,
                params={"stream": "true"},
                timeout=timeout_s + 30,
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    raise_for_problem(response)
                for line in response.iter_lines():
                    if line.strip():
                        yield _stream_item(line)
        except httpx.TransportError as e:
            raise TransportError(f"POST {call.path}?stream=true: {e}") from e

    # -- sessions and kept processes

    def create_session(self, sandbox_id: str, **options: Any) -> SessionOut:
        """Start a shell session (options: shell, pty, rows, cols, env, cwd, max_output_bytes,
        user); its first prompt is on the screen when this returns."""
        return self.run(calls.create_session(sandbox_id, **options))

    def list_sessions(self, sandbox_id: str) -> SessionList:
        """The sandbox's sessions."""
        return self.run(calls.list_sessions(sandbox_id))

    def session_run(
        self, sandbox_id: str, session_id: str, command: str, *, timeout_s: float = 60.0
    ) -> RunOut:
        """Run one command line in a bash session; answered when the shell prompts again (its
        output and exit code) or after ``timeout_s`` seconds. Never retried."""
        return self.run(
            calls.session_run(sandbox_id, session_id, command, timeout_s=timeout_s),
            timeout_s=timeout_s + 30,
        )

    def send_keys(
        self,
        sandbox_id: str,
        session_id: str,
        *,
        text: str | None = None,
        keys: list[str] | None = None,
        data_b64: str | None = None,
    ) -> None:
        """Send ``text``, then named ``keys`` (``Enter``, ``C-c``, ``Up``...), then raw
        ``data_b64`` to the session's terminal. Never retried (keys would arrive twice)."""
        self.run(calls.send_keys(sandbox_id, session_id, text=text, keys=keys, data_b64=data_b64))

    def screen(self, sandbox_id: str, session_id: str, *, wait_s: float = 0.0) -> ScreenOut:
        """The session's screen and scrollback as a terminal emulator renders them; ``wait_s``
        seconds at most for new output first."""
        return self.run(calls.screen(sandbox_id, session_id, wait_s=wait_s), timeout_s=wait_s + 30)

    def resize_session(self, sandbox_id: str, session_id: str, *, rows: int, cols: int) -> None:
        """Resize the session's terminal."""
        self.run(calls.resize_session(sandbox_id, session_id, rows=rows, cols=cols))

    def close_session(self, sandbox_id: str, session_id: str) -> None:
        """End the session (its shell and everything it started)."""
        self.run(calls.close_session(sandbox_id, session_id))

    def start_process(self, sandbox_id: str, cmd: str | list[str], **options: Any) -> ProcessOut:
        """Start ``cmd`` detached (options: cwd, env, max_output_bytes, user); the handle
        outlives this call. Never retried."""
        return self.run(calls.start_process(sandbox_id, cmd, **options))

    def list_processes(self, sandbox_id: str) -> ProcessList:
        """The sandbox's background processes, oldest first."""
        return self.run(calls.list_processes(sandbox_id))

    def get_process(self, sandbox_id: str, handle: int) -> ProcessOut:
        """One background process's state."""
        return self.run(calls.get_process(sandbox_id, handle))

    def process_output(
        self,
        sandbox_id: str,
        handle: int,
        *,
        stream: str = "stdout",
        offset: int = 0,
        wait_s: float = 0.0,
    ) -> OutputOut:
        """A stream's bytes from ``offset`` (kept while nobody read); ``next`` is where to go on;
        ``wait_s`` seconds at most for bytes past ``offset``."""
        return self.run(
            calls.process_output(sandbox_id, handle, stream=stream, offset=offset, wait_s=wait_s),
            timeout_s=wait_s + 30,
        )

    def write_stdin(
        self,
        sandbox_id: str,
        handle: int,
        *,
        data: str | None = None,
        data_b64: str | None = None,
        close: bool = False,
    ) -> ProcessOut:
        """Write to a running process's stdin (then close it with ``close``). Never retried."""
        return self.run(
            calls.write_stdin(sandbox_id, handle, data=data, data_b64=data_b64, close=close)
        )

    def signal_process(
        self, sandbox_id: str, handle: int, *, signal: int = 15, grace_ms: int = 500
    ) -> ProcessOut:
        """Signal the process and everything it started (SIGTERM escalates to SIGKILL after
        ``grace_ms``)."""
        return self.run(calls.signal_process(sandbox_id, handle, signal=signal, grace_ms=grace_ms))

    def release_process(self, sandbox_id: str, handle: int) -> None:
        """Kill the process tree and forget the handle."""
        self.run(calls.release_process(sandbox_id, handle))

    def put_file(self, sandbox_id: str, path: str, data: bytes, *, tar: bool = False) -> FileOut:
        """Upload bytes to ``path`` (or extract a tar into directory ``path``)."""
        return self.run(calls.put_file(sandbox_id, path, data, tar=tar))

    def get_file(self, sandbox_id: str, path: str) -> bytes:
        """Download ``path`` (a file's bytes, or a tar of a directory)."""
        return self.run(calls.get_file(sandbox_id, path))

    def snapshot(self, sandbox_id: str) -> SnapshotOut:
        """Snapshot a sandbox's filesystem."""
        return self.run(calls.snapshot(sandbox_id))

    def get_snapshot(self, snapshot_id: str) -> SnapshotOut:
        """One of the caller's snapshots (its bytes and expiry)."""
        return self.run(calls.get_snapshot(snapshot_id))

    def delete_snapshot(self, snapshot_id: str) -> None:
        """Delete a snapshot (forks keep running); its snapshot quota is given back."""
        self.run(calls.delete_snapshot(snapshot_id))

    def fork(self, snapshot_id: str, n: int, *, ttl_s: int | None = None) -> ForkOut:
        """Start ``n`` sandboxes from a snapshot."""
        return self.run(calls.fork(snapshot_id, n, ttl_s=ttl_s))

    def templates(self) -> list[TemplateOut]:
        """The sandbox templates."""
        return self.run(calls.templates())

    # -- tasks and episodes -----------------------------------------------------------------

    def tasks(self, *, suite: str | None = None) -> TaskList:
        """The tasks (of one suite, or all)."""
        return self.run(calls.tasks(suite))

    def get_task(self, suite: str, task_id: str) -> TaskOut:
        """One task as workers see it (no tests, no solution)."""
        return self.run(calls.get_task(suite, task_id))

    def start_episodes(
        self,
        task_id: str,
        *,
        suite: str | None = None,
        group_size: int = 1,
        job_id: str | None = None,
        work_item_id: str | None = None,
        group_id: str | None = None,
        ttl_s: int | None = None,
    ) -> EpisodeGroupOut:
        """Start ``group_size`` episodes of a task, forked from one prepared state."""
        return self.run(
            calls.start_episodes(
                task_id,
                suite=suite,
                group_size=group_size,
                job_id=job_id,
                work_item_id=work_item_id,
                group_id=group_id,
                ttl_s=ttl_s,
            )
        )

    def get_episode(self, episode_id: str) -> EpisodeOut:
        """One episode."""
        return self.run(calls.get_episode(episode_id))

    def verify(
        self,
        episode_id: str,
        trajectory: VerifyIn | dict[str, Any],
        *,
        timeout_s: float | None = None,
    ) -> RewardRecord:
        """Verify an episode with its trajectory into a reward record (a repeat returns the
        stored record). ``timeout_s``: this call's timeout (default the client's); a
        verification runs the task's tests to their own limit, so give it more."""
        return self.run(calls.verify(episode_id, trajectory), timeout_s=timeout_s)

    # -- jobs and work items ----------------------------------------------------------------

    def create_job(
        self,
        *,
        suite: str,
        policy: dict[str, str],
        task_ids: list[str] | None = None,
        group_size: int = 1,
        priority: int = 0,
        max_attempts: int = 3,
    ) -> JobOut:
        """Create a rollout job: ``task_ids`` (default: the whole suite) x ``group_size``."""
        return self.run(
            calls.create_job(
                suite=suite,
                policy=policy,
                task_ids=task_ids,
                group_size=group_size,
                priority=priority,
                max_attempts=max_attempts,
            )
        )

    def get_job(self, job_id: str) -> JobOut:
        """A job and its progress."""
        return self.run(calls.get_job(job_id))

    def cancel_job(self, job_id: str) -> JobOut:
        """Cancel a job's queued items."""
        return self.run(calls.cancel_job(job_id))

    def claim(
        self,
        job_id: str,
        *,
        worker: str,
        lease_s: float = 60,
        policy_version: int | None = None,
    ) -> WorkItemOut | None:
        """Claim the job's next work item for ``lease_s`` seconds; None when none is free.

        ``policy_version``: the version of the weights that will sample the item (a job
        with ``max_staleness`` refuses or flags claims too far behind its newest).

        Raises:
            ConflictError: the job is cancelled or finished, or refuses a stale version.
        """
        return self.run(
            calls.claim(job_id, worker=worker, lease_s=lease_s, policy_version=policy_version)
        )

    def heartbeat_item(self, item_id: str, *, worker: str, lease_s: float = 60) -> WorkItemOut:
        """Extend a claim by ``lease_s`` seconds."""
        return self.run(calls.heartbeat_item(item_id, worker=worker, lease_s=lease_s))

    def complete(
        self,
        item_id: str,
        *,
        worker: str,
        ok: bool,
        error: str | None = None,
        cause: str = "policy",
    ) -> WorkItemOut:
        """Complete a claimed item (``ok=False`` lets the server retry it; ``cause``
        policy, verifier or infrastructure: only the first two use an attempt)."""
        return self.run(calls.complete(item_id, worker=worker, ok=ok, error=error, cause=cause))

    # -- records ----------------------------------------------------------------------------

    def list_records(
        self,
        *,
        job_id: str | None = None,
        suite: str | None = None,
        domain: str | None = None,
        task_id: str | None = None,
        status: str | None = None,
        after: str | None = None,
        limit: int = 100,
    ) -> RewardPage:
        """One page of reward records, oldest first (``next_after`` pages on)."""
        return self.run(
            calls.list_records(
                job_id=job_id,
                suite=suite,
                domain=domain,
                task_id=task_id,
                status=status,
                after=after,
                limit=limit,
            )
        )

    def export_records(
        self,
        *,
        fmt: str = "jsonl",
        normalize: str = "none",
        job_id: str | None = None,
        suite: str | None = None,
        domain: str | None = None,
        task_id: str | None = None,
    ) -> bytes:
        """Every matching record as JSONL or Parquet bytes, with advantages per
        ``normalize`` (none, grpo, mean, domain_z)."""
        return self.run(
            calls.export_records(
                fmt=fmt,
                normalize=normalize,
                job_id=job_id,
                suite=suite,
                domain=domain,
                task_id=task_id,
            )
        )


class Sandbox:
    """A leased sandbox bound to a sync client (``info``: its ``SandboxOut``). A context
    manager: ``with`` releases it on exit."""

    def __init__(self, client: Client, info: SandboxOut) -> None:
        self.client, self.info, self.id = client, info, info.id
        self._stop: threading.Event | None = None

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def exec(self, cmd: str | list[str], **options: Any) -> ExecOut:
        """Run a command in this sandbox (``on_stdout``/``on_stderr`` stream it)."""
        return self.client.exec(self.id, cmd, **options)

    def exec_stream(self, cmd: str | list[str], **options: Any) -> Iterator[ExecChunk | ExecOut]:
        """Run a command, yielding ``ExecChunk``s as it writes, then its ``ExecOut``."""
        return self.client.exec_stream(self.id, cmd, **options)

    def put(self, path: str, data: bytes, *, tar: bool = False) -> FileOut:
        """Upload bytes to ``path`` (or extract a tar into directory ``path``)."""
        return self.client.put_file(self.id, path, data, tar=tar)

    def get(self, path: str) -> bytes:
        """Download ``path`` (a file's bytes, or a tar of a directory)."""
        return self.client.get_file(self.id, path)

    def snapshot(self) -> SnapshotOut:
        """Snapshot this sandbox's filesystem (``client.delete_snapshot`` frees it)."""
        return self.client.snapshot(self.id)

    @contextmanager
    def fork(self, n: int, *, ttl_s: int | None = None) -> Iterator[list[Sandbox]]:
        """Snapshot this sandbox and start ``n`` sandboxes from it for the ``with`` block;
        on exit the forks are released and the snapshot deleted."""
        snap = self.snapshot()
        try:
            forks = [
                Sandbox(self.client, sb)
                for sb in self.client.fork(snap.id, n, ttl_s=ttl_s).sandboxes
            ]
            try:
                yield forks
            finally:
                for f in forks:
                    f.release()
        finally:
            self.client.delete_snapshot(snap.id)

    def heartbeat(self, *, ttl_s: int | None = None) -> SandboxOut:
        """Extend the TTL (to ``ttl_s`` seconds from now, or the lease's TTL)."""
        self.info = self.client.heartbeat(self.id, ttl_s=ttl_s)
        return self.info

    def keepalive(self, every_s: float, *, ttl_s: int | None = None) -> None:
        """Heartbeat every ``every_s`` seconds in a daemon thread until ``release`` (a failed
        beat is retried at the next tick; a sandbox gone ends the loop)."""
        if self._stop is not None:
            return
        stop = self._stop = threading.Event()

        def beat() -> None:
            from policy_client.errors import ConflictError, NotFoundError

            while not stop.wait(every_s):
                try:
                    self.client.heartbeat(self.id, ttl_s=ttl_s)
                except (ConflictError, NotFoundError):
                    return
                except Exception:  # noqa: BLE001, S112 - the next tick retries
                    continue

        threading.Thread(target=beat, name=f"keepalive-{self.id}", daemon=True).start()

    def release(self) -> SandboxOut:
        """Stop any keepalive and release (destroy) the sandbox; twice is fine."""
        if self._stop is not None:
            self._stop.set()
        return self.client.release(self.id)


class AsyncClient(_Base):
    """Asynchronous client (for rollout workers running many episodes at once)."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout_s: float = 120.0,
        retries: int | None = None,
        backoff_s: float = 0.2,
        retry_deadline_s: float = DEFAULT_RETRY_DEADLINE_S,
        max_connections: int = 64,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(
            base_url,
            api_key,
            retries=retries,
            backoff_s=backoff_s,
            retry_deadline_s=retry_deadline_s,
        )
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=self.headers,
            timeout=timeout_s,
            transport=transport,
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def run(self, call: Call, *, timeout_s: float | None = None) -> Any:
        """Execute one call (retrying the ones safe to repeat) and decode its answer."""
        key = uuid.uuid4().hex if call.keyed else None
        started, attempt = time.monotonic(), 0
        while True:
            kw = self._request_kwargs(call, key)
            if timeout_s is not None:
                kw["timeout"] = timeout_s
            try:
                response = await self._http.request(call.method, call.path, **kw)
            except httpx.TransportError as e:
                if not self._may_retry(call, attempt, started):
                    raise self._unreachable(call, e, attempt) from e
                self._note_retry(call, attempt, e)
            else:
                if response.status_code not in RETRY_STATUSES or not self._may_retry(
                    call, attempt, started
                ):
                    return self._finish(call, response)
            await asyncio.sleep(self._pause(attempt))
            attempt += 1

    @asynccontextmanager
    async def sandbox(
        self, template: str, *, keepalive_s: float | None = None, **lease_options: Any
    ) -> AsyncIterator[AsyncSandbox]:
        """Lease a sandbox for the ``async with`` block; released on exit. ``keepalive_s``:
        heartbeat it every that many seconds while the block runs (off by default)."""
        sb = AsyncSandbox(self, await self.lease(template, **lease_options))
        if keepalive_s:
            sb.keepalive(keepalive_s)
        try:
            yield sb
        finally:
            await sb.release()

    # -- sandboxes --------------------------------------------------------------------------

    async def lease(
        self,
        template: str,
        *,
        ttl_s: int | None = None,
        metadata: dict | None = None,
        cpus: float | None = None,
        memory_mb: int | None = None,
    ) -> SandboxOut:
        """Lease a sandbox of ``template`` for ``ttl_s`` seconds, optionally with its own
        ``cpus`` / ``memory_mb`` (``QuotaError`` when over quota)."""
        return await self.run(
            calls.lease(template, ttl_s=ttl_s, metadata=metadata, cpus=cpus, memory_mb=memory_mb)
        )

    async def list_sandboxes(self, *, include_ended: bool = False) -> SandboxList:
        """The caller's sandboxes (live ones unless ``include_ended``)."""
        return await self.run(calls.list_sandboxes(include_ended=include_ended))

    async def get_sandbox(self, sandbox_id: str) -> SandboxOut:
        """One sandbox."""
        return await self.run(calls.get_sandbox(sandbox_id))

    async def heartbeat(self, sandbox_id: str, *, ttl_s: int | None = None) -> SandboxOut:
        """Extend a sandbox's TTL (to ``ttl_s`` seconds from now, or its lease's TTL)."""
        return await self.run(calls.heartbeat(sandbox_id, ttl_s))

    async def release(self, sandbox_id: str) -> SandboxOut:
        """Release (destroy) a sandbox; releasing twice is fine."""
        return await self.run(calls.release(sandbox_id))

    async def exec(
        self,
        sandbox_id: str,
        cmd: str | list[str],
        *,
        timeout_s: float = 60.0,
        on_stdout: OnOutput | None = None,
        on_stderr: OnOutput | None = None,
        **options: Any,
    ) -> ExecOut:
        """Run a command (options: cwd, env, stdin, max_output_bytes, output_b64). With
        ``on_stdout``/``on_stderr`` it streams, calling them with each chunk of text (a
        callback returning an awaitable is awaited)."""
        if on_stdout is None and on_stderr is None:
            return await self.run(
                calls.exec_(sandbox_id, cmd, timeout_s=timeout_s, **options),
                timeout_s=timeout_s + 30,
            )
        async for item in self.exec_stream(sandbox_id, cmd, timeout_s=timeout_s, **options):
            if isinstance(item, ExecOut):
                return item
            callback = on_stdout if item.stream == "stdout" else on_stderr
            if callback is not None and asyncio.iscoroutine(got := callback(item.data)):
                await got
        raise TransportError("the exec stream ended without a result")

    async def exec_stream(
        self, sandbox_id: str, cmd: str | list[str], *, timeout_s: float = 60.0, **options: Any
    ) -> AsyncIterator[ExecChunk | ExecOut]:
        """Run a command, yielding its output as it comes (``ExecChunk``), then its
        ``ExecOut``. Never retried (the command would run twice).

        Raises:
            TransportError: the connection broke. APIError (typed): the server refused.
        """
        call = calls.exec_(sandbox_id, cmd, timeout_s=timeout_s, **options)
        try:
            async with self._http.stream(
                "POST",
                call.path,
                json=call.json,
                params={"stream": "true"},
                timeout=timeout_s + 30,
            ) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise_for_problem(response)
                async for line in response.aiter_lines():
                    if line.strip():
                        yield _stream_item(line)
        except httpx.TransportError as e:
            raise TransportError(f"POST {call.path}?stream=true: {e}") from e

    # -- sessions and kept processes

    async def create_session(self, sandbox_id: str, **options: Any) -> SessionOut:
        """Start a shell session (options: shell, pty, rows, cols, env, cwd, max_output_bytes,
        user); its first prompt is on the screen when this returns."""
        return await self.run(calls.create_session(sandbox_id, **options))

    async def list_sessions(self, sandbox_id: str) -> SessionList:
        """The sandbox's sessions."""
        return await self.run(calls.list_sessions(sandbox_id))

    async def session_run(
        self, sandbox_id: str, session_id: str, command: str, *, timeout_s: float = 60.0
    ) -> RunOut:
        """Run one command line in a bash session; answered when the shell prompts again (its
        output and exit code) or after ``timeout_s`` seconds. Never retried."""
        return await self.run(
            calls.session_run(sandbox_id, session_id, command, timeout_s=timeout_s),
            timeout_s=timeout_s + 30,
        )

    async def send_keys(
        self,
        sandbox_id: str,
        session_id: str,
        *,
        text: str | None = None,
        keys: list[str] | None = None,
        data_b64: str | None = None,
    ) -> None:
        """Send ``text``, then named ``keys`` (``Enter``, ``C-c``, ``Up``...), then raw
        ``data_b64`` to the session's terminal. Never retried (keys would arrive twice)."""
        await self.run(
            calls.send_keys(sandbox_id, session_id, text=text, keys=keys, data_b64=data_b64)
        )

    async def screen(self, sandbox_id: str, session_id: str, *, wait_s: float = 0.0) -> ScreenOut:
        """The session's screen and scrollback as a terminal emulator renders them; ``wait_s``
        seconds at most for new output first."""
        return await self.run(
            calls.screen(sandbox_id, session_id, wait_s=wait_s), timeout_s=wait_s + 30
        )

    async def resize_session(
        self, sandbox_id: str, session_id: str, *, rows: int, cols: int
    ) -> None:
        """Resize the session's terminal."""
        await self.run(calls.resize_session(sandbox_id, session_id, rows=rows, cols=cols))

    async def close_session(self, sandbox_id: str, session_id: str) -> None:
        """End the session (its shell and everything it started)."""
        await self.run(calls.close_session(sandbox_id, session_id))

    async def start_process(
        self, sandbox_id: str, cmd: str | list[str], **options: Any
    ) -> ProcessOut:
        """Start ``cmd`` detached (options: cwd, env, max_output_bytes, user); the handle
        outlives this call. Never retried."""
        return await self.run(calls.start_process(sandbox_id, cmd, **options))

    async def list_processes(self, sandbox_id: str) -> ProcessList:
        """The sandbox's background processes, oldest first."""
        return await self.run(calls.list_processes(sandbox_id))

    async def get_process(self, sandbox_id: str, handle: int) -> ProcessOut:
        """One background process's state."""
        return await self.run(calls.get_process(sandbox_id, handle))

    async def process_output(
        self,
        sandbox_id: str,
        handle: int,
        *,
        stream: str = "stdout",
        offset: int = 0,
        wait_s: float = 0.0,
    ) -> OutputOut:
        """A stream's bytes from ``offset`` (kept while nobody read); ``next`` is where to go on;
        ``wait_s`` seconds at most for bytes past ``offset``."""
        return await self.run(
            calls.process_output(sandbox_id, handle, stream=stream, offset=offset, wait_s=wait_s),
            timeout_s=wait_s + 30,
        )

    async def write_stdin(
        self,
        sandbox_id: str,
        handle: int,
        *,
        data: str | None = None,
        data_b64: str | None = None,
        close: bool = False,
    ) -> ProcessOut:
        """Write to a running process's stdin (then close it with ``close``). Never retried."""
        return await self.run(
            calls.write_stdin(sandbox_id, handle, data=data, data_b64=data_b64, close=close)
        )

    async def signal_process(
        self, sandbox_id: str, handle: int, *, signal: int = 15, grace_ms: int = 500
    ) -> ProcessOut:
        """Signal the process and everything it started (SIGTERM escalates to SIGKILL after
        ``grace_ms``)."""
        return await self.run(
            calls.signal_process(sandbox_id, handle, signal=signal, grace_ms=grace_ms)
        )

    async def release_process(self, sandbox_id: str, handle: int) -> None:
        """Kill the process tree and forget the handle."""
        await self.run(calls.release_process(sandbox_id, handle))

    async def put_file(
        self, sandbox_id: str, path: str, data: bytes, *, tar: bool = False
    ) -> FileOut:
        """Upload bytes to ``path`` (or extract a tar into directory ``path``)."""
        return await self.run(calls.put_file(sandbox_id, path, data, tar=tar))

    async def get_file(self, sandbox_id: str, path: str) -> bytes:
        """Download ``path`` (a file's bytes, or a tar of a directory)."""
        return await self.run(calls.get_file(sandbox_id, path))

    async def snapshot(self, sandbox_id: str) -> SnapshotOut:
        """Snapshot a sandbox's filesystem."""
        return await self.run(calls.snapshot(sandbox_id))

    async def get_snapshot(self, snapshot_id: str) -> SnapshotOut:
        """One of the caller's snapshots (its bytes and expiry)."""
        return await self.run(calls.get_snapshot(snapshot_id))

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """Delete a snapshot (forks keep running); its snapshot quota is given back."""
        await self.run(calls.delete_snapshot(snapshot_id))

    async def fork(self, snapshot_id: str, n: int, *, ttl_s: int | None = None) -> ForkOut:
        """Start ``n`` sandboxes from a snapshot."""
        return await self.run(calls.fork(snapshot_id, n, ttl_s=ttl_s))

    async def templates(self) -> list[TemplateOut]:
        """The sandbox templates."""
        return await self.run(calls.templates())

    # -- tasks and episodes -----------------------------------------------------------------

    async def tasks(self, *, suite: str | None = None) -> TaskList:
        """The tasks (of one suite, or all)."""
        return await self.run(calls.tasks(suite))

    async def get_task(self, suite: str, task_id: str) -> TaskOut:
        """One task as workers see it (no tests, no solution)."""
        return await self.run(calls.get_task(suite, task_id))

    async def start_episodes(
        self,
        task_id: str,
        *,
        suite: str | None = None,
        group_size: int = 1,
        job_id: str | None = None,
        work_item_id: str | None = None,
        group_id: str | None = None,
        ttl_s: int | None = None,
    ) -> EpisodeGroupOut:
        """Start ``group_size`` episodes of a task, forked from one prepared state."""
        return await self.run(
            calls.start_episodes(
                task_id,
                suite=suite,
                group_size=group_size,
                job_id=job_id,
                work_item_id=work_item_id,
                group_id=group_id,
                ttl_s=ttl_s,
            )
        )

    async def get_episode(self, episode_id: str) -> EpisodeOut:
        """One episode."""
        return await self.run(calls.get_episode(episode_id))

    async def verify(
        self,
        episode_id: str,
        trajectory: VerifyIn | dict[str, Any],
        *,
        timeout_s: float | None = None,
    ) -> RewardRecord:
        """Verify an episode with its trajectory into a reward record (a repeat returns the
        stored record). ``timeout_s``: this call's timeout (default the client's); a
        verification runs the task's tests to their own limit, so give it more."""
        return await self.run(calls.verify(episode_id, trajectory), timeout_s=timeout_s)

    # -- jobs and work items ----------------------------------------------------------------

    async def create_job(
        self,
        *,
        suite: str,
        policy: dict[str, str],
        task_ids: list[str] | None = None,
        group_size: int = 1,
        priority: int = 0,
        max_attempts: int = 3,
    ) -> JobOut:
        """Create a rollout job: ``task_ids`` (default: the whole suite) x ``group_size``."""
        return await self.run(
            calls.create_job(
                suite=suite,
                policy=policy,
                task_ids=task_ids,
                group_size=group_size,
                priority=priority,
                max_attempts=max_attempts,
            )
        )

    async def get_job(self, job_id: str) -> JobOut:
        """A job and its progress."""
        return await self.run(calls.get_job(job_id))

    async def cancel_job(self, job_id: str) -> JobOut:
        """Cancel a job's queued items."""
        return await self.run(calls.cancel_job(job_id))

    async def claim(
        self,
        job_id: str,
        *,
        worker: str,
        lease_s: float = 60,
        policy_version: int | None = None,
    ) -> WorkItemOut | None:
        """Claim the job's next work item for ``lease_s`` seconds; None when none is free.

        ``policy_version``: the version of the weights that will sample the item (a job
        with ``max_staleness`` refuses or flags claims too far behind its newest).

        Raises:
            ConflictError: the job is cancelled or finished, or refuses a stale version.
        """
        return await self.run(
            calls.claim(job_id, worker=worker, lease_s=lease_s, policy_version=policy_version)
        )

    async def heartbeat_item(
        self, item_id: str, *, worker: str, lease_s: float = 60
    ) -> WorkItemOut:
        """Extend a claim by ``lease_s`` seconds."""
        return await self.run(calls.heartbeat_item(item_id, worker=worker, lease_s=lease_s))

    async def complete(
        self,
        item_id: str,
        *,
        worker: str,
        ok: bool,
        error: str | None = None,
        cause: str = "policy",
    ) -> WorkItemOut:
        """Complete a claimed item (``ok=False`` lets the server retry it; ``cause``
        policy, verifier or infrastructure: only the first two use an attempt)."""
        return await self.run(
            calls.complete(item_id, worker=worker, ok=ok, error=error, cause=cause)
        )

    # -- records ----------------------------------------------------------------------------

    async def list_records(
        self,
        *,
        job_id: str | None = None,
        suite: str | None = None,
        domain: str | None = None,
        task_id: str | None = None,
        status: str | None = None,
        after: str | None = None,
        limit: int = 100,
    ) -> RewardPage:
        """One page of reward records, oldest first (``next_after`` pages on)."""
        return await self.run(
            calls.list_records(
                job_id=job_id,
                suite=suite,
                domain=domain,
                task_id=task_id,
                status=status,
                after=after,
                limit=limit,
            )
        )

    async def export_records(
        self,
        *,
        fmt: str = "jsonl",
        normalize: str = "none",
        job_id: str | None = None,
        suite: str | None = None,
        domain: str | None = None,
        task_id: str | None = None,
    ) -> bytes:
        """Every matching record as JSONL or Parquet bytes, with advantages per
        ``normalize`` (none, grpo, mean, domain_z)."""
        return await self.run(
            calls.export_records(
                fmt=fmt,
                normalize=normalize,
                job_id=job_id,
                suite=suite,
                domain=domain,
                task_id=task_id,
            )
        )


class AsyncSandbox:
    """A leased sandbox bound to an async client (``info``: its ``SandboxOut``). An async
    context manager: ``async with`` releases it on exit."""

    def __init__(self, client: AsyncClient, info: SandboxOut) -> None:
        self.client, self.info, self.id = client, info, info.id
        self._keepalive: asyncio.Task | None = None

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()

    async def exec(self, cmd: str | list[str], **options: Any) -> ExecOut:
        """Run a command in this sandbox (``on_stdout``/``on_stderr`` stream it)."""
        return await self.client.exec(self.id, cmd, **options)

    def exec_stream(
        self, cmd: str | list[str], **options: Any
    ) -> AsyncIterator[ExecChunk | ExecOut]:
        """Run a command, yielding ``ExecChunk``s as it writes, then its ``ExecOut``."""
        return self.client.exec_stream(self.id, cmd, **options)

    async def put(self, path: str, data: bytes, *, tar: bool = False) -> FileOut:
        """Upload bytes to ``path`` (or extract a tar into directory ``path``)."""
        return await self.client.put_file(self.id, path, data, tar=tar)

    async def get(self, path: str) -> bytes:
        """Download ``path`` (a file's bytes, or a tar of a directory)."""
        return await self.client.get_file(self.id, path)

    async def snapshot(self) -> SnapshotOut:
        """Snapshot this sandbox's filesystem (``client.delete_snapshot`` frees it)."""
        return await self.client.snapshot(self.id)

    @asynccontextmanager
    async def fork(self, n: int, *, ttl_s: int | None = None) -> AsyncIterator[list[AsyncSandbox]]:
        """Snapshot this sandbox and start ``n`` sandboxes from it for the ``async with``
        block; on exit the forks are released and the snapshot deleted."""
        snap = await self.snapshot()
        try:
            out = await self.client.fork(snap.id, n, ttl_s=ttl_s)
            forks = [AsyncSandbox(self.client, sb) for sb in out.sandboxes]
            try:
                yield forks
            finally:
                await asyncio.gather(*(f.release() for f in forks))
        finally:
            await self.client.delete_snapshot(snap.id)

    async def heartbeat(self, *, ttl_s: int | None = None) -> SandboxOut:
        """Extend the TTL (to ``ttl_s`` seconds from now, or the lease's TTL)."""
        self.info = await self.client.heartbeat(self.id, ttl_s=ttl_s)
        return self.info

    def keepalive(self, every_s: float, *, ttl_s: int | None = None) -> None:
        """Heartbeat every ``every_s`` seconds in a task until ``release`` (a failed beat is
        retried at the next tick; a sandbox gone ends the loop)."""
        if self._keepalive is not None:
            return

        async def beat() -> None:
            from policy_client.errors import ConflictError, NotFoundError

            while True:
                await asyncio.sleep(every_s)
                try:
                    await self.client.heartbeat(self.id, ttl_s=ttl_s)
                except (ConflictError, NotFoundError):
                    return
                except Exception:  # noqa: BLE001, S112 - the next tick retries
                    continue

        self._keepalive = asyncio.get_running_loop().create_task(beat())

    async def release(self) -> SandboxOut:
        """Stop any keepalive and release (destroy) the sandbox; twice is fine."""
        if self._keepalive is not None:
            self._keepalive.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keepalive
        return await self.client.release(self.id)
