"""Lease lifecycle, exec, files, snapshots and forks through real HTTP and real Docker."""

from __future__ import annotations

import base64
import io
import json
import tarfile
import time
from typing import Any

import httpx
import pytest

from tests.integration.api.conftest import Stack

pytestmark = pytest.mark.docker

PROBLEM = "application/problem+json"


def lease(client: httpx.Client, template: str = "terminal", **body: Any) -> dict[str, Any]:
    r = client.post("/v1/sandboxes", json={"template": template, **body})
    assert r.status_code == 201, r.text
    return r.json()


def run(client: httpx.Client, sid: str, cmd: str | list[str], **body: Any) -> dict[str, Any]:
    r = client.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": cmd, **body})
    assert r.status_code == 200, r.text
    return r.json()


def assert_problem(r: httpx.Response, status: int, field: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM)
    body = r.json()
    assert body["status"] == status and body["title"] and body["detail"]
    if field is not None:
        assert body["field"] == field, body
    return body


def audit_actions(stack: Stack, sid: str) -> list[dict[str, Any]]:
    r = stack.admin.get("/v1/audit", params={"sandbox_id": sid, "limit": 1000})
    assert r.status_code == 200
    return r.json()["events"]


def test_lease_exec_release_lifecycle(stack: Stack) -> None:
    sb = lease(stack.alice, ttl_s=120, metadata={"episode": "e1"})
    assert sb["state"] == "leased" and sb["template"] == "terminal"
    assert sb["metadata"] == {"episode": "e1"}
    out = run(stack.alice, sb["id"], "echo hello; echo oops >&2; exit 3")
    assert (out["exit_code"], out["stdout"], out["stderr"]) == (3, "hello\n", "oops\n")
    assert (out["stdout_bytes"], out["timed_out"], out["oom_killed"]) == (6, False, False)
    listed = stack.alice.get("/v1/sandboxes").json()["sandboxes"]
    assert sb["id"] in [s["id"] for s in listed]
    r = stack.alice.delete(f"/v1/sandboxes/{sb['id']}")
    assert r.status_code == 200 and r.json()["state"] == "released"
    assert_problem(stack.alice.post(f"/v1/sandboxes/{sb['id']}/exec", json={"cmd": "true"}), 409)
    # release is idempotent and the container goes away
    assert stack.alice.delete(f"/v1/sandboxes/{sb['id']}").json()["state"] == "released"
    stack.wait_for(
        lambda: (
            sb["id"]
            not in {
                c.sandbox_id
                for c in stack.ctx.runtime.list(deployment=stack.ctx.settings.deployment)
            }
        )
    )
    actions = [e["action"] for e in audit_actions(stack, sb["id"])]
    assert actions[0] == "sandbox.lease" and "sandbox.exec" in actions
    assert actions.count("sandbox.release") == 1
    exec_ev = next(e for e in audit_actions(stack, sb["id"]) if e["action"] == "sandbox.exec")
    d = exec_ev["details"]
    assert d["cmd"].startswith("echo hello") and d["exit_code"] == 3
    assert (d["stdout_bytes"], d["stderr_bytes"]) == (6, 5) and d["duration_ms"] > 0


def test_warm_pool_serves_lease_and_refills(stack: Stack) -> None:
    def warm() -> int:
        return stack.alice.get("/v1/pools/terminal").json()["warm"]

    stack.wait_for(lambda: warm() >= 1, timeout_s=60)
    sb = lease(stack.alice)
    first = audit_actions(stack, sb["id"])[0]
    assert first["action"] == "sandbox.lease" and first["details"]["warm"] is True
    stack.wait_for(lambda: warm() >= 1, timeout_s=60)  # refilled in the background
    stack.alice.delete(f"/v1/sandboxes/{sb['id']}")


def test_another_tenants_sandbox_is_not_found(stack: Stack) -> None:
    sb = lease(stack.alice)
    sid = sb["id"]
    assert_problem(stack.bob.get(f"/v1/sandboxes/{sid}"), 404)
    assert_problem(stack.bob.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "id"}), 404)
    assert_problem(stack.bob.delete(f"/v1/sandboxes/{sid}"), 404)
    assert_problem(
        stack.bob.get(f"/v1/sandboxes/{sid}/files", params={"path": "/etc/hostname"}), 404
    )
    assert sid not in [s["id"] for s in stack.bob.get("/v1/sandboxes").json()["sandboxes"]]
    assert stack.alice.get(f"/v1/sandboxes/{sid}").json()["state"] == "leased"
    stack.alice.delete(f"/v1/sandboxes/{sid}")


def test_missing_and_bad_keys_are_401_and_audited(stack: Stack) -> None:
    anon = stack.make_client()
    assert_problem(anon.post("/v1/sandboxes", json={"template": "terminal"}), 401)
    bad = stack.make_client("cr_deadbeef0000_notasecret")
    assert_problem(bad.get("/v1/sandboxes"), 401)
    events = stack.admin.get("/v1/audit", params={"action": "auth.failed", "limit": 1000}).json()
    reasons = [e["details"]["reason"] for e in events["events"]]
    assert any("missing" in r for r in reasons) and any("unknown" in r for r in reasons)
    assert any(e["details"]["key_id"] == "deadbeef0000" for e in events["events"])


def test_non_admin_cannot_resize_pools(stack: Stack) -> None:
    assert_problem(stack.alice.put("/v1/pools/terminal", json={"target_size": 5}), 403)
    assert_problem(
        stack.admin.put("/v1/pools/terminal", json={"target_size": -1}), 422, "target_size"
    )
    assert_problem(stack.admin.put("/v1/pools/nope", json={"target_size": 1}), 404, "template")


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"template": "no-such-template"}, 404, "template"),
        ({"template": "terminal", "ttl_s": -5}, 422, "ttl_s"),
        ({"template": "terminal", "ttl_s": 10**9}, 400, "ttl_s"),
        ({"template": "terminal", "surprise": 1}, 422, "surprise"),
        ({}, 422, "template"),
    ],
)
def test_bad_lease_requests(stack: Stack, body: dict[str, Any], status: int, field: str) -> None:
    before = len(stack.alice.get("/v1/sandboxes").json()["sandboxes"])
    assert_problem(stack.alice.post("/v1/sandboxes", json=body), status, field)
    assert len(stack.alice.get("/v1/sandboxes").json()["sandboxes"]) == before


def test_malformed_json_is_400(stack: Stack) -> None:
    r = stack.alice.post(
        "/v1/sandboxes", content=b'{"template": ', headers={"content-type": "application/json"}
    )
    assert_problem(r, 400, "body")


@pytest.fixture(scope="module")
def sandbox(stack: Stack) -> str:
    return lease(stack.alice, ttl_s=3600)["id"]


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"cmd": "true", "timeout_s": -1}, 422, "timeout_s"),
        ({"cmd": "true", "timeout_s": 0}, 422, "timeout_s"),
        ({"cmd": "true", "timeout_s": 10**12}, 422, "timeout_s"),
        ({"cmd": "true", "timeout_s": 601}, 400, "timeout_s"),
        ({"cmd": "true", "max_output_bytes": -1}, 422, "max_output_bytes"),
        ({"cmd": "true", "max_output_bytes": 1 << 40}, 400, "max_output_bytes"),
        ({"cmd": ""}, 422, "cmd"),
        ({"cmd": []}, 422, "cmd"),
        ({"cmd": "true", "stdin_b64": "%%%"}, 400, "stdin_b64"),
        ({"cmd": "true", "env": {"A=B": "x"}}, 400, "env"),
    ],
)
def test_bad_exec_requests(
    stack: Stack, sandbox: str, body: dict[str, Any], status: int, field: str
) -> None:
    assert_problem(stack.alice.post(f"/v1/sandboxes/{sandbox}/exec", json=body), status, field)


def test_exec_bytes_env_stdin_and_cwd(stack: Stack, sandbox: str) -> None:
    out = run(stack.alice, sandbox, "printf '\\377\\376abc'", output_b64=True)
    assert base64.b64decode(out["stdout_b64"]) == b"\xff\xfeabc"
    assert out["stdout"] == "\ufffd\ufffdabc"
    raw = b"caf\xe9 \n'\"$HOME"
    out = run(
        stack.alice,
        sandbox,
        'printf %s "$V" | od -An -tx1 | tr -d " \\n"',
        env_b64={"V": base64.b64encode(raw).decode()},
    )
    assert out["stdout"] == raw.hex()
    out = run(stack.alice, sandbox, "cat", stdin="line1\nline2")
    assert out["stdout"] == "line1\nline2"
    out = run(stack.alice, sandbox, ["sh", "-c", "pwd"], cwd="/tmp")
    assert out["stdout"] == "/tmp\n"


def test_exec_stream_ndjson(stack: Stack, sandbox: str) -> None:
    with stack.alice.stream(
        "POST",
        f"/v1/sandboxes/{sandbox}/exec",
        params={"stream": "true"},
        json={"cmd": "echo a; sleep 0.3; echo b >&2; echo c"},
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert lines[-1]["type"] == "result" and lines[-1]["result"]["exit_code"] == 0
    chunks = lines[:-1]
    assert "".join(c["data"] for c in chunks if c["type"] == "stdout") == "a\nc\n"
    assert "".join(c["data"] for c in chunks if c["type"] == "stderr") == "b\n"
    assert all(c["type"] in ("stdout", "stderr") for c in chunks)


def test_heartbeat_extends_lease(stack: Stack) -> None:
    sb = lease(stack.alice, ttl_s=60)
    r = stack.alice.post(f"/v1/sandboxes/{sb['id']}/heartbeat", json={"ttl_s": 600})
    assert r.status_code == 200
    assert r.json()["expires_at"] > sb["expires_at"]
    assert_problem(
        stack.alice.post(f"/v1/sandboxes/{sb['id']}/heartbeat", json={"ttl_s": 0}), 422, "ttl_s"
    )
    stack.alice.delete(f"/v1/sandboxes/{sb['id']}")
    assert_problem(stack.alice.post(f"/v1/sandboxes/{sb['id']}/heartbeat"), 409)


def test_expired_lease_is_reaped(stack: Stack) -> None:
    sb = lease(stack.alice, ttl_s=1)
    time.sleep(1.2)
    assert_problem(stack.alice.post(f"/v1/sandboxes/{sb['id']}/exec", json={"cmd": "true"}), 409)
    stack.wait_for(
        lambda: stack.alice.get(f"/v1/sandboxes/{sb['id']}").json()["state"] == "expired"
    )
    assert "sandbox.expire" in [e["action"] for e in audit_actions(stack, sb["id"])]


def test_file_upload_download_round_trip(stack: Stack, sandbox: str) -> None:
    data = bytes(range(256)) * 10
    r = stack.alice.put(
        f"/v1/sandboxes/{sandbox}/files", params={"path": "deep/new/dir/f.bin"}, content=data
    )
    assert r.status_code == 200, r.text
    assert r.json() == {"path": "/workspace/deep/new/dir/f.bin", "bytes": 2560, "kind": "file"}
    r = stack.alice.get(f"/v1/sandboxes/{sandbox}/files", params={"path": "deep/new/dir/f.bin"})
    assert r.status_code == 200 and r.content == data
    assert r.headers["content-type"] == "application/octet-stream"
    out = run(stack.alice, sandbox, "stat -c '%U %a %s' /workspace/deep/new/dir/f.bin")
    assert out["stdout"] == "root 644 2560\n"
    events = [e for e in audit_actions(stack, sandbox) if e["action"].startswith("sandbox.file")]
    assert {(e["action"], e["details"]["bytes"]) for e in events} >= {
        ("sandbox.file_put", 2560),
        ("sandbox.file_get", 2560),
    }


def _tar(members: list[tuple[str, bytes | None, str | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, data, link in members:
            info = tarfile.TarInfo(name)
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link
                t.addfile(info)
            elif data is None:
                info.type = tarfile.DIRTYPE
                t.addfile(info)
            else:
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_tar_upload_and_directory_download(stack: Stack, sandbox: str) -> None:
    tar = _tar(
        [
            ("pkg", None, None),
            ("pkg/a.txt", b"A", None),
            ("pkg/sub/b.txt", b"BB", None),
            ("pkg/link", None, "a.txt"),
        ]
    )
    r = stack.alice.put(
        f"/v1/sandboxes/{sandbox}/files",
        params={"path": "up"},
        content=tar,
        headers={"content-type": "application/x-tar"},
    )
    assert r.status_code == 200, r.text
    out = run(stack.alice, sandbox, "cat /workspace/up/pkg/sub/b.txt /workspace/up/pkg/link")
    assert out["stdout"] == "BBA"
    r = stack.alice.get(f"/v1/sandboxes/{sandbox}/files", params={"path": "up/pkg"})
    assert r.headers["content-type"] == "application/x-tar"
    with tarfile.open(fileobj=io.BytesIO(r.content)) as t:
        names = sorted(t.getnames())
    assert names == ["pkg", "pkg/a.txt", "pkg/link", "pkg/sub", "pkg/sub/b.txt"]


@pytest.mark.parametrize(
    ("members", "needle"),
    [
        ([("ok.txt", b"x", None), ("../evil.txt", b"x", None)], "../evil.txt"),
        ([("/etc/evil", b"x", None)], "/etc/evil"),
        ([("a/../../evil", b"x", None)], "a/../../evil"),
        ([("esc", None, "/etc/passwd")], "esc"),
        ([("d", None, None), ("d/esc", None, "../../etc")], "d/esc"),
    ],
)
def test_escaping_tar_members_are_refused(
    stack: Stack, sandbox: str, members: list, needle: str
) -> None:
    r = stack.alice.put(
        f"/v1/sandboxes/{sandbox}/files",
        params={"path": "tarzone"},
        content=_tar(members),
        headers={"content-type": "application/x-tar"},
    )
    body = assert_problem(r, 400)
    assert needle in body["detail"]
    out = run(stack.alice, sandbox, "ls /workspace/tarzone 2>&1; ls /etc/evil /evil.txt 2>&1")
    assert "ok.txt" not in out["stdout"] and "No such file" in out["stdout"]


def test_paths_confined_to_files_root(stack: Stack) -> None:
    sb = lease(stack.alice, "scoped")
    sid = sb["id"]
    r = stack.alice.get(f"/v1/sandboxes/{sid}/files", params={"path": "../etc/passwd"})
    assert_problem(r, 400, "path")
    r = stack.alice.put(
        f"/v1/sandboxes/{sid}/files", params={"path": "/etc/cron.d/x"}, content=b"x"
    )
    assert_problem(r, 400, "path")
    run(stack.alice, sid, "ln -s /etc /workspace/etclink && echo inside > /workspace/in.txt")
    r = stack.alice.get(f"/v1/sandboxes/{sid}/files", params={"path": "etclink/passwd"})
    assert "symlink" in assert_problem(r, 400, "path")["detail"]
    r = stack.alice.put(f"/v1/sandboxes/{sid}/files", params={"path": "etclink/evil"}, content=b"x")
    assert_problem(r, 400, "path")
    assert run(stack.alice, sid, "test -e /etc/evil; echo $?")["stdout"] == "1\n"
    assert (
        stack.alice.get(f"/v1/sandboxes/{sid}/files", params={"path": "in.txt"}).content
        == b"inside\n"
    )
    stack.alice.delete(f"/v1/sandboxes/{sid}")


def test_oversize_upload_is_413(stack: Stack, sandbox: str) -> None:
    r = stack.alice.put(
        f"/v1/sandboxes/{sandbox}/files", params={"path": "big.bin"}, content=b"x" * ((1 << 20) + 1)
    )
    assert_problem(r, 413, "body")
    assert run(stack.alice, sandbox, "test -e /workspace/big.bin; echo $?")["stdout"] == "1\n"


def test_missing_file_download_is_404(stack: Stack, sandbox: str) -> None:
    assert_problem(
        stack.alice.get(f"/v1/sandboxes/{sandbox}/files", params={"path": "nope.txt"}), 404
    )


def test_snapshot_and_fork_give_identical_independent_starts(stack: Stack) -> None:
    sb = lease(stack.alice)
    run(stack.alice, sb["id"], "echo seed > /workspace/state.txt")
    r = stack.alice.post(f"/v1/sandboxes/{sb['id']}/snapshots")
    assert r.status_code == 201, r.text
    snap = r.json()
    assert stack.alice.get(f"/v1/sandboxes/{sb['id']}").json()["state"] == "leased"
    assert_problem(stack.bob.post(f"/v1/snapshots/{snap['id']}/fork", json={"n": 1}), 404)
    r = stack.alice.post(f"/v1/snapshots/{snap['id']}/fork", json={"n": 3, "metadata": {"g": "1"}})
    assert r.status_code == 201, r.text
    forks = r.json()["sandboxes"]
    assert len(forks) == 3 and len({f["id"] for f in forks}) == 3
    assert [f["metadata"]["fork_index"] for f in forks] == [0, 1, 2]
    assert all(f["source_snapshot_id"] == snap["id"] for f in forks)
    run(stack.alice, forks[0]["id"], "echo changed > /workspace/state.txt")
    outs = [run(stack.alice, f["id"], "cat /workspace/state.txt")["stdout"] for f in forks]
    assert outs == ["changed\n", "seed\n", "seed\n"]
    assert run(stack.alice, sb["id"], "cat /workspace/state.txt")["stdout"] == "seed\n"
    for f in [*forks, sb]:
        stack.alice.delete(f"/v1/sandboxes/{f['id']}")
    assert stack.alice.delete(f"/v1/snapshots/{snap['id']}").status_code == 204
    assert_problem(stack.alice.get(f"/v1/snapshots/{snap['id']}"), 404)


def test_health_ready_metrics_templates(stack: Stack) -> None:
    anon = stack.make_client()
    assert anon.get("/healthz").json() == {"status": "ok"}
    r = anon.get("/readyz")
    assert r.status_code == 200 and r.json()["checks"] == {"database": True, "docker": True}
    text = anon.get("/metrics").text
    assert (
        "crucible_http_requests_total" in text
        and 'crucible_pool_target{template="terminal"}' in text
        and "# TYPE crucible_verifier_anomaly gauge" in text
    )
    names = [t["name"] for t in stack.alice.get("/v1/templates").json()]
    assert "terminal" in names


@pytest.mark.parametrize("warm", [True, False])
def test_lease_limits_override_within_quota(stack: Stack, warm: bool) -> None:
    if warm:
        stack.wait_for(lambda: stack.alice.get("/v1/pools/terminal").json()["warm"] >= 1, 60)
    else:
        stack.admin.put("/v1/pools/terminal", json={"target_size": 0})
        stack.wait_for(lambda: stack.alice.get("/v1/pools/terminal").json()["warm"] == 0, 60)
    sb = lease(stack.alice, limits={"cpus": 0.5, "memory_mb": 256})
    assert (sb["cpus"], sb["memory_mb"]) == (0.5, 256)
    out = run(
        stack.alice,
        sb["id"],
        "cat /sys/fs/cgroup/memory/memory.limit_in_bytes "
        "/sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_period_us",
    )
    mem, quota, period = (int(x) for x in out["stdout"].split())
    assert mem == 256 << 20 and quota / period == 0.5
    stack.alice.delete(f"/v1/sandboxes/{sb['id']}")
    if not warm:
        stack.admin.put("/v1/pools/terminal", json={"target_size": 1})
    assert_problem(
        stack.alice.post("/v1/sandboxes", json={"template": "terminal", "limits": {"cpus": 100}}),
        422,
        "limits.cpus",
    )
    assert_problem(
        stack.alice.post(
            "/v1/sandboxes", json={"template": "terminal", "limits": {"memory_mb": 1 << 20}}
        ),
        422,
        "limits.memory_mb",
    )


@pytest.mark.parametrize(
    ("url", "body", "field"),
    [
        ("/v1/sandboxes", '{"template": "terminal", "metadata": {"a": "\\ud800"}}', "metadata"),
        ("exec", '{"cmd": "echo \\ud800"}', "cmd"),
        ("exec", '{"cmd": "true", "env": {"K": "\\udfff"}}', "env"),
    ],
)
def test_lone_surrogates_are_refused_and_nothing_is_stored(
    stack: Stack, sandbox: str, url: str, body: str, field: str
) -> None:
    # Regression: a lone surrogate was stored and then broke every read of the tenant's rows.
    before = len(stack.alice.get("/v1/sandboxes").json()["sandboxes"])
    path = f"/v1/sandboxes/{sandbox}/exec" if url == "exec" else url
    r = stack.alice.post(path, content=body.encode(), headers={"content-type": "application/json"})
    assert_problem(r, 422, field)
    listed = stack.alice.get("/v1/sandboxes")
    assert listed.status_code == 200 and len(listed.json()["sandboxes"]) == before
