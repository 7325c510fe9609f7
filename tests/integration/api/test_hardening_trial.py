"""Findings of an API fuzzing trial (each was a 5xx), fixed and pinned."""

from __future__ import annotations

import io
import tarfile

import httpx
import pytest

from tests.integration.api.conftest import Stack
from tests.integration.api.test_sandboxes_api import assert_problem, lease, run

pytestmark = pytest.mark.docker


def test_downloading_a_symlink_loop_is_the_clients_error(stack: Stack) -> None:
    sid = lease(stack.alice)["id"]
    out = run(stack.alice, sid, "ln -s /tmp/loop2 /tmp/loop3 && ln -s /tmp/loop3 /tmp/loop2")
    assert out["exit_code"] == 0, out
    r = stack.alice.get(f"/v1/sandboxes/{sid}/files", params={"path": "/tmp/loop2"})
    problem = assert_problem(r, 400, "path")
    assert "overlay2" not in problem["detail"] and "/var/lib/docker" not in problem["detail"]
    assert stack.alice.get(f"/v1/sandboxes/{sid}").json()["state"] == "leased"


@pytest.mark.parametrize("mtime", [10**20, -(10**12)])
def test_a_tar_member_with_an_absurd_mtime_is_clamped(stack: Stack, mtime: int) -> None:
    sid = lease(stack.alice)["id"]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        info = tarfile.TarInfo("m")
        info.size, info.mtime = 1, mtime
        t.addfile(info, io.BytesIO(b"x"))
    r = stack.alice.put(
        f"/v1/sandboxes/{sid}/files",
        params={"path": "/tmp/t10"},
        content=buf.getvalue(),
        headers={"content-type": "application/x-tar"},
    )
    assert r.status_code == 200, r.text
    assert run(stack.alice, sid, "cat /tmp/t10/m")["stdout"] == "x"


def test_dashboard_cookies_and_tokens_outside_ascii_are_refused_not_errors(stack: Stack) -> None:
    with httpx.Client(base_url=stack.url, follow_redirects=False) as raw:
        r = raw.get("/dashboard", headers={"cookie": b"crucible_session=a.\xe9\xe9"})
        assert r.status_code < 500, r.text
        r = raw.post(
            "/dashboard/login",
            headers={
                "cookie": "crucible_login=abc",
                "content-type": "application/x-www-form-urlencoded",
            },
            content=b"csrf=%C3%A9&key=",
        )
        assert 400 <= r.status_code < 500, r.text
