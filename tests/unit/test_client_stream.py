"""The SDK against the real service (real HTTP, real Docker): streaming exec (iterator and
callbacks, sync and async), ``Sandbox.snapshot/fork/heartbeat/release`` with forks as context
managers, an opt-in keepalive, and typed errors from the stream."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from policy_client import errors
from policy_client.client import AsyncClient, Client, ExecChunk
from policy_client.schemas import ExecOut
from tests.integration.api.conftest import Stack, start_stack

pytestmark = pytest.mark.docker

SCRIPT = "echo one; sleep 0.3; echo two >&2; echo three"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from start_stack(tmp_path_factory.mktemp("stack"))


def _key(stack: Stack) -> str:
    return stack.alice.headers["authorization"].split(" ", 1)[1]


def test_streaming_exec_fork_and_keepalive_sync(stack: Stack) -> None:
    with Client(stack.url, _key(stack)) as client, client.sandbox("terminal", ttl_s=60) as sb:
        items = list(sb.exec_stream(SCRIPT))
        assert isinstance(items[-1], ExecOut) and items[-1].exit_code == 0
        chunks = [i for i in items if isinstance(i, ExecChunk)]
        assert "".join(c.data for c in chunks if c.stream == "stdout") == "one\nthree\n"
        assert "".join(c.data for c in chunks if c.stream == "stderr") == "two\n"
        out: list[str] = []
        err: list[str] = []
        res = sb.exec(SCRIPT, on_stdout=out.append, on_stderr=err.append)
        assert res.exit_code == 0 and "".join(out) == "one\nthree\n" and "".join(err) == "two\n"

        sb.exec("echo forked > /tmp/mark")
        with sb.fork(2) as forks:
            assert len(forks) == 2
            assert all(f.exec("cat /tmp/mark").stdout == "forked\n" for f in forks)
            ids = [f.id for f in forks]
        assert all(client.get_sandbox(i).state == "released" for i in ids)  # released on exit

        before = sb.heartbeat(ttl_s=5).expires_at
        sb.keepalive(1.0, ttl_s=30)
        time.sleep(2.5)
        assert client.get_sandbox(sb.id).expires_at > before
        with pytest.raises(errors.NotFoundError):
            list(client.exec_stream("sb_nope", "true"))


def test_streaming_exec_async(stack: Stack) -> None:
    async def go() -> tuple[list, list[str], ExecOut]:
        async with (
            AsyncClient(stack.url, _key(stack)) as client,
            client.sandbox("terminal", ttl_s=60, keepalive_s=1.0) as sb,
        ):
            items = [i async for i in sb.exec_stream(SCRIPT)]
            got: list[str] = []

            async def on_out(data: str) -> None:
                got.append(data)

            res = await sb.exec(SCRIPT, on_stdout=on_out)
            async with sb.fork(1) as forks:
                assert (await forks[0].exec("true")).exit_code == 0
            return items, got, res

    items, got, res = asyncio.run(go())
    assert isinstance(items[-1], ExecOut)
    assert "".join(i.data for i in items[:-1] if i.stream == "stdout") == "one\nthree\n"
    assert "".join(got) == "one\nthree\n" and res.exit_code == 0
