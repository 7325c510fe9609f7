"""Parity of the fast lane's lease route (``POST /v1/sandboxes``) with the full stack.

As ``test_exec_lane.py``: every request is sent twice over real HTTP to one real control
plane, first with the lane on and then with ``fast_lane`` off (routing, dependencies,
``IdempotencyMiddleware`` and every other middleware: the reference), with the same
``X-Request-ID``; status, body (a lease's less its id and times), the headers that matter
and the audit events must match, and the lane must have served exactly the requests it
claims and passed every other one on (an ``Idempotency-Key`` among them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from service import audit, tenants
from service.api import fastlane
from service.db.models import Sandbox
from service.metrics import HTTP_REQUESTS
from tests.integration.api.conftest import Stack, start_stack
from tests.integration.api.test_exec_lane import (
    COMPARED,
    _both,
    _events,
    _head,
    _post,
    _same_answer,
    assert_same_429,
)

pytestmark = pytest.mark.docker

MAX_BODY = 4096
PATH = "/v1/sandboxes"
TIMES = ("created_at", "leased_at", "expires_at")


@pytest.fixture(scope="module")
def lane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from start_stack(
        tmp_path_factory.mktemp("lease-lane"),
        max_body_bytes=MAX_BODY,
        pool_targets={"terminal": 2},
        rate_limits={"erin": {"rps": 0.001, "burst": 1}},
    )


def _warm(lane: Stack, n: int = 1) -> None:
    """Wait until ``n`` terminal sandboxes are warm (each way leases warm, not cold)."""

    def ready() -> bool:
        with lane.ctx.db.read() as s:
            q = select(func.count()).where(Sandbox.template == "terminal", Sandbox.state == "warm")
            return (s.scalar(q) or 0) >= n

    lane.wait_for(ready, timeout_s=120)


def _lease(
    lane: Stack, client: httpx.Client, body: Any, **kw: Any
) -> Callable[[str], httpx.Response]:
    def send(rid: str) -> httpx.Response:
        _warm(lane)
        return _post(client, PATH, rid, json=body, **kw)

    return send


GOOD = [
    {"template": "terminal"},
    {"template": "terminal", "ttl_s": 120, "metadata": {"run": "r1", "step": 3, "ok": True}},
    {"template": "terminal", "limits": {"cpus": 0.5, "memory_mb": 256}, "metadata": {"x": 1.5}},
]


@pytest.mark.parametrize("body", GOOD, ids=range(len(GOOD)))
def test_a_good_lease_answers_and_audits_the_same(
    lane: Stack, body: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    created = HTTP_REQUESTS.labels("POST", PATH, "201")._value.get()
    seq = _head(lane)
    fast, full, served = _both(lane, monkeypatch, _lease(lane, lane.alice, body))
    assert served == 1
    assert fast.status_code == full.status_code == 201, (fast.text, full.text)
    a, b = fast.json(), full.json()
    ids = (a.pop("id"), b.pop("id"))
    for k in TIMES:
        assert (a.pop(k) is None) == (b.pop(k) is None), k
    assert a == b and a["state"] == "leased"
    assert fast.headers["content-type"] == full.headers["content-type"] == "application/json"
    assert (fast.headers["x-request-id"], full.headers["x-request-id"]) == (
        "parity-lane",
        "parity-full",
    )
    assert HTTP_REQUESTS.labels("POST", PATH, "201")._value.get() == created + 2
    events = _events(lane, seq, "sandbox.lease")
    assert [e.sandbox_id for e in events] == list(ids)
    assert events[0].details == events[1].details and events[0].details["warm"] is True
    assert {(e.tenant_id, e.key_id) for e in events} == {(events[0].tenant_id, events[0].key_id)}
    assert audit.verify_chain(lane.ctx.db).first_broken_seq is None
    for sid in ids:
        assert lane.alice.delete(f"{PATH}/{sid}").status_code == 200


SERVICE_ERRORS = {
    "unknown template": ({"template": "no-such-template"}, 404),
    "ttl over the maximum": ({"template": "terminal", "ttl_s": 10**9}, 400),
    "more CPUs than the host": ({"template": "terminal", "limits": {"cpus": 64}}, 400),
}


@pytest.mark.parametrize("case", SERVICE_ERRORS)
def test_a_service_error_is_the_same_problem(
    lane: Stack, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    body, status = SERVICE_ERRORS[case]
    seq = _head(lane)
    fast, full, served = _both(
        lane, monkeypatch, lambda rid: _post(lane.alice, PATH, rid, json=body)
    )
    assert served == 1 and fast.status_code == status, fast.text
    _same_answer(fast, full)
    assert [e.action for e in _events(lane, seq) if e.action == "sandbox.lease"] == []


def test_over_quota_is_the_same_429_with_retry_after_audited_each_way(
    lane: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    with lane.ctx.db.session() as s:
        tenants.create_tenant(s, "dave", max_sandboxes=1, max_cpus=8, max_memory_mb=1 << 14)
        key = tenants.create_key(s, "dave", scopes=set())
    dave = lane.make_client(key)
    _warm(lane)
    held = dave.post(PATH, json={"template": "terminal"})
    assert held.status_code == 201, held.text
    seq = _head(lane)
    fast, full, served = _both(
        lane, monkeypatch, lambda rid: _post(dave, PATH, rid, json={"template": "terminal"})
    )
    assert served == 1 and fast.status_code == 429, fast.text
    _same_answer(fast, full)
    assert fast.headers["retry-after"] == full.headers["retry-after"]
    events = _events(lane, seq)
    assert [e.action for e in events] == ["quota.refused", "quota.refused"]
    assert events[0].details == events[1].details
    assert dave.delete(f"{PATH}/{held.json()['id']}").status_code == 200


def test_the_rate_limit_is_the_same_429(lane: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    with lane.ctx.db.session() as s:
        tenants.create_tenant(s, "erin", max_sandboxes=1, max_cpus=1, max_memory_mb=1024)
        key = tenants.create_key(s, "erin", scopes=set())
    erin = lane.make_client(key)
    # the one token of erin's bucket: the lane counts it as the full stack would
    first = _post(erin, PATH, "parity-first", json={"template": "no-such-template"})
    assert first.status_code == 404, first.text
    seq = _head(lane)
    fast, full, served = _both(
        lane, monkeypatch, lambda rid: _post(erin, PATH, rid, json={"template": "terminal"})
    )
    assert_same_429(fast, full, served)
    assert _events(lane, seq, "sandbox.lease") == []


PASSED_ON: dict[str, tuple[dict[str, Any], int]] = {
    "unknown field": ({"json": {"template": "terminal", "image": "alpine"}}, 422),
    "missing template": ({"json": {"ttl_s": 5}}, 422),
    "ttl_s zero": ({"json": {"template": "terminal", "ttl_s": 0}}, 422),
    "ttl_s not an int": ({"json": {"template": "terminal", "ttl_s": "soon"}}, 422),
    "limits below the schema": (
        {"json": {"template": "terminal", "limits": {"memory_mb": 8}}},
        422,
    ),
    "limits unknown field": ({"json": {"template": "terminal", "limits": {"gpus": 1}}}, 422),
    "reserved metadata key": (
        {"json": {"template": "terminal", "metadata": {"episode_role": "x"}}},
        422,
    ),
    "not an object": ({"json": ["terminal"]}, 422),
    "malformed JSON": (
        {"content": b'{"template": ', "headers": {"Content-Type": "application/json"}},
        400,
    ),
    "empty body": ({"content": b"", "headers": {"Content-Type": "application/json"}}, 422),
    "text/plain": (
        {"content": b'{"template": "terminal"}', "headers": {"Content-Type": "text/plain"}},
        422,
    ),
    "no content type": ({"content": b'{"template": "nope"}'}, 422),
    "not UTF-8": (
        {"content": b'{"template": "\xff"}', "headers": {"Content-Type": "application/json"}},
        400,
    ),
    "nested too deep": (
        {
            "content": b'{"template": "t", "metadata": ' + b"[" * 70 + b"]" * 70 + b"}",
            "headers": {"Content-Type": "application/json"},
        },
        400,
    ),
    "oversize body": ({"json": {"template": "terminal", "metadata": {"x": "y" * MAX_BODY}}}, 413),
}


@pytest.mark.parametrize("case", PASSED_ON)
def test_what_the_lane_does_not_understand_goes_to_the_full_stack(
    lane: Stack, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    kw, status = PASSED_ON[case]
    passed = fastlane.stats.passed
    seq = _head(lane)
    fast, full, served = _both(
        lane, monkeypatch, lambda rid: _post(lane.alice, PATH, rid, **dict(kw))
    )
    assert served == 0 and fastlane.stats.passed == passed + 1
    assert fast.status_code == status, fast.text
    _same_answer(fast, full)
    assert _events(lane, seq) == []


@pytest.mark.parametrize("key", [None, "crk_nokey_secret", "garbage"])
def test_a_refused_key_is_the_same_401_and_audited_once_each_way(
    lane: Stack, key: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = lane.make_client(key)
    seq = _head(lane)
    fast, full, served = _both(
        lane, monkeypatch, lambda rid: _post(client, PATH, rid, json={"template": "terminal"})
    )
    assert served == 0 and fast.status_code == 401, fast.text
    _same_answer(fast, full)
    events = _events(lane, seq)
    assert [e.action for e in events] == ["auth.failed", "auth.failed"]
    assert events[0].details == events[1].details


def test_an_idempotency_key_goes_to_the_full_stack_and_replays_the_same(
    lane: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A keyed lease is the ``IdempotencyMiddleware``'s: the lane passes it on, both ways
    answer the first request, the replay (the stored answer) and a reused key the same."""
    answers: dict[str, list[httpx.Response]] = {}

    def keyed(rid: str) -> httpx.Response:
        key = {"Idempotency-Key": f"lease-{rid}"}
        _warm(lane)
        first = _post(lane.alice, PATH, rid, json={"template": "terminal"}, headers=key)
        again = _post(lane.alice, PATH, rid, json={"template": "terminal"}, headers=key)
        other = _post(lane.alice, PATH, rid, json={"template": "tiny"}, headers=key)
        bad = _post(
            lane.alice,
            PATH,
            rid,
            json={"template": "terminal"},
            headers={"Idempotency-Key": "has space"},
        )
        answers[rid] = [first, again, other, bad]
        return first

    passed = fastlane.stats.passed
    seq = _head(lane)
    fast, full, served = _both(lane, monkeypatch, keyed)
    assert served == 0 and fastlane.stats.passed == passed + 4
    lane_answers, full_answers = answers["parity-lane"], answers["parity-full"]
    assert [r.status_code for r in lane_answers] == [r.status_code for r in full_answers]
    assert [r.status_code for r in lane_answers] == [201, 201, 422, 400]
    for first, again in (lane_answers[:2], full_answers[:2]):
        assert again.content == first.content
        assert again.headers.get("idempotent-replayed") == "true"
        assert "idempotent-replayed" not in first.headers
    for a, b in zip(lane_answers[2:], full_answers[2:], strict=True):
        assert a.content == b.content.replace(b"parity-full", b"parity-lane")
        for h in COMPARED:
            assert (h in a.headers) == (h in b.headers), h
    leases = _events(lane, seq, "sandbox.lease")
    assert [e.sandbox_id for e in leases] == [fast.json()["id"], full.json()["id"]]
    for r in (fast, full):
        assert lane.alice.delete(f"{PATH}/{r.json()['id']}").status_code == 200


def test_an_idempotency_key_header_in_any_case_is_passed_on(lane: Stack) -> None:
    key = lane.alice.headers["authorization"].split()[1]
    passed, served = fastlane.stats.passed, fastlane.stats.served
    _warm(lane)
    # httpx sends header names as given; uvicorn lowercases them for ASGI
    with httpx.Client(base_url=lane.url) as c:
        r = c.post(
            PATH,
            content=b'{"template": "terminal"}',
            headers=[
                ("Authorization", f"Bearer {key}"),
                ("Content-Type", "application/json"),
                ("IDEMPOTENCY-KEY", "upper-case-key"),
            ],
        )
    assert r.status_code == 201, r.text
    assert fastlane.stats.passed == passed + 1 and fastlane.stats.served == served
    assert lane.alice.delete(f"{PATH}/{r.json()['id']}").status_code == 200


def test_a_query_string_or_another_path_goes_to_the_full_stack(lane: Stack) -> None:
    served = fastlane.stats.served
    r = lane.alice.post(PATH, params={"x": "1"}, json={"template": "no-such-template"})
    assert r.status_code == 404
    r = lane.alice.post(PATH + "/", json={"template": "no-such-template"})
    assert r.status_code in (404, 405, 307)
    assert lane.alice.get(PATH).status_code == 200
    assert fastlane.stats.served == served
