"""Schema fuzzing (schemathesis) against the real server: uvicorn on a free port, the real app
and Docker runtime, a tenant with a small quota. Every operation, positive and negative
cases, four checks: no server error, a declared status code, a declared content type, a
response that matches its schema. At least 10,000 requests in all.

Bounded to run in minutes on 2 cores: exec timeouts are capped at 2 s, the tenant may hold 2
sandboxes and 3 snapshots, and a third of the cases address a live sandbox or snapshot of
the tenant's (so the routes' deeper paths run, not only their 404s). Everything runs in this
module's own deployment, removed at the end.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from service import tenants
from tests.integration.api.conftest import Stack, start_stack

pytestmark = [pytest.mark.docker, pytest.mark.fuzz]

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
# CRUCIBLE_FUZZ_EXAMPLES lowers both for a quick local look; CI runs the defaults.
EXAMPLES_PER_OPERATION = int(os.environ.get("CRUCIBLE_FUZZ_EXAMPLES", "240"))
MIN_REQUESTS = 10_000 if EXAMPLES_PER_OPERATION >= 240 else 0


@dataclass
class Target:
    """The fuzzed server: its URL, the tenant's key, live ids to aim cases at."""

    url: str
    key: str
    ids: dict[str, str]
    requests: int = 0


_AIM = itertools.cycle((True, False, False))


@pytest.fixture(scope="module")
def fuzz_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from start_stack(
        tmp_path_factory.mktemp("fuzz"),
        pool_targets={"tiny": 1},
        max_exec_timeout_s=2,
        max_ttl_s=600,
        max_fork_n=4,
    )


@pytest.fixture(scope="module")
def target(fuzz_stack: Stack) -> Target:
    with fuzz_stack.ctx.db.session() as s:
        tenants.create_tenant(
            s,
            "fuzz",
            max_sandboxes=2,
            max_cpus=2,
            max_memory_mb=1024,
            max_snapshots=3,
            max_snapshot_bytes=64 << 20,
        )
        key = tenants.create_key(s, "fuzz")
    client = fuzz_stack.make_client(key)
    sandbox = client.post("/v1/sandboxes", json={"template": "tiny", "ttl_s": 600})
    assert sandbox.status_code == 201, sandbox.text
    sid = sandbox.json()["id"]
    snap = client.post(f"/v1/sandboxes/{sid}/snapshots")
    assert snap.status_code == 201, snap.text
    found = Target(
        url=fuzz_stack.url, key=key, ids={"sandbox_id": sid, "snapshot_id": snap.json()["id"]}
    )
    return found


@pytest.fixture(scope="module")
def fuzz_schema(fuzz_stack: Stack) -> Any:
    doc = fuzz_stack.make_client().get("/openapi.json").json()
    return schemathesis.openapi.from_dict(doc)


def _fuzz(target: Target, operation: Any, mode: GenerationMode, failures: dict[str, str]) -> None:
    """Send ``EXAMPLES_PER_OPERATION`` cases of ``operation`` in ``mode``; record, never
    raise, what a check finds (raising would make hypothesis shrink, and stop the run)."""

    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: schemathesis.Case) -> None:
        params = case.path_parameters or {}
        if next(_AIM) and not (case.method == "DELETE" and "sandbox_id" in params):
            for name in set(params) & set(target.ids):
                params[name] = target.ids[name]
        target.requests += 1
        try:
            response = case.call(
                base_url=target.url, headers={"Authorization": f"Bearer {target.key}"}, timeout=30
            )
            case.validate_response(response, checks=CHECKS)
        except (Exception, FailureGroup) as e:  # noqa: BLE001 - recorded; the test fails on it
            found = e.exceptions if isinstance(e, FailureGroup) else [e]
            for sub in found:
                what = str(sub).strip().splitlines()
                key = f"{case.method} {operation.path} [{mode}] {type(sub).__name__}"
                example = f"{case.path_parameters} {case.query} {str(case.body)[:200]}"
                failures.setdefault(key, f"{key}: {' | '.join(what[:4])[:300]} <- {example}")

    try:
        run()
    except Unsatisfiable:
        assert mode == GenerationMode.NEGATIVE  # nothing in it can be wrong (no parameters)


@pytest.mark.timeout(1500)
def test_fuzz_api(target: Target, fuzz_schema: Any) -> None:
    failures: dict[str, str] = {}  # one example per operation, mode and kind of failure
    operations = [result.ok() for result in fuzz_schema.get_all_operations()]
    assert len(operations) >= 34
    t0 = time.monotonic()
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            before = target.requests
            _fuzz(target, operation, mode, failures)
            print(
                f"{operation.method.upper()} {operation.path} [{mode}]: {target.requests - before}"
            )
    print(f"fuzz: {target.requests} requests in {time.monotonic() - t0:.0f} s")
    assert not failures, f"{len(failures)} kinds of failure:\n" + "\n".join(failures.values())
    assert target.requests >= MIN_REQUESTS, target.requests
