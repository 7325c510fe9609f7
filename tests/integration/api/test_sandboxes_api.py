"""Lease lifecycle, exec, files, snapshots and forks through real HTTP and real Docker."""

from __future__ import annotations

import base64
import bz2
import gzip
import io
import json
import lzma
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


def test_a_stream_whose_command_cannot_start_ends_with_its_problem(
    stack: Stack, sandbox: str
) -> None:
    """The fuzzer found a streaming exec with a ``cwd`` that does not exist broke off
    mid-response (the error came once the command started, after the headers): the
    problem is now the stream's last line, and the real client raises it typed."""
    from policy_client import Client
    from policy_client.errors import BadRequest

    with stack.alice.stream(
        "POST",
        f"/v1/sandboxes/{sandbox}/exec",
        params={"stream": "true"},
        json={"cmd": "true", "cwd": "/no/such/dir"},
    ) as r:
        assert r.status_code == 200
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert lines[-1]["type"] == "error", lines
    problem = lines[-1]["problem"]
    assert (problem["status"], problem["field"]) == (400, "cwd"), problem
    key = stack.alice.headers["authorization"].split(" ", 1)[1]
    with Client(stack.url, key) as client, pytest.raises(BadRequest) as e:
        list(client.exec_stream(sandbox, "true", cwd="/no/such/dir"))
    assert e.value.field == "cwd"
    # and the sandbox still runs commands
    assert run(stack.alice, sandbox, "echo ok")["stdout"] == "ok\n"


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
    out = run(stack.alice, sandbox, "stat -c '%u:%g %a %s' /workspace/deep/new/dir/f.bin")
    assert out["stdout"] == "1000:1000 644 2560\n"  # the terminal template's user
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


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ("rm -f /etc/passwd && mkfifo /etc/passwd", "/etc/passwd is a FIFO"),
        ("rm -f /etc/group && mkdir /etc/group", "/etc/group is a directory"),
        ("cd / && rm -rf /workspace && echo x > /workspace", "/workspace is a regular file"),
    ],
    ids=["passwd fifo", "group dir", "workdir file"],
)
def test_a_snapshot_whose_files_stop_a_start_is_refused_as_a_conflict(
    stack: Stack, change: str, why: str
) -> None:
    # Trial 20: the engine reads /etc/passwd and /etc/group to start a container and
    # enters its workdir. A FIFO at /etc/passwd blocked the fork's start past the engine
    # client's timeout and left the container wedged in the engine (502); a directory
    # there failed every resume of a checkpoint with 502, which the runner re-queued
    # forever. The fork is now refused (409, the sandbox's doing) before anything starts.
    sb = lease(stack.alice)
    assert run(stack.alice, sb["id"], change, user="root")["exit_code"] == 0
    r = stack.alice.post(f"/v1/sandboxes/{sb['id']}/snapshots")
    assert r.status_code == 201, r.text
    snap = r.json()
    t0 = time.monotonic()
    body = assert_problem(stack.alice.post(f"/v1/snapshots/{snap['id']}/fork", json={"n": 1}), 409)
    assert why in body["detail"] and time.monotonic() - t0 < 10
    stack.alice.delete(f"/v1/sandboxes/{sb['id']}")
    assert stack.alice.delete(f"/v1/snapshots/{snap['id']}").status_code == 204


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


@pytest.mark.parametrize("url", ["/v1/sandboxes", "/v1/snapshots/snap_nope/fork"])
def test_metadata_keys_the_service_acts_on_are_refused(stack: Stack, url: str) -> None:
    # Regression: a tenant's ad-hoc sandbox leased with metadata {"episode_role": "member"}
    # was taken for a group start's orphan and released by recovery (start-up and the
    # dead-replica sweep release a member sandbox no live episode owns).
    before = len(stack.alice.get("/v1/sandboxes").json()["sandboxes"])
    body = {"metadata": {"g": "1", "episode_role": "member"}}
    if url == "/v1/sandboxes":
        body["template"] = "tiny"
    r = stack.alice.post(url, json=body)
    assert_problem(r, 422, "metadata")
    assert "reserved" in r.json()["detail"], r.text
    listed = stack.alice.get("/v1/sandboxes")
    assert listed.status_code == 200 and len(listed.json()["sandboxes"]) == before


# ------------------------------------------------ file API: bounded, refused, never a 5xx


def _put(stack: Stack, sid: str, path: str, body: bytes, *, tar: bool = True) -> httpx.Response:
    headers = {"content-type": "application/x-tar" if tar else "application/octet-stream"}
    return stack.alice.put(
        f"/v1/sandboxes/{sid}/files", params={"path": path}, content=body, headers=headers
    )


def _zeros_tar_gz(name: str, size: int) -> bytes:
    """A .tar.gz holding ``size`` zero bytes as ``name``, written without holding them."""

    class Zeros:
        def read(self, n: int) -> bytes:
            return bytes(n)

    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb") as gz, tarfile.open(fileobj=gz, mode="w|") as t:
        info = tarfile.TarInfo(name)
        info.size = size
        t.addfile(info, Zeros())  # type: ignore[arg-type]
    return buf.getvalue()


def test_compressed_tar_uploads_are_bounded_by_the_upload_limit(stack: Stack, sandbox: str) -> None:
    ok = _tar([("gz.txt", b"g" * 300_000, None)])
    for name, packed in (
        ("gz", gzip.compress(ok)),
        ("bz2", bz2.compress(ok)),
        ("xz", lzma.compress(ok)),
    ):
        r = _put(stack, sandbox, f"packed/{name}", packed)
        assert r.status_code == 200, r.text
        out = run(stack.alice, sandbox, f"wc -c < /workspace/packed/{name}/gz.txt")
        assert out["stdout"] == "300000\n"
    bomb = _zeros_tar_gz("zeros.bin", 256 << 20)  # ~256 KiB compressed, 256 MiB expanded
    assert len(bomb) < 1 << 20
    body = assert_problem(_put(stack, sandbox, "bomb", bomb), 413, "body")
    assert "expands to more than" in body["detail"]
    # many members, each small, add up past the limit too
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb") as gz, tarfile.open(fileobj=gz, mode="w|") as t:
        for i in range(8):
            info = tarfile.TarInfo(f"part{i}")
            info.size = 256 << 10
            t.addfile(info, io.BytesIO(bytes(info.size)))
    assert_problem(_put(stack, sandbox, "bomb", buf.getvalue()), 413, "body")
    out = run(stack.alice, sandbox, "ls /workspace/bomb 2>&1")
    assert "No such file" in out["stdout"]


def _with_size(tar: bytes, header_offset: int, size: int) -> bytes:
    """``tar`` with the size field of the header at ``header_offset`` rewritten (and its
    checksum fixed), so only the size is corrupt."""
    b = bytearray(tar)
    b[header_offset + 124 : header_offset + 136] = b"%011o\0" % size
    header = bytearray(b[header_offset : header_offset + 512])
    header[148:156] = b" " * 8
    b[header_offset + 148 : header_offset + 156] = b"%06o\0 " % sum(header)
    return bytes(b)


@pytest.mark.parametrize(
    "kind", ["truncated", "corrupt-size", "corrupt-size-gz", "truncated-gz", "crc-gz", "not-a-tar"]
)
def test_unreadable_tars_are_400(stack: Stack, sandbox: str, kind: str) -> None:
    good = _tar([("first.txt", b"1" * 600, None), ("second.txt", bytes(range(256)) * 40, None)])
    second = 512 + 1024  # header of the second member
    body = {
        "truncated": good[: second + 512 + 3000],
        "corrupt-size": _with_size(good, second, 0o77777777777),
        "corrupt-size-gz": gzip.compress(_with_size(good, second, 20_000)),
        "truncated-gz": gzip.compress(good)[:-300],
        "crc-gz": gzip.compress(good)[:-8] + b"\0" * 8,
        "not-a-tar": b"this is not a tar archive" * 40,
    }[kind]
    problem = assert_problem(_put(stack, sandbox, f"unreadable-{kind}", body), 400, "body")
    assert "not a readable tar archive" in problem["detail"]
    out = run(stack.alice, sandbox, f"ls /workspace/unreadable-{kind} 2>&1")
    assert "first.txt" not in out["stdout"]


def _link_tar(members: list[tuple[str, str, str]]) -> bytes:
    """A tar of (name, kind, link target) with kind ``sym``, ``hard``, ``file`` or ``dir``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, kind, link in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(link)
                t.addfile(info, io.BytesIO(link.encode()))
                continue
            info.type = {"sym": tarfile.SYMTYPE, "hard": tarfile.LNKTYPE, "dir": tarfile.DIRTYPE}[
                kind
            ]
            info.linkname = link
            t.addfile(info)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("members", "needle"),
    [
        # the tester's escape: s/up2 -> up/.. leads to the destination's parent
        (
            [
                ("s/up", "sym", ".."),
                ("s/up2", "sym", "up/.."),
                ("s/up2/escaped.txt", "file", "pwned"),
            ],
            "s/up2",
        ),
        # any member below an earlier symlink, even one that stays inside
        ([("s/in", "sym", "../t"), ("s/in/escaped.txt", "file", "x")], "s/in/escaped.txt"),
        # a later symlink changes where an earlier one leads
        ([("a", "sym", "b/.."), ("b", "sym", "."), ("ok.txt", "file", "x")], "'a'"),
        # a hard link whose target goes through the archive's links
        (
            [("s/up", "sym", ".."), ("h", "hard", "s/up/../escaped.txt")],
            "'h'",
        ),
    ],
)
def test_tar_members_through_archive_symlinks_are_refused(
    stack: Stack, sandbox: str, members: list[tuple[str, str, str]], needle: str
) -> None:
    run(stack.alice, sandbox, "rm -rf /workspace/x /workspace/escaped.txt")
    problem = assert_problem(_put(stack, sandbox, "x", _link_tar(members)), 400)
    assert needle in problem["detail"] and problem["field"].startswith("tar:")
    out = run(
        stack.alice, sandbox, "ls /workspace/escaped.txt /workspace/x/s /workspace/x/ok.txt 2>&1"
    )
    assert out["stdout"].count("No such file") == 3, out


def test_tar_with_links_that_stay_inside_is_extracted(stack: Stack, sandbox: str) -> None:
    members = [
        ("lib/libfoo.so", "sym", "libfoo.so.1"),  # sorted order: the chain is defined backwards
        ("lib/libfoo.so.1", "sym", "libfoo.so.1.2"),
        ("lib/libfoo.so.1.2", "file", "elf"),
        ("bin", "sym", "lib"),
        ("lib/up", "sym", ".."),
        ("hard", "hard", "lib/libfoo.so.1.2"),
    ]
    r = _put(stack, sandbox, "linked", _link_tar(members))
    assert r.status_code == 200, r.text
    out = run(
        stack.alice, sandbox, "cd /workspace/linked && cat lib/libfoo.so bin/libfoo.so.1 hard"
    )
    assert out["stdout"] == "elfelfelf"


def test_file_upload_onto_a_directory_is_409(stack: Stack, sandbox: str) -> None:
    run(
        stack.alice,
        sandbox,
        "mkdir -p /workspace/proj/sub && echo keep > /workspace/proj/sub/f "
        "&& ln -sfn proj /workspace/projlink",
    )
    for path in ("proj", "/workspace/proj", "projlink", ".", "/workspace", "proj/sub"):
        problem = assert_problem(_put(stack, sandbox, path, b"clobber", tar=False), 409, "path")
        assert "is a directory" in problem["detail"] and "application/x-tar" in problem["detail"]
    out = run(stack.alice, sandbox, "cat /workspace/proj/sub/f; pwd; test -L /workspace/projlink")
    assert out["stdout"] == "keep\n/workspace\n" and out["exit_code"] == 0
    # a file is still replaced, and a tar still extracts into the directory
    r = _put(stack, sandbox, "proj/sub/f", b"new", tar=False)
    assert r.status_code == 200, r.text
    r = _put(stack, sandbox, "proj", _tar([("g.txt", b"g", None)]))
    assert r.status_code == 200, r.text
    assert (
        run(stack.alice, sandbox, "cat /workspace/proj/sub/f /workspace/proj/g.txt")["stdout"]
        == "newg"
    )


def test_filesystem_refusals_are_client_errors(stack: Stack, sandbox: str) -> None:
    run(
        stack.alice,
        sandbox,
        "mkdir -p /workspace/fsz && ln -sfn /nonexistent/dir /workspace/fsz/dangle "
        "&& echo f > /workspace/fsz/plain",
    )
    # the supervisor's read-only mount
    problem = assert_problem(_put(stack, sandbox, "/opt/crucible/x", b"x", tar=False), 409, "path")
    assert "read-only" in problem["detail"]
    problem = assert_problem(_put(stack, sandbox, "/opt/crucible", _tar([("x", b"x", None)])), 409)
    assert "read-only" in problem["detail"]
    # a file the engine bind-mounts
    problem = assert_problem(_put(stack, sandbox, "/etc/hostname", b"x", tar=False), 409, "path")
    assert "mount point" in problem["detail"]
    # a member written through a dangling symlink, or through a file
    problem = assert_problem(
        _put(stack, sandbox, "fsz", _tar([("dangle/x", b"x", None)])), 409, "tar:dangle/x"
    )
    assert "dangling symlink" in problem["detail"]
    problem = assert_problem(
        _put(stack, sandbox, "fsz", _tar([("plain/x", b"x", None)])), 409, "tar:plain/x"
    )
    assert "not a directory" in problem["detail"]
    # names the filesystem cannot hold
    long = "n" * 300
    problem = assert_problem(
        _put(stack, sandbox, "fsz", _tar([(f"d/{long}", b"x", None)])), 400, f"tar:d/{long}"
    )
    assert "too long" in problem["detail"] and len(problem["detail"]) < 1000
    r = _put(stack, sandbox, f"fsz/{long}", b"x", tar=False)
    assert 400 <= r.status_code < 500, r.text
    assert_problem(r, r.status_code, "path")
    assert run(stack.alice, sandbox, "ls /opt/crucible")["stdout"] == "crucible-exec\npy\n"


def test_runtime_stat_path_and_tmpfs_extraction_errors(
    docker_runtime: Any, make_sandbox: Any
) -> None:
    from service.errors import Conflict
    from service.runtime.base import ExecRequest

    box = make_sandbox(tmpfs={"/scratch": 8 << 20})
    script = (
        "mkdir -p /workspace/d /scratch/d/e && echo hi > /workspace/f && ln -s d /workspace/l "
        "&& ln -s /nonexistent /scratch/dangle && echo x > /scratch/d/e/f"
    )
    assert docker_runtime.exec(box, ExecRequest(cmd=script)).exit_code == 0
    stat = docker_runtime.stat_path
    assert stat(box, "/workspace/d").kind == "dir"
    f = stat(box, "/workspace/f")
    assert (f.kind, f.size, f.mode) == ("file", 3, 0o644)
    link = stat(box, "/workspace/l")
    assert (link.kind, link.link_target) == ("symlink", "/workspace/d")
    assert stat(box, "/workspace/missing") is None
    assert stat(box, "/scratch/d").kind == "dir"  # invisible to the engine: asked in the box
    assert stat(box, "/scratch/d/e/f").kind == "file"
    assert stat(box, "/scratch/missing") is None
    with pytest.raises(Conflict) as err:
        docker_runtime.put_archive(box, "/scratch", _tar([("dangle/x", b"x", None)]))
    assert err.value.field == "tar:dangle/x"
    with pytest.raises(Conflict) as err:
        docker_runtime.put_archive(box, "/scratch", _tar([("d", b"file over a dir", None)]))
    assert err.value.field == "tar:d"


@pytest.mark.parametrize("path", ["/proc/x", "/sys/kernel/x", "/dev/null", "../../dev/shm/x"])
def test_kernel_filesystems_are_out_of_reach(stack: Stack, sandbox: str, path: str) -> None:
    # Regression: PUT /proc/x answered 200 and wrote beneath the mount, invisibly.
    r = stack.alice.put(f"/v1/sandboxes/{sandbox}/files", params={"path": path}, content=b"x")
    assert_problem(r, 400, "path")
