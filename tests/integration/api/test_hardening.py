"""Inputs that once made server errors (issue 11), through real HTTP and real Docker: each
is now a 4xx problem naming its field, and nothing is consumed or recorded on the way."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from urllib.parse import quote, unquote

import pytest
from sqlalchemy import select

from service.db.models import Sandbox, Tenant
from tests.integration.api.conftest import Stack, start_stack
from tests.integration.api.test_sandboxes_api import assert_problem, audit_actions, lease, run

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def stack(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Stack]:
    yield from start_stack(tmp_path_factory.mktemp("hardening"), db_kind=request.param)


@pytest.fixture
def sandbox(stack: Stack) -> str:
    sid = lease(stack.alice, ttl_s=300)["id"]
    yield sid
    stack.alice.delete(f"/v1/sandboxes/{sid}")


def test_audit_after_beyond_a_64_bit_seq_is_a_problem(stack: Stack) -> None:
    # Regression: after=2**63 was a 500 and a reset connection (seq is a signed 64-bit int).
    for after in (2**63, 2**64 + 5, 10**30):
        r = stack.alice.get("/v1/audit", params={"after": after})
        assert_problem(r, 422, "after")
    r = stack.alice.get("/v1/audit", params={"after": 2**63 - 1})
    assert r.status_code == 200 and r.json()["events"] == []
    # a time that overflows once converted to UTC
    r = stack.alice.get("/v1/audit", params={"since": "9999-12-31T23:59:59-23:00"})
    assert_problem(r, 400, "since")


@pytest.mark.parametrize("name", ["ünïcødé-文字.txt", "emoji-\U0001f600.bin", 'q"uote\\%.txt'])
def test_download_of_a_name_outside_latin1(stack: Stack, sandbox: str, name: str) -> None:
    # Regression: the X-Crucible-Path header could not be encoded (500), and the audit
    # recorded the download as done.
    path = f"/tmp/{name}"
    r = stack.alice.put(f"/v1/sandboxes/{sandbox}/files", params={"path": path}, content=b"hi")
    assert r.status_code == 200, r.text
    r = stack.alice.get(f"/v1/sandboxes/{sandbox}/files", params={"path": path})
    assert r.status_code == 200, r.text
    assert r.content == b"hi"
    assert unquote(r.headers["x-crucible-path"]) == path
    disposition = r.headers["content-disposition"]
    assert disposition.startswith('attachment; filename="')
    assert disposition.endswith(f"filename*=UTF-8''{quote(name.encode(), safe='')}")
    r = stack.alice.get(f"/v1/sandboxes/{sandbox}/files", params={"path": "/tmp"})
    assert r.status_code == 200 and "filename*=UTF-8''tmp.tar" in r.headers["content-disposition"]
    gets = [e for e in audit_actions(stack, sandbox) if e["action"] == "sandbox.file_get"]
    assert [e["details"]["path"] for e in gets] == [path, "/tmp"]


def test_a_failed_download_is_not_audited(stack: Stack, sandbox: str) -> None:
    for path in ("/tmp/missing", "/tmp/" + "a" * 256, "/proc/self/status"):
        r = stack.alice.get(f"/v1/sandboxes/{sandbox}/files", params={"path": path})
        assert r.status_code in (400, 404), r.text
    assert not [e for e in audit_actions(stack, sandbox) if e["action"] == "sandbox.file_get"]


@pytest.mark.parametrize(
    "path",
    [
        "/tmp/" + "a" * 256,  # one byte over NAME_MAX
        "/tmp/" + "é" * 128 + "/x",  # 256 bytes as UTF-8, in a directory component
        "/tmp/" + "/".join(["é" * 100] * 21),  # 2126 characters, but 4221 bytes as UTF-8
    ],
)
def test_names_too_long_for_the_kernel(stack: Stack, sandbox: str, path: str) -> None:
    # Regression: the download was a 502 while the same upload was a 400.
    r = stack.alice.get(f"/v1/sandboxes/{sandbox}/files", params={"path": path})
    assert_problem(r, 400, "path")
    r = stack.alice.put(f"/v1/sandboxes/{sandbox}/files", params={"path": path}, content=b"x")
    assert_problem(r, 400, "path")
    # 255 bytes is fine
    ok = "/tmp/" + "b" * 255
    assert stack.alice.put(f"/v1/sandboxes/{sandbox}/files", params={"path": ok}).status_code == 200


def test_writes_through_a_symlink_into_kernel_filesystems_are_refused(
    stack: Stack, sandbox: str
) -> None:
    # Regression: PUT /tmp/p/x with /tmp/p -> /proc reported success; the sandbox never saw it.
    run(
        stack.alice,
        sandbox,
        "ln -s /proc /tmp/p && ln -s /dev/shm /tmp/s && ln -s /sys/kernel /tmp/k && "
        "ln -s /dev/null /tmp/n && ln -s ../proc/self /workspace/rel",
    )
    for path in ("/tmp/p/x", "/tmp/s/x", "/tmp/k/x", "/tmp/n", "/workspace/rel/x"):
        r = stack.alice.put(f"/v1/sandboxes/{sandbox}/files", params={"path": path}, content=b"x")
        assert "kernel filesystem" in assert_problem(r, 400, "path")["detail"], path
        r = stack.alice.get(f"/v1/sandboxes/{sandbox}/files", params={"path": path})
        assert_problem(r, 400, "path")
    # a tar extracted into a directory reached through such a link is refused too
    r = stack.alice.put(
        f"/v1/sandboxes/{sandbox}/files",
        params={"path": "/tmp/s/dir"},
        content=_tar_of_one_file(),
        headers={"content-type": "application/x-tar"},
    )
    assert_problem(r, 400, "path")


def _tar_of_one_file() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        info = tarfile.TarInfo("f")
        info.size = 1
        t.addfile(info, io.BytesIO(b"x"))
    return buf.getvalue()


def _tenant_usage(stack: Stack) -> tuple[int, float]:
    with stack.ctx.db.read() as s:
        t = s.get(Tenant, "alice")
        return t.used_sandboxes, t.used_cpus


def test_cpus_the_engine_refuses_are_refused_before_anything_is_used(stack: Stack) -> None:
    # Regression: more CPUs than the host has, or 0.001, were 502s that used up a warm
    # sandbox or left a failed row behind.
    stack.wait_for(lambda: stack.alice.get("/v1/pools/terminal").json()["warm"] >= 1, 60)
    with stack.ctx.db.read() as s:
        warm_before = set(
            s.execute(
                select(Sandbox.id).where(
                    Sandbox.deployment == stack.ctx.settings.deployment, Sandbox.state == "warm"
                )
            ).scalars()
        )
    usage = _tenant_usage(stack)
    host = stack.ctx.runtime.host_cpus()
    for cpus in (host + 1, host + 0.5, 64, 0.001, 0.009):
        for template in ("terminal", "tiny"):
            r = stack.alice.post(
                "/v1/sandboxes", json={"template": template, "limits": {"cpus": cpus}}
            )
            assert str(host) in assert_problem(r, 400, "limits.cpus")["detail"]
    with stack.ctx.db.read() as s:
        rows = s.execute(select(Sandbox).where(Sandbox.tenant_id == "alice")).scalars().all()
    assert not warm_before & {r.id for r in rows}, "a warm sandbox went to a refused lease"
    assert not [r for r in rows if r.state == "failed"]
    assert _tenant_usage(stack) == usage
    # the bounds themselves are accepted
    for cpus in (0.01, float(host)):
        sb = lease(stack.alice, "tiny", limits={"cpus": cpus})
        assert sb["cpus"] == cpus
        stack.alice.delete(f"/v1/sandboxes/{sb['id']}")


def test_pools_templates_and_metrics_tell_nothing_of_other_tenants(stack: Stack) -> None:
    # Regression: GET /v1/pools showed every tenant's leased counts and the task templates
    # others ran; /metrics (no key) listed tenant ids.
    secret = "task-private-suite-secret-task"
    tiny = stack.ctx.templates.get("tiny")
    stack.ctx.templates.register(tiny.model_copy(update={"name": secret}))
    bobs = [lease(stack.bob, secret)["id"], lease(stack.bob, "tiny")["id"]]
    try:
        r = stack.bob.post(
            "/v1/sandboxes",
            json={"template": "tiny", "limits": {"cpus": 0.02, "memory_mb": 200_000}},
        )
        assert_problem(r, 400, "quota")  # a refusal counted in the metrics
        for client, sees in ((stack.alice, False), (stack.bob, True), (stack.admin, True)):
            pools = {p["template"]: p for p in client.get("/v1/pools").json()}
            names = {t["name"] for t in client.get("/v1/templates").json()}
            assert (secret in pools, secret in names) == (sees, sees)
            r = client.get(f"/v1/pools/{secret}")
            assert r.status_code == (200 if sees else 404), r.text
            if sees:
                assert r.json()["leased"] == 1
        assert {p["template"]: p["leased"] for p in stack.alice.get("/v1/pools").json()}[
            "tiny"
        ] == 0
        assert stack.bob.get("/v1/pools/tiny").json()["leased"] == 1
        text = stack.make_client().get("/metrics").text
        assert "crucible_quota_refusals_total" in text
        for tenant in ("alice", "bob", "admin"):
            assert tenant not in text
        assert "tenant=" not in text
    finally:
        for sid in bobs:
            stack.bob.delete(f"/v1/sandboxes/{sid}")


def test_a_nul_in_a_filter_or_a_text_field_is_a_4xx_naming_it(stack: Stack) -> None:
    """Trial 29: U+0000 in a query filter or in a worker, an error or an id reached a
    PostgreSQL text column: a 500 there (24 of 196 schema-driven requests), stored on
    SQLite. The edge refuses it in the query, the schemas in those fields, and the engine
    in any other bound text (``test_text_nul.py``)."""
    for path, params, field in (
        ("/v1/audit", {"action": "\x00"}, "action"),
        ("/v1/audit", {"sandbox_id": "a\x00"}, "sandbox_id"),
        ("/v1/rewards", {"task_id": "\x00"}, "task_id"),
        ("/v1/rewards/export", {"suite": "\x00"}, "suite"),
    ):
        assert_problem(stack.alice.get(path, params=params), 400, field)
    r = stack.alice.post(
        "/v1/episodes", json={"task_id": "word-frequency-top20", "work_item_id": "w\x00"}
    )
    assert_problem(r, 422)
    assert "work_item_id" in r.text
    for path, body in (
        ("/v1/jobs/job_x/claim", {"worker": "w\x00"}),
        ("/v1/work-items/wi_x/heartbeat", {"worker": "w\x00"}),
        ("/v1/work-items/wi_x/complete", {"worker": "w", "ok": False, "error": "e\x00"}),
    ):
        r = stack.alice.post(path, json=body)
        assert_problem(r, 422)
        assert ("error" if "complete" in path else "worker") in r.text
