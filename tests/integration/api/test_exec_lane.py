"""Parity of the exec lane (``service.api.fastlane``) with the full stack it short-cuts.

Every request is sent twice over real HTTP to one real control plane, first with the lane on
and then with ``fast_lane`` off (the route through routing, dependencies and every
middleware, the reference), with the same ``X-Request-ID``: status, body (an exec's result
less its timing), the headers that matter and the audit events must match, and the lane
must have served exactly the requests it claims (a good body and a valid key) and passed
every other one on.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from service import audit, tenants
from service.api import fastlane
from service.db.models import AuditEvent
from service.metrics import HTTP_REQUESTS
from tests.integration.api.conftest import Stack, start_stack

pytestmark = pytest.mark.docker

MAX_BODY = 4096
# Headers whose presence and value must agree (date and server are uvicorn's own).
COMPARED = ("content-type", "x-request-id", "www-authenticate", "content-length")


@pytest.fixture(scope="module")
def lane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from start_stack(
        tmp_path_factory.mktemp("lane"),
        max_body_bytes=MAX_BODY,
        rate_limits={"carol": {"rps": 0.001, "burst": 1}},
    )


@pytest.fixture(scope="module")
def sid(lane: Stack) -> str:
    r = lane.alice.post("/v1/sandboxes", json={"template": "terminal", "ttl_s": 600})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    assert lane.alice.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true"}).status_code == 200
    return sid


def _both(
    lane: Stack, monkeypatch: pytest.MonkeyPatch, send: Callable[[str], httpx.Response]
) -> tuple[httpx.Response, httpx.Response, int]:
    """``send`` through the lane, then through the full stack: (lane's answer, the full
    stack's, how many requests the lane served)."""
    served = fastlane.stats.served
    fast = send("parity-lane")
    n = fastlane.stats.served - served
    with monkeypatch.context() as m:
        m.setattr(lane.ctx.settings, "fast_lane", False)
        full = send("parity-full")
    assert fastlane.stats.served - served == n  # the reference run never took the lane
    return fast, full, n


def _same_answer(fast: httpx.Response, full: httpx.Response, *, result: bool = False) -> None:
    assert fast.status_code == full.status_code, (fast.text, full.text)
    a, b = fast.json(), full.json()
    if result:  # an exec result: the same but its timing
        a.pop("duration_ms"), b.pop("duration_ms")
    else:  # a problem: byte for byte once its request id is named
        assert fast.content == full.content.replace(b"parity-full", b"parity-lane")
    assert a == json.loads(json.dumps(b).replace("parity-full", "parity-lane"))
    for h in COMPARED:
        if result and h == "content-length":
            continue
        left, right = fast.headers.get(h), full.headers.get(h)
        assert (left is None) == (right is None), h
        if h == "x-request-id":
            assert (left, right) == ("parity-lane", "parity-full")
        elif left is not None:
            assert left == right, h
    assert ("retry-after" in fast.headers) == ("retry-after" in full.headers)


def _events(lane: Stack, after: int, action: str | None = None) -> list[AuditEvent]:
    with lane.ctx.db.read() as s:
        q = select(AuditEvent).where(AuditEvent.seq > after).order_by(AuditEvent.seq)
        if action is not None:
            q = q.where(AuditEvent.action == action)
        return list(s.scalars(q).all())


def _head(lane: Stack) -> int:
    with lane.ctx.db.read() as s:
        return s.scalar(select(AuditEvent.seq).order_by(AuditEvent.seq.desc()).limit(1)) or 0


def _post(client: httpx.Client, path: str, rid: str, **kw: Any) -> httpx.Response:
    headers = {"X-Request-ID": rid, **kw.pop("headers", {})}
    return client.post(path, headers=headers, **kw)


GOOD = [
    {"cmd": "echo hi"},
    {"cmd": ["sh", "-c", "printf '%s' \"$X\"; cat; exit 3"], "env": {"X": "é"}, "stdin": "in"},
    {"cmd": "head -c 5 /dev/zero", "output_b64": True, "max_output_bytes": 2},
    {"cmd": "cat", "stdin_b64": "AAEC/w==", "env_b64": {"B": "/w=="}, "timeout_s": 5},
]


@pytest.mark.parametrize("body", GOOD, ids=range(len(GOOD)))
def test_a_good_exec_answers_and_audits_the_same(
    lane: Stack, sid: str, body: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    ok_before = HTTP_REQUESTS.labels("POST", fastlane.ROUTE, "200")._value.get()
    seq = _head(lane)
    fast, full, served = _both(
        lane,
        monkeypatch,
        lambda rid: _post(lane.alice, f"/v1/sandboxes/{sid}/exec", rid, json=body),
    )
    assert served == 1
    assert fast.status_code == 200, fast.text
    _same_answer(fast, full, result=True)
    assert fast.headers["content-type"] == "application/json"
    # the lane counts the request under the route's template, as the full stack does
    assert HTTP_REQUESTS.labels("POST", fastlane.ROUTE, "200")._value.get() == ok_before + 2
    events = _events(lane, seq)
    assert [e.action for e in events] == ["sandbox.exec", "sandbox.exec"]
    a, b = (dict(e.details) for e in events)
    a.pop("duration_ms"), b.pop("duration_ms")
    assert a == b
    assert {(e.tenant_id, e.key_id, e.sandbox_id) for e in events} == {
        (events[0].tenant_id, events[0].key_id, sid)
    }
    assert audit.verify_chain(lane.ctx.db).first_broken_seq is None


SERVICE_ERRORS = {
    "bad stdin_b64": ({"cmd": "cat", "stdin_b64": "not base64!"}, 400),
    "bad env_b64": ({"cmd": "true", "env_b64": {"K": "***"}}, 400),
    "both stdins": ({"cmd": "cat", "stdin": "a", "stdin_b64": "YQ=="}, 400),
    "timeout over the limit": ({"cmd": "true", "timeout_s": 601}, 400),
}


@pytest.mark.parametrize("case", SERVICE_ERRORS)
def test_a_service_error_is_the_same_problem(
    lane: Stack, sid: str, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    body, status = SERVICE_ERRORS[case]
    fast, full, served = _both(
        lane,
        monkeypatch,
        lambda rid: _post(lane.alice, f"/v1/sandboxes/{sid}/exec", rid, json=body),
    )
    assert served == 1 and fast.status_code == status, fast.text
    _same_answer(fast, full)


def test_another_tenants_or_an_unknown_sandbox_is_the_same_404(
    lane: Stack, sid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for client, target in ((lane.bob, sid), (lane.alice, "sb-nothing-here")):
        fast, full, served = _both(
            lane,
            monkeypatch,
            lambda rid, c=client, t=target: _post(
                c, f"/v1/sandboxes/{t}/exec", rid, json={"cmd": "true"}
            ),
        )
        assert served == 1 and fast.status_code == 404, fast.text
        _same_answer(fast, full)


def test_a_released_sandbox_is_the_same_409(lane: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    r = lane.alice.post("/v1/sandboxes", json={"template": "terminal"})
    gone = r.json()["id"]
    assert lane.alice.delete(f"/v1/sandboxes/{gone}").status_code == 200
    seq = _head(lane)
    fast, full, served = _both(
        lane,
        monkeypatch,
        lambda rid: _post(lane.alice, f"/v1/sandboxes/{gone}/exec", rid, json={"cmd": "true"}),
    )
    assert served == 1 and fast.status_code == 409, fast.text
    _same_answer(fast, full)
    assert [e.action for e in _events(lane, seq)] == []  # refused before anything ran


def test_the_rate_limit_is_the_same_429(lane: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    with lane.ctx.db.session() as s:
        tenants.create_tenant(s, "carol", max_sandboxes=1, max_cpus=1, max_memory_mb=1024)
        key = tenants.create_key(s, "carol", scopes=set())
    carol = lane.make_client(key)
    path = "/v1/sandboxes/sb-none/exec"
    # the one token of carol's bucket: the lane counts it as the full stack would
    first = _post(carol, path, "parity-first", json={"cmd": "true"})
    assert first.status_code == 404, first.text
    fast, full, served = _both(
        lane, monkeypatch, lambda rid: _post(carol, path, rid, json={"cmd": "true"})
    )
    assert_same_429(fast, full, served)


def assert_same_429(fast: httpx.Response, full: httpx.Response, served: int) -> None:
    """The lane served a 429 and it equals the full stack's, but for the request id and the
    detail (which names the wait to the millisecond)."""
    assert served == 1 and fast.status_code == 429, fast.text
    assert fast.json()["title"] == full.json()["title"] == "Rate limit exceeded"
    assert int(fast.headers["retry-after"]) > 0 and int(full.headers["retry-after"]) > 0
    a, b = fast.json(), full.json()
    assert (a.pop("request_id"), b.pop("request_id")) == ("parity-lane", "parity-full")
    assert {k: v for k, v in a.items() if k != "detail"} == {
        k: v for k, v in b.items() if k != "detail"
    }


PASSED_ON: dict[str, tuple[dict[str, Any], int]] = {
    "unknown field": ({"json": {"cmd": "true", "shell": "bash"}}, 422),
    "missing cmd": ({"json": {"timeout_s": 5}}, 422),
    "wrong type": ({"json": {"cmd": 5}}, 422),
    "timeout over the schema": ({"json": {"cmd": "true", "timeout_s": 0}}, 422),
    "not an object": ({"json": ["echo"]}, 422),
    "malformed JSON": (
        {"content": b'{"cmd": ', "headers": {"Content-Type": "application/json"}},
        400,
    ),
    "empty body": ({"content": b"", "headers": {"Content-Type": "application/json"}}, 422),
    "text/plain": ({"content": b'{"cmd": "true"}', "headers": {"Content-Type": "text/plain"}}, 422),
    "no content type": ({"content": b'{"cmd": "true"}'}, 422),  # FastAPI: not JSON
    "+json type": (
        {"content": b'{"cmd": "true"}', "headers": {"Content-Type": "application/x+json"}},
        200,
    ),
    "not UTF-8": (
        {"content": b'{"cmd": "\xff"}', "headers": {"Content-Type": "application/json"}},
        400,
    ),
    "nested too deep": (
        {
            "content": b'{"cmd": "true", "env": ' + b"[" * 70 + b"]" * 70 + b"}",
            "headers": {"Content-Type": "application/json"},
        },
        400,
    ),
    "oversize body": ({"json": {"cmd": "x" * MAX_BODY}}, 413),
    "NaN timeout": (
        {
            "content": b'{"cmd": "true", "timeout_s": NaN}',
            "headers": {"Content-Type": "application/json"},
        },
        422,
    ),
}


@pytest.mark.parametrize("case", PASSED_ON)
def test_what_the_lane_does_not_understand_goes_to_the_full_stack(
    lane: Stack, sid: str, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    kw, status = PASSED_ON[case]
    passed = fastlane.stats.passed
    fast, full, served = _both(
        lane,
        monkeypatch,
        lambda rid: _post(lane.alice, f"/v1/sandboxes/{sid}/exec", rid, **dict(kw)),
    )
    assert served == 0 and fastlane.stats.passed == passed + 1
    assert fast.status_code == status, fast.text
    _same_answer(fast, full, result=status == 200)


@pytest.mark.parametrize("key", [None, "crk_nokey_secret", "garbage"])
def test_a_refused_key_is_the_same_401_and_audited_once_each_way(
    lane: Stack, sid: str, key: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = lane.make_client(key)
    seq = _head(lane)
    fast, full, served = _both(
        lane,
        monkeypatch,
        lambda rid: _post(client, f"/v1/sandboxes/{sid}/exec", rid, json={"cmd": "true"}),
    )
    assert served == 0 and fast.status_code == 401, fast.text
    _same_answer(fast, full)
    events = _events(lane, seq)
    assert [e.action for e in events] == ["auth.failed", "auth.failed"]
    assert events[0].details == events[1].details


def test_streaming_and_query_strings_go_to_the_full_stack(lane: Stack, sid: str) -> None:
    served = fastlane.stats.served
    r = lane.alice.post(
        f"/v1/sandboxes/{sid}/exec", params={"stream": "true"}, json={"cmd": "echo s"}
    )
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
    r = lane.alice.post(
        f"/v1/sandboxes/{sid}/exec", params={"stream": "false"}, json={"cmd": "true"}
    )
    assert r.status_code == 200 and r.json()["exit_code"] == 0
    assert fastlane.stats.served == served


def test_an_unexpected_error_is_the_same_500(
    lane: Stack, sid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from service import sandboxes

    async def broken(*_a: object, **_k: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(sandboxes, "exec_command_async", broken)
    key = lane.alice.headers["authorization"].split()[1]
    # a fresh connection each way: uvicorn closes one after an unhandled error
    fast, full, served = _both(
        lane,
        monkeypatch,
        lambda rid: _post(
            lane.make_client(key), f"/v1/sandboxes/{sid}/exec", rid, json={"cmd": "true"}
        ),
    )
    assert served == 1 and fast.status_code == 500, fast.text
    _same_answer(fast, full)


def test_the_lane_answers_only_once_the_event_is_durable(lane: Stack, sid: str) -> None:
    commits = lane.ctx.commits
    entered, release = threading.Event(), threading.Event()

    def hold(_s: Session) -> None:
        entered.set()
        release.wait(60)

    served = fastlane.stats.served
    seq = _head(lane)
    held = commits.submit(hold)  # the writer thread is busy: no commit can happen
    assert entered.wait(30)
    answer: list[httpx.Response] = []
    key = lane.alice.headers["authorization"].split()[1]
    t = threading.Thread(
        target=lambda: answer.append(
            lane.make_client(key).post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "echo held"})
        )
    )
    t.start()
    try:
        lane.wait_for(lambda: commits.pending >= 1, timeout_s=60)  # the command ran
        time.sleep(0.2)
        assert answer == []  # no answer while its event is not durable
    finally:
        release.set()
    held.result(30)
    t.join(60)
    assert answer[0].status_code == 200 and answer[0].json()["stdout"] == "held\n"
    assert fastlane.stats.served == served + 1
    events = _events(lane, seq, "sandbox.exec")
    assert [e.details["cmd"] for e in events] == ["echo held"]


def test_repeated_headers_and_other_json_spellings_go_to_the_full_stack(
    lane: Stack, sid: str
) -> None:
    key = lane.alice.headers["authorization"].split()[1]
    body = b'{"cmd": "echo x"}'
    for headers in (
        [("Authorization", f"Bearer {key}"), ("Authorization", f"Bearer {key}")],
        [("Idempotency-Key", "a"), ("Idempotency-Key", "b")],  # not read by exec: refused
        [("Content-Type", "application/json;charset=utf-8")],
        [("X-Request-ID", "a"), ("X-Request-ID", "b")],
    ):
        passed = fastlane.stats.passed
        with httpx.Client(base_url=lane.url) as c:
            base = [("Authorization", f"Bearer {key}"), ("Content-Type", "application/json")]
            names = {h[0] for h in headers}
            r = c.post(
                f"/v1/sandboxes/{sid}/exec",
                content=body,
                headers=[h for h in base if h[0] not in names] + headers,
            )
        assert fastlane.stats.passed == passed + 1, headers
        if headers[0][0] in ("Authorization", "Idempotency-Key"):  # one thing, twice: refused
            assert r.status_code == 400 and r.json()["field"] == headers[0][0], r.text
        else:
            assert r.status_code == 200, r.text


def test_an_implausible_request_id_is_replaced_both_ways(
    lane: Stack, sid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast, full, served = _both(
        lane,
        monkeypatch,
        lambda rid: _post(
            lane.alice, f"/v1/sandboxes/{sid}/exec", "bad id " + rid, json={"cmd": "true"}
        ),
    )
    assert served == 1
    for r in (fast, full):
        assert re.fullmatch(r"[0-9a-f]{16}", r.headers["x-request-id"]), r.headers


def test_a_chunked_body_goes_to_the_full_stack(
    lane: Stack, sid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def chunked(rid: str) -> httpx.Response:
        parts = iter([b'{"cmd": ', b'"echo chunked"}'])  # no Content-Length: chunked
        return _post(
            lane.alice,
            f"/v1/sandboxes/{sid}/exec",
            rid,
            content=parts,
            headers={"Content-Type": "application/json"},
        )

    passed = fastlane.stats.passed
    fast, full, served = _both(lane, monkeypatch, chunked)
    assert served == 0 and fastlane.stats.passed == passed + 1
    assert fast.status_code == 200 and fast.json()["stdout"] == "chunked\n", fast.text
    _same_answer(fast, full, result=True)
