"""The OpenAPI document declares every error each route returns, as problem+json (issue 11):
a walk over ``/openapi.json`` sends each operation the requests that fail in every generic
way (no key, a key without the admin scope, unknown ids, missing or malformed parameters and
bodies, a body over the limit) and checks that the status it gets is declared."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.integration.api.conftest import Stack, start_stack
from tests.integration.api.test_sandboxes_api import PROBLEM, lease

pytestmark = pytest.mark.docker

PROBLEM_SCHEMA = {"schema": {"$ref": "#/components/schemas/Problem"}}
NOT_PROBLEM = {"/readyz"}  # its 503 is the readiness report itself


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from start_stack(tmp_path_factory.mktemp("openapi"), max_body_bytes=4096)


@pytest.fixture(scope="module")
def doc(stack: Stack) -> dict[str, Any]:
    r = stack.alice.get("/openapi.json")
    assert r.status_code == 200
    return r.json()


def _operations(doc: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            yield path, method.upper(), op


def test_every_error_response_is_declared_as_problem_json(doc: dict[str, Any]) -> None:
    assert "Problem" in doc["components"]["schemas"]
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    n = 0
    for path, method, op in _operations(doc):
        for status, response in op["responses"].items():
            if int(status) >= 400 and path not in NOT_PROBLEM:
                assert response["content"] == {PROBLEM: PROBLEM_SCHEMA}, (method, path, status)
                assert response["description"]
                n += 1
    assert n > 100


def _requests(
    stack: Stack, path: str, method: str, op: dict[str, Any], live_sandbox: str
) -> Iterator[tuple[str, httpx.Response]]:
    """The generic failing requests for one operation, with what each tried."""
    query = {
        p["name"]: "x" for p in op.get("parameters", []) if p["in"] == "query" and p.get("required")
    }
    takes_body = "requestBody" in op
    anonymous = stack.make_client()
    for ids in ("nope", live_sandbox):
        url = re.sub(r"\{[^}]+\}", ids, path)
        yield "no key", anonymous.request(method, url, params=query)
        yield (
            "bad key",
            anonymous.request(
                method, url, params=query, headers={"authorization": "Bearer cr_x_y"}
            ),
        )
        for client in (stack.alice, stack.admin):
            yield "as given", client.request(method, url, params=query)
            if query:
                yield "no query", client.request(method, url)
                yield (
                    "bad query",
                    client.request(method, url, params={k: "\x00" * 5000 for k in query}),
                )
            if takes_body:
                for what, body in (
                    ("empty object", b"{}"),
                    ("malformed JSON", b'{"a": '),
                    ("not UTF-8", b'{"a": "\xff"}'),
                    ("too deep", b"[" * 200 + b"]" * 200),
                    ("too large", b'{"a": "' + b"x" * 5000 + b'"}'),
                ):
                    yield (
                        what,
                        client.request(
                            method,
                            url,
                            params=query,
                            content=body,
                            headers={"content-type": "application/json"},
                        ),
                    )


def test_each_route_returns_only_declared_statuses(stack: Stack, doc: dict[str, Any]) -> None:
    sid = lease(stack.alice, "tiny")["id"]
    seen: set[int] = set()
    undeclared = []
    for path, method, op in _operations(doc):
        if path == "/v1/sandboxes/{sandbox_id}" and method == "DELETE":
            continue  # would release the live sandbox the other operations use
        for what, r in _requests(stack, path, method, op, sid):
            seen.add(r.status_code)
            if str(r.status_code) not in op["responses"]:
                undeclared.append(f"{method} {path} ({what}): {r.status_code} {r.text[:200]}")
            if r.status_code >= 400 and path not in NOT_PROBLEM:
                assert r.headers["content-type"].startswith(PROBLEM), (method, path, what)
            assert r.status_code < 500, f"{method} {path} ({what}): {r.text[:300]}"
    stack.alice.delete(f"/v1/sandboxes/{sid}")
    assert not undeclared, "\n".join(undeclared)
    assert {400, 401, 403, 404, 413, 422} <= seen
