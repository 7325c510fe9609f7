"""The Crucible SDK: ``Client`` (sync) and ``AsyncClient`` over httpx, typed with the API's own
pydantic schemas.

    with Client(url, api_key) as client, client.sandbox("terminal") as sb:
        print(sb.exec("ls -la").stdout)

Only idempotent calls (reads, releases, heartbeats, file uploads, verification) are retried,
on transport errors and 502/503, with exponential backoff. Problems become typed exceptions
(``policy_client.errors``).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import httpx

from policy_client import calls
from policy_client.calls import Call
from policy_client.errors import TransportError, raise_for_problem
from service.schemas import ExecOut, SandboxOut

RETRY_STATUSES = (502, 503)


def _defaults(base_url: str | None, api_key: str | None) -> tuple[str, str]:
    url = base_url or os.environ.get("CRUCIBLE_URL", "http://127.0.0.1:8000")
    key = api_key or os.environ.get("CRUCIBLE_API_KEY", "")
    return url.rstrip("/"), key


class _Base:
    """What both clients share: defaults, retry policy, answer decoding."""

    def __init__(
        self, base_url: str | None, api_key: str | None, *, retries: int, backoff_s: float
    ) -> None:
        self.base_url, self.api_key = _defaults(base_url, api_key)
        self.retries, self.backoff_s = retries, backoff_s
        self.headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _attempts(self, call: Call) -> int:
        return 1 + (self.retries if call.idempotent else 0)

    @staticmethod
    def _request_kwargs(call: Call) -> dict[str, Any]:
        kw: dict[str, Any] = {"params": call.params or None, "headers": call.headers or None}
        if call.json is not None:
            kw["json"] = call.json
        if call.content is not None:
            kw["content"] = call.content
        return kw

    def _finish(self, call: Call, response: httpx.Response) -> Any:
        raise_for_problem(response)
        return calls.parse(call, response.status_code, response.content)


class Client(_Base):
    """Synchronous client. ``timeout_s`` bounds each HTTP call (exec adds its own timeout)."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout_s: float = 120.0,
        retries: int = 3,
        backoff_s: float = 0.2,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, api_key, retries=retries, backoff_s=backoff_s)
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
        """Execute one call (retrying idempotent ones) and decode its answer."""
        last: Exception | None = None
        for attempt in range(self._attempts(call)):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                kw = self._request_kwargs(call)
                if timeout_s is not None:
                    kw["timeout"] = timeout_s
                response = self._http.request(call.method, call.path, **kw)
            except httpx.TransportError as e:
                last = e
                continue
            if response.status_code in RETRY_STATUSES and attempt + 1 < self._attempts(call):
                continue
            return self._finish(call, response)
        raise TransportError(f"{call.method} {call.path}: {last}") from last

    # -- sandboxes --------------------------------------------------------------------------

    def lease(
        self, template: str, *, ttl_s: int | None = None, metadata: dict | None = None
    ) -> SandboxOut:
        """Lease a sandbox of ``template`` (``QuotaError`` when over quota)."""
        return self.run(calls.lease(template, ttl_s=ttl_s, metadata=metadata))

    def release(self, sandbox_id: str) -> SandboxOut:
        """Release (destroy) a sandbox; releasing twice is fine."""
        return self.run(calls.release(sandbox_id))

    def exec(
        self, sandbox_id: str, cmd: str | list[str], *, timeout_s: float = 60.0, **options: Any
    ) -> ExecOut:
        """Run a command (options: cwd, env, stdin, max_output_bytes, output_b64)."""
        return self.run(
            calls.exec_(sandbox_id, cmd, timeout_s=timeout_s, **options), timeout_s=timeout_s + 30
        )

    @contextmanager
    def sandbox(self, template: str, **lease_options: Any) -> Iterator[Sandbox]:
        """Lease a sandbox for the ``with`` block; it is released on exit."""
        sb = self.lease(template, **lease_options)
        try:
            yield Sandbox(self, sb)
        finally:
            self.release(sb.id)

    def __getattr__(self, name: str) -> Any:
        """Every other call of ``policy_client.calls`` as a method (``client.get_job(id)``)."""
        factory = getattr(calls, name, None)
        if factory is None or name.startswith("_") or name in ("parse", "Call"):
            raise AttributeError(name)
        return lambda *a, **kw: self.run(factory(*a, **kw))


class Sandbox:
    """A leased sandbox bound to a sync client."""

    def __init__(self, client: Client, info: SandboxOut) -> None:
        self.client, self.info, self.id = client, info, info.id

    def exec(self, cmd: str | list[str], **options: Any) -> ExecOut:
        """Run a command in this sandbox."""
        return self.client.exec(self.id, cmd, **options)

    def put(self, path: str, data: bytes, *, tar: bool = False) -> Any:
        """Upload bytes to ``path`` (or extract a tar into directory ``path``)."""
        return self.client.run(calls.put_file(self.id, path, data, tar=tar))

    def get(self, path: str) -> bytes:
        """Download ``path`` (a file's bytes, or a tar of a directory)."""
        return self.client.run(calls.get_file(self.id, path))


class AsyncClient(_Base):
    """Asynchronous client (for rollout workers running many episodes at once)."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout_s: float = 120.0,
        retries: int = 3,
        backoff_s: float = 0.2,
        max_connections: int = 64,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, api_key, retries=retries, backoff_s=backoff_s)
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
        """Execute one call (retrying idempotent ones) and decode its answer."""
        last: Exception | None = None
        for attempt in range(self._attempts(call)):
            if attempt:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                kw = self._request_kwargs(call)
                if timeout_s is not None:
                    kw["timeout"] = timeout_s
                response = await self._http.request(call.method, call.path, **kw)
            except httpx.TransportError as e:
                last = e
                continue
            if response.status_code in RETRY_STATUSES and attempt + 1 < self._attempts(call):
                continue
            return self._finish(call, response)
        raise TransportError(f"{call.method} {call.path}: {last}") from last

    async def exec(
        self, sandbox_id: str, cmd: str | list[str], *, timeout_s: float = 60.0, **options: Any
    ) -> ExecOut:
        """Run a command (options: cwd, env, stdin, max_output_bytes, output_b64)."""
        return await self.run(
            calls.exec_(sandbox_id, cmd, timeout_s=timeout_s, **options), timeout_s=timeout_s + 30
        )

    @asynccontextmanager
    async def sandbox(self, template: str, **lease_options: Any) -> AsyncIterator[SandboxOut]:
        """Lease a sandbox for the ``async with`` block; released on exit."""
        sb = await self.run(calls.lease(template, **lease_options))
        try:
            yield sb
        finally:
            await self.run(calls.release(sb.id))

    def __getattr__(self, name: str) -> Any:
        """Every call of ``policy_client.calls`` as a coroutine method."""
        factory = getattr(calls, name, None)
        if factory is None or name.startswith("_") or name in ("parse", "Call"):
            raise AttributeError(name)

        async def method(*a: Any, **kw: Any) -> Any:
            return await self.run(factory(*a, **kw))

        return method
