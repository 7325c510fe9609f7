"""The SDK against the real service: the README's example, limits, typed errors."""

from __future__ import annotations

import pytest

from policy_client import Client, ConflictError, NotFoundError
from tests.integration.api.conftest import Stack

pytestmark = pytest.mark.docker


def _key(client: object) -> str:
    return client.headers["authorization"].split(" ", 1)[1]  # type: ignore[attr-defined]


def test_readme_example_limits_files_and_typed_errors(stack: Stack) -> None:
    with Client(stack.url, _key(stack.alice)) as client:
        with client.sandbox("terminal", cpus=0.5, memory_mb=256) as sb:
            assert (sb.info.cpus, sb.info.memory_mb) == (0.5, 256)
            assert sb.exec("echo hi").stdout == "hi\n"
            sb.put("notes/a.txt", b"payload")
            assert sb.get("notes/a.txt") == b"payload"
            sid = sb.id
        with pytest.raises(ConflictError):
            client.exec(sid, "true")
    with Client(stack.url, _key(stack.bob)) as bob, pytest.raises(NotFoundError) as e:
        bob.get_sandbox(sid)
    assert e.value.status == 404 and e.value.field == "sandbox_id"
