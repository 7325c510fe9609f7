"""``Client`` / ``AsyncClient`` over ``httpx.MockTransport``: explicit typed methods, what is
retried, and the problem+json -> exception mapping (every ``policy_client.errors`` class)."""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime

import httpx
import pytest

from policy_client import errors
from policy_client.client import AsyncClient, Client
from policy_client.schemas import JobOut, RewardRecord, WorkItemOut
from service import errors as service_errors

NOW = datetime(2026, 1, 1, tzinfo=UTC).isoformat()
JOB = {
    "id": "job_1",
    "suite": "terminal",
    "task_ids": ["a", "b"],
    "group_size": 2,
    "priority": 0,
    "policy": {"name": "p", "version": "1"},
    "max_attempts": 3,
    "state": "queued",
    "created_at": NOW,
    "finished_at": None,
    "progress": {"items": {"queued": 2}},
}
ITEM = {
    "id": "wi_1",
    "job_id": "job_1",
    "task_id": "a",
    "group_id": "grp_1",
    "state": "claimed",
    "attempts": 1,
    "claim_expires_at": NOW,
    "last_error": None,
    "created_at": NOW,
    "group_size": 2,
    "suite": "terminal",
    "policy": {"name": "p", "version": "1"},
}
RECORD = {
    "episode_id": "ep_1",
    "group_id": "grp_1",
    "sample_idx": 0,
    "task_id": "a",
    "task_version": "1",
    "suite": "terminal",
    "domain": "terminal",
    "template": "terminal",
    "image_digest": "sha256:x",
    "policy": {"name": "p", "version": "1"},
    "reward": 1.0,
    "verifier": {"name": "terminal", "version": "1", "status": "ok"},
    "stop_reason": "complete",
    "sandbox_id": "sb_1",
}


def _problem(status: int, title: str = "t", detail: str = "d") -> httpx.Response:
    return httpx.Response(
        status,
        json={"type": "about:blank", "title": title, "status": status, "detail": detail},
        headers={"content-type": "application/problem+json", "retry-after": "7"},
    )


class Recorder:
    """A MockTransport handler: answers from ``routes`` and records every request."""

    def __init__(self, routes: dict[tuple[str, str], Callable[[httpx.Request], httpx.Response]]):
        self.routes, self.requests = routes, []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        handler = self.routes.get((request.method, request.url.path))
        return handler(request) if handler else _problem(404, "Not found", "no route")


def _sync(handler: Recorder) -> Client:
    return Client(
        "http://crucible.test", "k", transport=httpx.MockTransport(handler), backoff_s=0, retries=3
    )


def _async(handler: Recorder) -> AsyncClient:
    return AsyncClient(
        "http://crucible.test", "k", transport=httpx.MockTransport(handler), backoff_s=0, retries=3
    )


def test_typed_methods_send_the_right_requests() -> None:
    rec = Recorder(
        {
            ("POST", "/v1/jobs"): lambda r: httpx.Response(201, json=JOB),
            ("GET", "/v1/jobs/job_1"): lambda r: httpx.Response(200, json=JOB),
            ("POST", "/v1/jobs/job_1/claim"): lambda r: httpx.Response(204),
            ("POST", "/v1/work-items/wi_1/complete"): lambda r: httpx.Response(200, json=ITEM),
            ("POST", "/v1/episodes/ep_1/verify"): lambda r: httpx.Response(
                200, json={**RECORD, **{"stop_reason": json.loads(r.content)["stop_reason"]}}
            ),
            ("GET", "/v1/rewards"): lambda r: httpx.Response(
                200, json={"records": [RECORD], "next_after": None}
            ),
            ("GET", "/v1/rewards/export"): lambda r: httpx.Response(200, content=b"{}\n"),
        }
    )
    with _sync(rec) as client:
        job = client.create_job(suite="terminal", policy={"name": "p", "version": "1"})
        assert isinstance(job, JobOut) and job.id == "job_1"
        assert isinstance(client.get_job("job_1"), JobOut)
        assert client.claim("job_1", worker="w") is None  # 204: nothing to claim
        item = client.complete("wi_1", worker="w", ok=False, error="boom")
        assert isinstance(item, WorkItemOut)
        record = client.verify(
            "ep_1", {"policy": {"name": "p", "version": "1"}, "stop_reason": "max_turns"}
        )
        assert isinstance(record, RewardRecord) and record.stop_reason == "max_turns"
        page = client.list_records(job_id="job_1", limit=5)
        assert page.records[0].episode_id == "ep_1" and page.next_after is None
        assert client.export_records(fmt="jsonl", job_id="job_1", normalize="grpo") == b"{}\n"
    bodies = {(r.method, r.url.path): r for r in rec.requests}
    assert json.loads(bodies["POST", "/v1/jobs"].content) == {
        "suite": "terminal",
        "policy": {"name": "p", "version": "1"},
        "group_size": 1,
        "priority": 0,
        "max_attempts": 3,
    }
    assert json.loads(bodies["POST", "/v1/work-items/wi_1/complete"].content) == {
        "worker": "w",
        "ok": False,
        "error": "boom",
        "cause": "policy",
    }
    assert dict(bodies["GET", "/v1/rewards"].url.params) == {"job_id": "job_1", "limit": "5"}
    assert dict(bodies["GET", "/v1/rewards/export"].url.params) == {
        "format": "jsonl",
        "normalize": "grpo",
        "job_id": "job_1",
    }
    assert all(r.headers["authorization"] == "Bearer k" for r in rec.requests)


def test_async_client_has_the_same_typed_methods() -> None:
    rec = Recorder({("GET", "/v1/jobs/job_1"): lambda r: httpx.Response(200, json=JOB)})

    async def go() -> JobOut:
        async with _async(rec) as client:
            return await client.get_job("job_1")

    assert asyncio.run(go()).id == "job_1"
    public = {
        n
        for n, f in inspect.getmembers(Client, inspect.isfunction)
        if not n.startswith("_") and n not in ("close", "run")
    }
    apublic = {
        n
        for n, f in inspect.getmembers(AsyncClient, inspect.isfunction)
        if not n.startswith("_") and n not in ("aclose", "run")
    }
    assert public == apublic
    for name in public:
        sync_params = inspect.signature(getattr(Client, name)).parameters
        async_params = inspect.signature(getattr(AsyncClient, name)).parameters
        assert list(sync_params) == list(async_params), name
        if name == "exec_stream":
            assert inspect.isasyncgenfunction(AsyncClient.exec_stream)
        elif name != "sandbox":
            assert inspect.iscoroutinefunction(getattr(AsyncClient, name)), name


def test_no_dynamic_dispatch() -> None:
    with _sync(Recorder({})) as client, pytest.raises(AttributeError):
        client.no_such_call()  # type: ignore[attr-defined]
    assert "__getattr__" not in vars(Client) and "__getattr__" not in vars(AsyncClient)


def test_only_idempotent_calls_are_retried() -> None:
    rec = Recorder(
        {
            ("GET", "/v1/jobs/job_1"): lambda r: _problem(503, "No capacity"),
            ("POST", "/v1/sandboxes/sb_1/exec"): lambda r: _problem(503, "No capacity"),
        }
    )
    with _sync(rec) as client:
        with pytest.raises(errors.ServerError) as e:
            client.get_job("job_1")
        assert e.value.status == 503
        assert len(rec.requests) == 4  # 1 + 3 retries
        rec.requests.clear()
        with pytest.raises(errors.ServerError):
            client.exec("sb_1", "echo hi")
        assert len(rec.requests) == 1  # never retried: a command would run twice


def test_keyed_calls_carry_one_idempotency_key_across_retries() -> None:
    answers = iter([_problem(503, "Restarting"), _problem(502, "Bad gateway")])

    def flaky(request: httpx.Request) -> httpx.Response:
        return next(answers, httpx.Response(204))

    rec = Recorder({("POST", "/v1/jobs/job_1/claim"): flaky})
    with _sync(rec) as client:
        assert client.claim("job_1", worker="w") is None
        again = client.claim("job_1", worker="w")
    assert again is None
    keys = [r.headers.get("idempotency-key") for r in rec.requests]
    assert len(keys) == 4 and keys[0] and keys[0] == keys[1] == keys[2] != keys[3]


def test_retries_stop_at_the_deadline() -> None:
    calls = []

    def down(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        raise httpx.ConnectError("refused", request=request)

    client = Client(
        "http://x", transport=httpx.MockTransport(down), backoff_s=0.05, retry_deadline_s=0.5
    )
    t0 = time.monotonic()
    with pytest.raises(errors.TransportError):
        client.get_job("job_1")
    elapsed = time.monotonic() - t0
    client.close()
    assert 0.3 <= elapsed <= 1.5 and len(calls) >= 4


def test_transport_failures_after_retries() -> None:
    calls = []

    def down(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        raise httpx.ConnectError("refused", request=request)

    with _sync(Recorder({})) as client:
        client._http = httpx.Client(base_url="http://x", transport=httpx.MockTransport(down))
        with pytest.raises(errors.TransportError) as e:
            client.get_job("job_1")
    assert isinstance(e.value.__cause__, httpx.ConnectError)
    assert len(calls) == 4


# --------------------------------------------------------------------------- error mapping

# Every class in policy_client.errors and a response (or failure) that must produce it.
PRODUCERS: dict[type[errors.ClientError], Callable[[], httpx.Response | Exception]] = {
    errors.BadRequest: lambda: _problem(422),
    errors.Unauthorized: lambda: _problem(401),
    errors.NotFoundError: lambda: _problem(404),
    errors.ConflictError: lambda: _problem(409),
    errors.QuotaError: lambda: _problem(429),
    errors.ServerError: lambda: _problem(502),
    errors.APIError: lambda: _problem(418),
    errors.TransportError: lambda: httpx.ReadTimeout("slow"),
    errors.PathOutsideRoot: lambda: _problem(400, "Path outside the allowed root"),
    errors.QuotaNeverFits: lambda: _problem(400, "Request exceeds the quota"),
    errors.PayloadTooLarge: lambda: _problem(413, "Payload too large"),
    errors.TaskFormatError: lambda: _problem(422, "Malformed task"),
    errors.Forbidden: lambda: _problem(403, "Forbidden"),
    errors.SandboxError: lambda: _problem(502, "Sandbox runtime error"),
    errors.CapacityError: lambda: _problem(503, "No capacity"),
    errors.VerifierError: lambda: _problem(502, "Verifier error"),
    errors.SandboxStopped: lambda: _problem(409, "Sandbox not running"),
}


def _raised(answer: httpx.Response | Exception) -> errors.ClientError:
    def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(answer, Exception):
            raise answer
        return answer

    client = Client("http://x", transport=httpx.MockTransport(handler), retries=0)
    try:
        client.get_job("job_1")
    except errors.ClientError as e:
        return e
    finally:
        client.close()
    raise AssertionError("no error raised")


def test_every_error_class_is_mapped() -> None:
    classes = {
        c
        for c in vars(errors).values()
        if isinstance(c, type) and issubclass(c, errors.ClientError) and c is not errors.ClientError
    }
    assert classes == set(PRODUCERS), f"unmapped: {classes ^ set(PRODUCERS)}"
    for cls, produce in PRODUCERS.items():
        assert type(_raised(produce())) is cls, cls


def test_every_service_error_maps_to_a_specific_class() -> None:
    """Each status the service answers with reaches the client as a specific class."""
    for exc in vars(service_errors).values():
        if not (isinstance(exc, type) and issubclass(exc, service_errors.CrucibleError)):
            continue
        err = _raised(_problem(exc.status, exc.title, "x"))
        assert type(err) is not errors.APIError, f"{exc.__name__} ({exc.status}) is unmapped"
        assert err.status == exc.status and err.title == exc.title
        same = getattr(errors, exc.__name__, None)  # a typed class per problem where named alike
        if same is not None:
            assert type(err) is same, exc.__name__


def test_problem_fields_and_retry_after() -> None:
    err = _raised(
        httpx.Response(
            429,
            json={"title": "Quota exceeded", "status": 429, "detail": "d", "field": "template"},
            headers={"retry-after": "7"},
        )
    )
    assert isinstance(err, errors.QuotaError)
    assert err.retry_after_s == 7.0 and err.field == "template" and err.detail == "d"
    plain = _raised(httpx.Response(500, text="not json"))
    assert isinstance(plain, errors.ServerError) and "not json" in plain.detail


def test_an_absent_server_is_named_and_the_wait_is_said(caplog: pytest.LogCaptureFixture) -> None:
    # A new-user trial: with no server at CRUCIBLE_URL a GET waited the whole retry deadline
    # (90 s) in silence, then said only "[Errno 111] Connection refused".
    import socket

    with socket.socket() as s:  # a port nothing listens on (bound, never listened)
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        with caplog.at_level("WARNING", logger="policy_client.client"):
            client = Client(url, "k", backoff_s=0.05, retry_deadline_s=0.3)
            with pytest.raises(errors.TransportError) as e:
                client.get_job("job_1")
            client.close()
    assert (
        url in str(e.value) and "crucible serve" in str(e.value) and "CRUCIBLE_URL" in str(e.value)
    )
    assert any("cannot reach" in r.getMessage() and url in r.getMessage() for r in caplog.records)
