"""Exec through the API (issue 10): a dropped streaming exec stops its command within a
second, and the exec result and the audit say when the pids limit was hit, on SQLite and on
PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from sqlalchemy import select

from service.db.models import AuditEvent
from tests.integration.api.conftest import Stack, start_stack
from tests.integration.api.test_sandboxes_api import lease, run

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def stack(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Stack]:
    yield from start_stack(tmp_path_factory.mktemp("exec-limits"), db_kind=request.param)


def _exec_audits(stack: Stack, sandbox_id: str) -> list[dict]:
    with stack.ctx.db.read() as s:
        rows = s.execute(
            select(AuditEvent.details)
            .where(AuditEvent.action == "sandbox.exec", AuditEvent.sandbox_id == sandbox_id)
            .order_by(AuditEvent.seq)
        ).all()
    return [r[0] for r in rows]


def test_a_dropped_stream_stops_its_command_within_a_second(stack: Stack) -> None:
    sid = lease(stack.alice)["id"]
    with stack.alice.stream(
        "POST",
        f"/v1/sandboxes/{sid}/exec",
        params={"stream": "true"},
        json={"cmd": "echo started; sleep 30; true", "timeout_s": 120},
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if "started" in line:
                break
    t0 = time.monotonic()  # leaving the block closed the connection

    def gone() -> bool:
        return run(stack.alice, sid, "pgrep -x sleep || true")["stdout"] == ""

    stack.wait_for(gone, timeout_s=1.0)
    took_s = time.monotonic() - t0
    assert took_s < 1.0, took_s
    stack.wait_for(lambda: any(d.get("cancelled") for d in _exec_audits(stack, sid)), 5.0)
    cancelled = next(d for d in _exec_audits(stack, sid) if d.get("cancelled"))
    assert cancelled["cmd"].startswith("echo started") and cancelled["exit_code"] != 0
    stack.alice.delete(f"/v1/sandboxes/{sid}")


def test_fork_bomb_result_and_audit_say_the_pids_limit_was_hit(stack: Stack) -> None:
    sid = lease(stack.alice, template="tiny")["id"]  # pids_limit 64
    res = run(stack.alice, sid, ["bash", "-c", "b(){ b | b; }; b"], timeout_s=3)
    assert res["timed_out"] and res["pids_limit_hit"], res
    after = run(stack.alice, sid, "echo ok")
    assert (after["exit_code"], after["stdout"], after["pids_limit_hit"]) == (0, "ok\n", False)
    audits = _exec_audits(stack, sid)
    assert [d["pids_limit_hit"] for d in audits[-2:]] == [True, False], audits
    stack.alice.delete(f"/v1/sandboxes/{sid}")
