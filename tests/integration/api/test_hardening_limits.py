"""Request limits (issue 11): body size (413 before it is read), JSON depth and UTF-8 (400s
naming the problem), and nothing stored changes on a refusal."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from sqlalchemy import func, select

from service.db.models import AuditEvent, Sandbox
from tests.integration.api.conftest import Stack, start_stack
from tests.integration.api.test_sandboxes_api import assert_problem, lease

pytestmark = pytest.mark.docker

LIMIT = 64 << 10


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from start_stack(
        tmp_path_factory.mktemp("limits"),
        pool_targets={},
        max_body_bytes=LIMIT,
        max_json_depth=32,  # the stack's max_upload_bytes is 1 MiB
    )


def _stored(stack: Stack) -> tuple[int, int]:
    with stack.ctx.db.read() as s:
        return (
            s.execute(select(func.count()).select_from(Sandbox)).scalar_one(),
            s.execute(select(func.count()).select_from(AuditEvent)).scalar_one(),
        )


def _big_lease() -> bytes:
    return json.dumps({"template": "tiny", "metadata": {"pad": "x" * (LIMIT + 1)}}).encode()


def test_a_body_over_the_limit_is_413_declared_or_chunked(stack: Stack) -> None:
    before = _stored(stack)
    r = stack.alice.post(
        "/v1/sandboxes", content=_big_lease(), headers={"content-type": "application/json"}
    )
    assert "exceeds the limit" in assert_problem(r, 413, "body")["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        body = _big_lease()
        for i in range(0, len(body), 4096):
            yield body[i : i + 4096]

    r = stack.alice.post(
        "/v1/sandboxes", content=chunks(), headers={"content-type": "application/json"}
    )
    assert_problem(r, 413, "body")
    assert _stored(stack) == before


def test_a_declared_oversize_body_is_refused_before_it_is_sent(stack: Stack) -> None:
    # The 413 comes back while the client has sent 1 KiB of a declared 100 MiB: the server
    # never waits for (or buffers) the rest.
    url = urlsplit(stack.url)
    key = stack.alice.headers["authorization"]
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(
            (
                "POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Authorization: {key}\r\nContent-Length: {100 << 20}\r\n\r\n"
            ).encode()
            + b"{" * 1024
        )
        t0 = time.monotonic()
        reply = sock.recv(65536).decode()
    assert reply.startswith("HTTP/1.1 413"), reply
    assert "application/problem+json" in reply and time.monotonic() - t0 < 5


def test_json_nested_too_deep_is_a_400(stack: Stack) -> None:
    before = _stored(stack)
    for opener, closer in (("[", "]"), ('{"a":', "}")):
        deep = opener * 5000 + "1" + closer * 5000
        body = '{"template": "tiny", "metadata": {"k": ' + deep + "}}"
        r = stack.alice.post(
            "/v1/sandboxes", content=body, headers={"content-type": "application/json"}
        )
        problem = assert_problem(r, 400, "body")
        assert problem["title"] == "JSON nested too deep" and "32" in problem["detail"]
    # brackets inside strings do not nest, and 32 levels are fine (the schema decides)
    r = stack.alice.post("/v1/sandboxes", json={"template": "tiny", "metadata": {"k": "[" * 999}})
    assert r.status_code == 201, r.text
    stack.alice.delete(f"/v1/sandboxes/{r.json()['id']}")
    r = stack.alice.post("/v1/sandboxes", content="[" * 32 + "]" * 32)
    assert_problem(r, 422)
    assert _stored(stack)[0] == before[0] + 1


def test_a_json_body_that_is_not_utf8_is_a_400(stack: Stack) -> None:
    before = _stored(stack)
    for body, ctype in (
        (b'{"template": "tiny\xff"}', "application/json"),
        (b'{"template": "tiny", "metadata": {"k": "\xc3("}}', "application/merge-patch+json"),
        ('{"template": "tiny"}'.encode("utf-16"), "application/json"),
        (b'{"template": "t\xe9"}', None),  # no Content-Type: FastAPI reads it as JSON
    ):
        headers = {"content-type": ctype} if ctype else {}
        r = stack.alice.post("/v1/sandboxes", content=body, headers=headers)
        problem = assert_problem(r, 400, "body")
        assert problem["title"] == "Body is not UTF-8", problem
    assert _stored(stack) == before


def test_uploads_keep_their_own_limit(stack: Stack) -> None:
    sid = lease(stack.alice, "tiny")["id"]
    try:
        data = b"\xff" * (LIMIT * 4)  # over the body limit, under max_upload_bytes; not UTF-8
        r = stack.alice.put(
            f"/v1/sandboxes/{sid}/files", params={"path": "/tmp/blob"}, content=data
        )
        assert r.status_code == 200 and r.json()["bytes"] == len(data), r.text
        r = stack.alice.put(
            f"/v1/sandboxes/{sid}/files", params={"path": "/tmp/big"}, content=b"x" * (2 << 20)
        )
        assert_problem(r, 413, "body")
    finally:
        stack.alice.delete(f"/v1/sandboxes/{sid}")
