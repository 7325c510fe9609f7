"""Trial 27's findings at the HTTP edge (a differential fuzz of the exec lane against the
full stack, raw sockets), fixed by class and pinned here through a real server:

- a header that says one thing, given twice, is a 400 naming it (the layers read
  different copies: the limits middleware the last ``Content-Type``, FastAPI the first;
  the idempotency middleware filed a request under the last key's tenant, the route acted
  as the first's);
- a ``Content-Length`` of 4,301 leading zeros is read, never a 500 (``int()`` raised on
  every route, before authentication);
- a process output offset past what the keeper reads is a 422, not a 500;
- an exec's audit event says who it ran as, where, with which env and stdin (digests).
"""

from __future__ import annotations

import hashlib
import json
import socket
from typing import Any
from urllib.parse import urlparse

import pytest

from tests.integration.api.conftest import Stack
from tests.integration.api.test_sandboxes_api import assert_problem, audit_actions, lease

pytestmark = pytest.mark.docker


def raw(
    stack: Stack, method: str, path: str, headers: list[tuple[str, str]], body: bytes
) -> tuple[int, dict[str, str], bytes]:
    """One request on its own connection, headers exactly as given: (status, headers, body)."""
    u = urlparse(stack.url)
    head = f"{method} {path} HTTP/1.1\r\nHost: {u.netloc}\r\nConnection: close\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
    with socket.create_connection((u.hostname, u.port), timeout=60) as s:
        s.sendall(head.encode("latin-1") + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    top, _, rest = data.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    fields = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in fields.items()}, rest


def key(client: Any) -> str:
    return client.headers["authorization"]


def test_a_content_length_of_thousands_of_leading_zeros_is_read(stack: Stack) -> None:
    sid = lease(stack.alice)["id"]
    body = b'{"cmd": "echo hi"}'
    length = "0" * 5000 + str(len(body))
    for path in (f"/v1/sandboxes/{sid}/exec", "/v1/sandboxes/x/heartbeat"):
        status, _, out = raw(
            stack,
            "POST",
            path,
            [
                ("Authorization", key(stack.alice)),
                ("Content-Type", "application/json"),
                ("Content-Length", length),
            ],
            body,
        )
        assert status < 500, out
    status, _, out = raw(stack, "GET", "/healthz", [("Content-Length", "0" * 5000)], b"")
    assert status == 200, out


# (a repeated Content-Length never gets this far: uvicorn's parser answers a plain 400)
@pytest.mark.parametrize("header", ["Content-Type", "Authorization"])
def test_a_header_given_twice_is_refused_naming_it(stack: Stack, header: str) -> None:
    sid = lease(stack.alice)["id"]
    deep = b'{"cmd": "true", "env": {"A": ' + b"[" * 900 + b"]" * 900 + b"}}"
    headers = {
        "Content-Type": [("Content-Type", "application/json"), ("Content-Type", "text/plain")],
        "Authorization": [("Authorization", key(stack.alice)), ("Authorization", key(stack.bob))],
    }[header]
    rest = [
        h
        for h in [
            ("Authorization", key(stack.alice)),
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(deep))),
        ]
        if h[0] != header
    ]
    before = len(audit_actions(stack, sid))
    status, fields, out = raw(stack, "POST", f"/v1/sandboxes/{sid}/exec", rest + headers, deep)
    assert status == 400 and fields["content-type"].startswith("application/problem+json"), out
    problem = json.loads(out)
    assert problem["field"] == header and "more than once" in problem["detail"], problem
    assert len(audit_actions(stack, sid)) == before  # nothing ran, nothing stored


def test_an_idempotent_retry_under_two_keys_is_refused_not_crossed(stack: Stack) -> None:
    """Alice's key first, bob's second, one Idempotency-Key: before, the lease was alice's
    and its record filed under bob's tenant (bob's retry replayed alice's sandbox)."""
    body = b'{"template": "terminal", "ttl_s": 120}'
    status, _, out = raw(
        stack,
        "POST",
        "/v1/sandboxes",
        [
            ("Authorization", key(stack.alice)),
            ("Authorization", key(stack.bob)),
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(body))),
            ("Idempotency-Key", "trial-27-dup-auth"),
        ],
        body,
    )
    assert status == 400 and json.loads(out)["field"] == "Authorization", out
    r = stack.bob.post(
        "/v1/sandboxes",
        json={"template": "terminal", "ttl_s": 120},
        headers={"Idempotency-Key": "trial-27-dup-auth"},
    )
    assert r.status_code == 201 and r.headers.get("idempotent-replayed") is None, r.headers
    assert r.json()["id"] not in {
        s["id"] for s in stack.alice.get("/v1/sandboxes").json()["sandboxes"]
    }


def test_an_output_offset_past_the_keepers_range_is_a_422(stack: Stack) -> None:
    sid = lease(stack.alice)["id"]
    r = stack.alice.post(f"/v1/sandboxes/{sid}/processes", json={"cmd": "echo x"})
    assert r.status_code == 201, r.text
    handle = r.json()["handle"]
    r = stack.alice.get(
        f"/v1/sandboxes/{sid}/processes/{handle}/output", params={"offset": str(2**64)}
    )
    assert_problem(r, 422)


def test_an_exec_event_says_who_where_and_with_what(stack: Stack) -> None:
    sid = lease(stack.alice)["id"]
    r = stack.alice.post(
        f"/v1/sandboxes/{sid}/exec",
        json={
            "cmd": ["sh", "-c", 'eval "$X"', "a b"],
            "env": {"X": "id -u"},
            "user": "0",
            "cwd": "/tmp",
            "stdin": "in",
        },
    )
    assert r.status_code == 200 and r.json()["stdout"] == "0\n", r.text
    event = [e for e in audit_actions(stack, sid) if e["action"] == "sandbox.exec"][-1]
    d = event["details"]
    assert d["argv"] == ["sh", "-c", 'eval "$X"', "a b"] and d["argv_truncated"] is False, d
    assert (d["user"], d["cwd"]) == ("0", "/tmp"), d
    assert d["env_sha256"] == {"X": hashlib.sha256(b"id -u").hexdigest()}, d
    assert d["stdin_sha256"] == hashlib.sha256(b"in").hexdigest(), d
    assert "id -u" not in json.dumps(event)  # env values may be secrets: digests only


def test_an_upload_with_a_header_given_twice_is_refused_too(stack: Stack) -> None:
    """Uploads stream under their own size limit, past the body checks; the repeated-header
    rule still holds there."""
    sid = lease(stack.alice)["id"]
    status, _, out = raw(
        stack,
        "PUT",
        f"/v1/sandboxes/{sid}/files?path=/tmp/x",
        [
            ("Authorization", key(stack.alice)),
            ("Authorization", key(stack.bob)),
            ("Content-Length", "2"),
        ],
        b"hi",
    )
    assert status == 400 and json.loads(out)["field"] == "Authorization", out
    r = stack.alice.get(f"/v1/sandboxes/{sid}/files", params={"path": "/tmp/x"})
    assert r.status_code == 404, r.text  # nothing written


def test_a_retry_sent_the_moment_the_answer_arrives_is_replayed(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answer of a keyed request is stored before its last byte goes out: a worker that
    has its lease and retries at once (a lost ack is indistinguishable) gets the replay.
    Before, the store ran after the answer, and a retry in between was a 503 "still
    running" (a parity test's immediate retry failed that way); a slow store shows it
    every time."""
    import time

    from service import idempotency

    finish = idempotency.finish

    def slow_finish(*args: Any, **kwargs: Any) -> None:
        time.sleep(0.5)  # a loaded database
        finish(*args, **kwargs)

    monkeypatch.setattr(idempotency, "finish", slow_finish)
    key = {"Idempotency-Key": "trial-27-immediate-retry"}
    body = {"template": "terminal", "ttl_s": 120}
    first = stack.alice.post("/v1/sandboxes", json=body, headers=key)
    again = stack.alice.post("/v1/sandboxes", json=body, headers=key)
    assert first.status_code == 201, first.text
    assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true", again.text
    assert again.json()["id"] == first.json()["id"]


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_a_metadata_float_that_json_cannot_store_is_a_422(stack: Stack, value: str) -> None:
    """PostgreSQL's json refused NaN and the infinities: a lease carrying one was a 500
    there (SQLite stored null). A quick trial on the lease lane found it."""
    before = len(stack.alice.get("/v1/sandboxes").json()["sandboxes"])
    body = '{"template": "terminal", "metadata": {"x": ' + value + "}}"
    r = stack.alice.post(
        "/v1/sandboxes", content=body, headers={"Content-Type": "application/json"}
    )
    assert_problem(r, 422)
    assert len(stack.alice.get("/v1/sandboxes").json()["sandboxes"]) == before


def test_an_answer_that_could_not_be_stored_still_goes_out_and_frees_the_key(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database error while storing a keyed answer cut the answer off, and the key stayed
    pending: every retry a 503 "still running" for a day while the lease stood. Now the
    answer goes out whole and the key is forgotten (a retry runs again, as after a crash)."""
    from service import idempotency

    finish = idempotency.finish
    calls = {"n": 0}

    def failing_once(*args: Any, **kwargs: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("database went away")
        finish(*args, **kwargs)

    monkeypatch.setattr(idempotency, "finish", failing_once)
    key = {"Idempotency-Key": "quick-trial-unstored"}
    body = {"template": "terminal", "ttl_s": 120}
    first = stack.alice.post("/v1/sandboxes", json=body, headers=key)
    assert first.status_code == 201 and first.json()["id"], first.text
    again = stack.alice.post("/v1/sandboxes", json=body, headers=key)
    assert again.status_code == 201 and "idempotent-replayed" not in again.headers, again.text
    third = stack.alice.post("/v1/sandboxes", json=body, headers=key)
    assert third.headers["idempotent-replayed"] == "true" and third.json() == again.json()


def test_a_retry_that_fixed_what_a_4xx_named_runs_again(stack: Stack) -> None:
    """A 4xx answer to a keyed request was kept and replayed for a day: the idempotency
    digest covers the body, not ``Content-Type``, so a lease sent as ``text/plain`` (a 4xx
    naming it) and retried, fixed, under the same key got the stale error back. An error
    changed nothing, so its key is forgotten now and the retry runs (Stripe's rule)."""
    key = "trial-28-content-type"
    body = json.dumps({"template": "terminal", "ttl_s": 120})
    first = stack.alice.post(
        "/v1/sandboxes",
        content=body,
        headers={"Content-Type": "text/plain", "Idempotency-Key": key},
    )
    assert 400 <= first.status_code < 500, first.text
    fixed = stack.alice.post(
        "/v1/sandboxes",
        content=body,
        headers={"Content-Type": "application/json", "Idempotency-Key": key},
    )
    assert fixed.status_code == 201 and "idempotent-replayed" not in fixed.headers, fixed.text
    again = stack.alice.post(
        "/v1/sandboxes",
        content=body,
        headers={"Content-Type": "application/json", "Idempotency-Key": key},
    )
    assert again.headers["idempotent-replayed"] == "true" and again.json() == fixed.json()
    stack.alice.delete(f"/v1/sandboxes/{fixed.json()['id']}")


@pytest.mark.parametrize("suffix", ["%0A", "%0D", "%00", "%7F", "%09x"])
def test_a_control_character_in_the_path_is_a_400_naming_it(stack: Stack, suffix: str) -> None:
    """Starlette's route patterns end in ``$``, which matches before a final newline too:
    ``POST /v1/sandboxes%0A`` leased a sandbox (through the lane and the full stack alike).
    A control character in the decoded path is refused at the edge, before every layer."""
    before = len(stack.alice.get("/v1/sandboxes").json()["sandboxes"])
    body = json.dumps({"template": "terminal"}).encode()
    status, headers, out = raw(
        stack,
        "POST",
        f"/v1/sandboxes{suffix}",
        [
            ("Authorization", key(stack.alice)),
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(body))),
        ],
        body,
    )
    assert status == 400 and headers["content-type"] == "application/problem+json", out
    problem = json.loads(out)
    assert problem["field"] == "path" and problem["request_id"] == headers["x-request-id"]
    assert len(stack.alice.get("/v1/sandboxes").json()["sandboxes"]) == before


def _stalled(stack: Stack, path: str, headers: list[tuple[str, str]], sent: bytes) -> tuple:
    """Send the head and ``sent`` (less than declared), then wait: (status, headers, body,
    seconds until the answer, whether the server closed the connection after it)."""
    import time

    u = urlparse(stack.url)
    head = f"POST {path} HTTP/1.1\r\nHost: {u.netloc}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
    with socket.create_connection((u.hostname, u.port), timeout=30) as s:
        t0 = time.monotonic()
        s.sendall(head.encode("latin-1") + sent)
        data = b""
        try:
            while chunk := s.recv(65536):  # ends when the server closes
                data += chunk
        except TimeoutError:
            raise AssertionError(f"not closed; got {data!r}") from None
        took = time.monotonic() - t0
    top, _, rest = data.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    fields = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:])}
    return int(lines[0].split()[1]), fields, rest, took


@pytest.mark.parametrize("lane", [True, False], ids=["lane", "full-stack"])
@pytest.mark.parametrize("route", ["lease", "exec", "upload", "chunked"])
def test_a_body_that_stops_arriving_is_a_408_and_the_connection_closes(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, route: str, lane: bool
) -> None:
    """uvicorn bounds an idle kept-alive connection, not a body that stops arriving: a
    request that declared 100 bytes and sent 10 held its connection and handler forever
    (trial 27 left it open). Each wait for the body's next part is bounded now."""
    monkeypatch.setattr(stack.ctx.settings, "body_idle_timeout_s", 1.0)
    monkeypatch.setattr(stack.ctx.settings, "fast_lane", lane)
    sid = lease(stack.alice)["id"]
    before = len(stack.alice.get("/v1/sandboxes").json()["sandboxes"])
    auth = ("Authorization", key(stack.alice))
    path, headers, sent = {
        "lease": ("/v1/sandboxes", [("Content-Type", "application/json")], b'{"templ'),
        "exec": (f"/v1/sandboxes/{sid}/exec", [("Content-Type", "application/json")], b'{"cmd'),
        "upload": (
            f"/v1/sandboxes/{sid}/files?path=/workspace/stalled.bin",
            [("Content-Type", "application/octet-stream")],
            b"0123456789",
        ),
        "chunked": ("/v1/sandboxes", [("Content-Type", "application/json")], b""),
    }[route]
    if route == "chunked":
        headers = [*headers, ("Transfer-Encoding", "chunked")]
        sent = b'4\r\n{"te\r\n'
    else:
        headers = [*headers, ("Content-Length", "100")]
    status, fields, out, took = _stalled(stack, path, [auth, *headers], sent)
    assert status == 408 and fields["content-type"] == "application/problem+json", out
    assert fields["connection"] == "close" and json.loads(out)["field"] == "body"
    assert 0.9 <= took < 10, took
    assert len(stack.alice.get("/v1/sandboxes").json()["sandboxes"]) == before
    if route == "upload":
        r = stack.alice.get(f"/v1/sandboxes/{sid}/files", params={"path": "/workspace/stalled.bin"})
        assert r.status_code == 404, "a stalled upload is not kept"
    stack.alice.delete(f"/v1/sandboxes/{sid}")


def test_a_slow_body_that_keeps_arriving_is_served(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deadline is between two parts of the body, not for the whole of it."""
    import time

    monkeypatch.setattr(stack.ctx.settings, "body_idle_timeout_s", 1.0)
    sid = lease(stack.alice)["id"]
    body = json.dumps({"cmd": "echo slow"}).encode()
    u = urlparse(stack.url)
    head = (
        f"POST /v1/sandboxes/{sid}/exec HTTP/1.1\r\nHost: {u.netloc}\r\nConnection: close\r\n"
        f"Authorization: {key(stack.alice)}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection((u.hostname, u.port), timeout=30) as s:
        s.sendall(head.encode())
        for i in range(0, len(body), 6):  # ~2 s in all, 0.4 s between parts
            s.sendall(body[i : i + 6])
            time.sleep(0.4)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200"), data[:300]
    assert json.loads(data.partition(b"\r\n\r\n")[2])["stdout"] == "slow\n"
    stack.alice.delete(f"/v1/sandboxes/{sid}")


def _requests_by_status(stack: Stack) -> dict[str, float]:
    import re

    text = stack.alice.get("/metrics").text
    out: dict[str, float] = {}
    for status, value in re.findall(
        r'^crucible_http_requests_total\{[^}]*status="(\d+)"[^}]*\} (\S+)$', text, re.M
    ):
        out[status] = out.get(status, 0.0) + float(value)
    return out


@pytest.mark.parametrize("lane", [True, False], ids=["lane", "full-stack"])
def test_a_timed_out_body_is_counted_as_408_not_500(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, lane: bool
) -> None:
    """Trial 29: the metrics and the access log defaulted to 500 for a request with no
    answer started, so every 408 the edge sent (to anyone, no key needed) counted as a 5xx
    and could trip 5xx alerts. The edge marks the scope; a client that left is a 499."""
    monkeypatch.setattr(stack.ctx.settings, "body_idle_timeout_s", 1.0)
    monkeypatch.setattr(stack.ctx.settings, "fast_lane", lane)
    before = _requests_by_status(stack)
    head = [("Content-Type", "application/json"), ("Content-Length", "50")]
    status, _, _, _ = _stalled(stack, "/v1/sandboxes", head, b"{")
    assert status == 408
    after = _requests_by_status(stack)
    assert after.get("500", 0) == before.get("500", 0), (before, after)
    assert after.get("408", 0) == before.get("408", 0) + 1, (before, after)


def test_an_answer_before_the_body_ends_closes_the_connection(stack: Stack) -> None:
    """Trial 29: an upload refused before its body was read (401: no key) kept its
    connection, and a client trickling the declared 10^17 bytes held it for ever: no
    handler waited on the body, so no deadline bounded it. Such an answer now closes."""
    u = urlparse(stack.url)
    head = (
        f"PUT /v1/sandboxes/x/files?path=/tmp/a HTTP/1.1\r\nHost: {u.netloc}\r\n"
        "Content-Type: application/octet-stream\r\nContent-Length: 100000000000000000\r\n\r\n"
    )
    with socket.create_connection((u.hostname, u.port), timeout=30) as s:
        s.sendall(head.encode() + b"x")
        data = b""
        while chunk := s.recv(65536):  # ends when the server closes
            data += chunk
    top = data.partition(b"\r\n\r\n")[0].decode("latin-1").lower()
    assert top.startswith("http/1.1 401") and "connection: close" in top, top
