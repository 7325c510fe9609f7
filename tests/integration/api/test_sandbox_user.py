"""The sandbox user: execs, sessions, kept processes and uploads run as / belong to the
template's uid:gid; another user (root included) only where the template allows it (403
problem+json otherwise, nothing run). Real HTTP, real Docker, the exec channel."""

from __future__ import annotations

import io
import tarfile
import time
from typing import Any

import docker
import httpx
import pytest

from service.tasks.registry import image_user_ids
from tests.integration.api.conftest import Stack

pytestmark = pytest.mark.docker

PROBLEM = "application/problem+json"


def lease(client: httpx.Client, template: str) -> str:
    r = client.post("/v1/sandboxes", json={"template": template, "ttl_s": 300})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def exec_(client: httpx.Client, sid: str, cmd: str, **body: Any) -> httpx.Response:
    return client.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": cmd, **body})


@pytest.fixture(scope="module")
def templates(stack: Stack) -> dict[str, Any]:
    terminal = stack.ctx.templates.get("terminal")
    locked = terminal.model_copy(update={"name": "locked", "allow_root": False})
    other = terminal.model_copy(update={"name": "uid4242", "uid": 4242, "gid": 4343})
    stack.ctx.templates.register(locked)
    stack.ctx.templates.register(other)
    return {"terminal": terminal, "locked": locked, "uid4242": other}


def test_builtin_terminal_template_is_non_root(stack: Stack, templates: dict[str, Any]) -> None:
    t = templates["terminal"]
    assert (t.user, t.uid, t.gid, t.allow_root) == ("agent", 1000, 1000, True)
    assert t.exec_user == "1000:1000"
    r = stack.alice.get("/v1/templates")
    assert r.status_code == 200, r.text
    shown = {x["name"]: (x["user"], x["uid"], x["gid"], x["allow_root"]) for x in r.json()}
    assert shown["terminal"] == ("agent", 1000, 1000, True)
    assert shown["locked"] == ("agent", 1000, 1000, False)
    assert shown["tiny"] == ("root", 0, 0, True)  # a root template: root is its own user


@pytest.mark.parametrize("template,ids", [("terminal", "1000:1000"), ("uid4242", "4242:4343")])
def test_exec_session_process_and_upload_run_as_the_template_user(
    stack: Stack, templates: dict[str, Any], template: str, ids: str
) -> None:
    c = stack.alice
    sid = lease(c, template)
    uid, gid = ids.split(":")
    r = exec_(c, sid, "id -u; id -g; id -G; echo $HOME; stat -c %u:%g .")
    assert r.status_code == 200, r.text
    home = templates[template].workdir
    assert r.json()["stdout"] == f"{uid}\n{gid}\n{gid}\n{home}\n{ids}\n"

    r = c.post(f"/v1/sandboxes/{sid}/sessions", json={})
    assert r.status_code == 201, r.text
    session = r.json()["id"]
    r = c.post(f"/v1/sandboxes/{sid}/sessions/{session}/run", json={"command": "id -u; id -g"})
    assert r.status_code == 200, r.text
    assert r.json()["output"].replace("\r\n", "\n") == f"{uid}\n{gid}\n"

    r = c.post(f"/v1/sandboxes/{sid}/processes", json={"cmd": "id -u; id -g"})
    assert r.status_code == 201, r.text
    handle = r.json()["handle"]
    r = c.get(
        f"/v1/sandboxes/{sid}/processes/{handle}/output", params={"wait_s": 5, "stream": "stdout"}
    )
    deadline = time.monotonic() + 10
    while r.json()["data"].count("\n") < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
        r = c.get(f"/v1/sandboxes/{sid}/processes/{handle}/output")
    assert r.json()["data"] == f"{uid}\n{gid}\n"

    # parents the upload makes are the user's too, also under a root-owned directory
    for path in ("/workspace/up.txt", "/tmp/new/dir/up.txt", "/srv/made/here/up.txt"):
        r = c.put(f"/v1/sandboxes/{sid}/files", params={"path": path}, content=b"x")
        assert r.status_code in (200, 201), r.text
        out = exec_(c, sid, f"stat -c %u:%g {path} $(dirname {path})").json()["stdout"]
        assert out == f"{ids}\n{ids}\n", path


def test_root_only_where_the_template_allows_it(stack: Stack, templates: dict[str, Any]) -> None:
    c = stack.alice
    allowed = lease(c, "terminal")
    for user in ("root", "0", "0:0"):
        r = exec_(c, allowed, "id -u", user=user)
        assert r.status_code == 200, r.text
        assert r.json()["stdout"] == "0\n"
    # the template's own user, by any of its names, is always fine
    locked = lease(c, "locked")
    for user in ("agent", "1000", "1000:1000"):
        r = exec_(c, locked, "id -u", user=user)
        assert r.status_code == 200, r.text
        assert r.json()["stdout"] == "1000\n"
    # anyone else: 403 naming the field, nothing runs (no marker file appears)
    for user in ("root", "0", "0:0", "1000:0", "daemon", "1"):
        r = exec_(c, locked, "touch /tmp/ran", user=user)
        assert r.status_code == 403, (user, r.text)
        assert r.headers["content-type"].startswith(PROBLEM)
        assert "user" in r.text
        r = c.post(f"/v1/sandboxes/{locked}/sessions", json={"user": user})
        assert r.status_code == 403, (user, r.text)
        r = c.post(
            f"/v1/sandboxes/{locked}/processes", json={"cmd": "touch /tmp/ran", "user": user}
        )
        assert r.status_code == 403, (user, r.text)
    assert exec_(c, locked, "ls /tmp/ran 2>/dev/null; echo $?").json()["stdout"] == "2\n"
    # another tenant's sandbox stays a 404 whatever the user asked
    r = exec_(stack.bob, locked, "true", user="root")
    assert r.status_code == 404


def test_a_task_user_named_without_uid_is_looked_up_in_its_image(
    templates: dict[str, Any],
) -> None:
    client = docker.from_env()
    image = templates["terminal"].image
    assert image_user_ids(client, image, "daemon") == (1, 1)
    assert image_user_ids(client, image, "nobody") == (65534, 65534)
    assert image_user_ids(client, image, "no-such-user") is None


def test_a_tar_into_missing_directories_belongs_to_the_user(stack: Stack) -> None:
    c = stack.alice
    sid = lease(c, "terminal")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        pkg = tarfile.TarInfo("pkg")  # as `tar c` writes it (mode 0644: tarfile's default)
        pkg.type = tarfile.DIRTYPE
        t.addfile(pkg)
        info = tarfile.TarInfo("pkg/a.txt")
        info.size = 1
        t.addfile(info, io.BytesIO(b"A"))
        hard = tarfile.TarInfo("pkg/hard")
        hard.type, hard.linkname = tarfile.LNKTYPE, "pkg/a.txt"
        t.addfile(hard)
        soft = tarfile.TarInfo("pkg/soft")
        soft.type, soft.linkname = tarfile.SYMTYPE, "a.txt"
        t.addfile(soft)
    r = c.put(
        f"/v1/sandboxes/{sid}/files",
        params={"path": "/opt/new/tree"},
        content=buf.getvalue(),
        headers={"content-type": "application/x-tar"},
    )
    assert r.status_code == 200, r.text
    out = exec_(
        c,
        sid,
        "cd /opt/new/tree && cat pkg/a.txt pkg/hard pkg/soft && echo && "
        "stat -c %u:%g /opt/new /opt/new/tree pkg pkg/a.txt && stat -c %h pkg/a.txt && "
        "touch /opt/new/mine",
    ).json()
    assert out["exit_code"] == 0, out["stderr"]
    assert out["stdout"] == "AAA\n" + "1000:1000\n" * 4 + "2\n"
