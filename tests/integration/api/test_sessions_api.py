"""Background processes and terminal sessions through real HTTP, real Docker, the channel."""

from __future__ import annotations

import base64
import time
from typing import Any

import httpx
import pytest

from tests.integration.api.conftest import Stack

pytestmark = pytest.mark.docker

PROBLEM = "application/problem+json"


def lease(client: httpx.Client) -> str:
    r = client.post("/v1/sandboxes", json={"template": "terminal", "ttl_s": 300})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def exec_(client: httpx.Client, sid: str, cmd: str) -> dict[str, Any]:
    r = client.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": cmd})
    assert r.status_code == 200, r.text
    return r.json()


def start(client: httpx.Client, sid: str, cmd: str, **body: Any) -> dict[str, Any]:
    r = client.post(f"/v1/sandboxes/{sid}/processes", json={"cmd": cmd, **body})
    assert r.status_code == 201, r.text
    return r.json()


def output(client: httpx.Client, sid: str, handle: int, **params: Any) -> dict[str, Any]:
    r = client.get(f"/v1/sandboxes/{sid}/processes/{handle}/output", params=params)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def sid(stack: Stack) -> str:
    return lease(stack.alice)


# ------------------------------------------------------------------- background processes


def test_kill_ends_the_whole_tree_including_detached_children(stack: Stack, sid: str) -> None:
    c = stack.alice
    proc = start(
        c,
        sid,
        "sleep 1001 & setsid sh -c 'sleep 1002 & wait' & (sleep 1003 &) ; echo up; wait",
    )
    assert output(c, sid, proc["handle"], wait_s=5)["data"] == "up\n"
    before = exec_(c, sid, "pgrep -c -f '^sleep 100[123]$' || true")["stdout"].strip()
    assert before == "3"
    r = c.post(f"/v1/sandboxes/{sid}/processes/{proc['handle']}/signal", json={"signal": 9})
    assert r.status_code == 200, r.text
    assert r.json()["running"] is False and r.json()["exit_code"] == 137
    assert exec_(c, sid, "pgrep -c -f '^sleep 100[123]$' || true")["stdout"].strip() == "0"


# A daemon whose thread-group leader ended alone (SYS_exit): /proc shows the leader as a
# zombie while its worker thread goes on writing a count.
ZOMBIE_LEADER = """
import ctypes, os, threading, time
def work():
    n = 0
    while True:
        n += 1
        with open("/tmp/zl.tmp", "w") as f:
            f.write(str(n))
        os.replace("/tmp/zl.tmp", "/tmp/zl.count")  # a reader never sees it half written
        time.sleep(0.02)
threading.Thread(target=work).start()
time.sleep(0.2)
ctypes.CDLL(None).syscall({"x86_64": 60, "aarch64": 93}[os.uname().machine], 0)
"""


def test_kill_ends_a_detached_process_whose_leader_is_a_zombie(stack: Stack, sid: str) -> None:
    # Regression: the tree kill skipped every process whose /proc stat said Z, so a daemon
    # whose leader called SYS_exit kept its running thread through the kill of its handle.
    c = stack.alice
    r = c.put(f"/v1/sandboxes/{sid}/files", params={"path": "/tmp/zl.py"}, content=ZOMBIE_LEADER)
    assert r.status_code in (200, 201), r.text
    proc = start(c, sid, "setsid python3 /tmp/zl.py & sleep 1; echo up; wait")
    assert output(c, sid, proc["handle"], wait_s=10)["data"] == "up\n"
    count = "cat /tmp/zl.count; sleep 0.3; echo; cat /tmp/zl.count"
    a, b = exec_(c, sid, count)["stdout"].split()
    assert int(b) > int(a)  # the worker thread runs
    states = exec_(c, sid, "ps -o stat= -C python3 || true")["stdout"].split()
    assert states and states[0].startswith("Z"), states  # under a zombie leader
    r = c.post(f"/v1/sandboxes/{sid}/processes/{proc['handle']}/signal", json={"signal": 9})
    assert r.status_code == 200, r.text
    time.sleep(0.2)
    a, b = exec_(c, sid, count)["stdout"].split()
    assert a == b, (a, b)  # nothing writes any more


def test_stdin_by_handle_reaches_a_running_process(stack: Stack, sid: str) -> None:
    c = stack.alice
    proc = start(c, sid, 'echo ready; read -r line; echo "got:$line"; cat; echo eof')
    h = proc["handle"]
    first = output(c, sid, h, wait_s=5)
    assert first["data"] == "ready\n"
    r = c.post(f"/v1/sandboxes/{sid}/processes/{h}/stdin", json={"data": "alpha\n"})
    assert r.status_code == 200, r.text
    got = output(c, sid, h, offset=first["next"], wait_s=5)
    assert got["data"] == "got:alpha\n" and got["offset"] == 6
    raw = base64.b64encode(b"\xff\x00beta\n").decode()
    r = c.post(f"/v1/sandboxes/{sid}/processes/{h}/stdin", json={"data_b64": raw, "close": True})
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 10
    while (st := c.get(f"/v1/sandboxes/{sid}/processes/{h}").json())["running"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert st["exit_code"] == 0
    rest = output(c, sid, h, offset=got["next"])
    assert base64.b64decode(rest["data_b64"]) == b"\xff\x00beta\neof\n"


def test_output_produced_while_nobody_read_comes_back(stack: Stack, sid: str) -> None:
    c = stack.alice
    proc = start(c, sid, "for i in $(seq 1 5000); do echo line$i; done; echo err >&2; exit 7")
    h = proc["handle"]
    deadline = time.monotonic() + 10
    while c.get(f"/v1/sandboxes/{sid}/processes/{h}").json()["running"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    expected = "".join(f"line{i}\n" for i in range(1, 5001))
    out = output(c, sid, h)
    assert out["data"] == expected and out["next"] == len(expected)
    assert out["process"]["exit_code"] == 7
    assert output(c, sid, h, stream="stderr")["data"] == "err\n"
    tail = output(c, sid, h, offset=len(expected) - 9)
    assert tail["data"] == "line5000\n"
    listed = c.get(f"/v1/sandboxes/{sid}/processes").json()["processes"]
    assert h in [p["handle"] for p in listed]


def test_ring_keeps_the_newest_bytes_and_says_what_was_dropped(stack: Stack, sid: str) -> None:
    c = stack.alice
    proc = start(c, sid, "head -c 10000 /dev/zero | tr '\\0' a; printf END", max_output_bytes=4096)
    h = proc["handle"]
    out = output(c, sid, h, wait_s=5)
    deadline = time.monotonic() + 10
    while out["next"] < 10003:
        assert time.monotonic() < deadline
        out = output(c, sid, h, wait_s=1)
    assert out["offset"] == 10003 - 4096 and out["dropped"] == 10003 - 4096
    assert out["data"] == "a" * 4093 + "END"


def test_process_handles_of_others_and_bad_input(stack: Stack, sid: str) -> None:
    c = stack.alice
    proc = start(c, sid, "sleep 30")
    h = proc["handle"]
    r = stack.bob.get(f"/v1/sandboxes/{sid}/processes/{h}")
    assert r.status_code == 404 and r.headers["content-type"].startswith(PROBLEM)
    r = c.get(f"/v1/sandboxes/{sid}/processes/999999")
    assert r.status_code == 404 and r.json()["field"] == "handle"
    r = c.post(f"/v1/sandboxes/{sid}/processes/{h}/stdin", json={"data_b64": "!!"})
    assert r.status_code == 400 and r.json()["field"] == "data_b64"
    r = c.post(f"/v1/sandboxes/{sid}/processes", json={"cmd": "true", "cwd": "/nope"})
    assert r.status_code == 400 and r.json()["field"] == "cwd"
    assert c.delete(f"/v1/sandboxes/{sid}/processes/{h}").status_code == 204
    assert c.get(f"/v1/sandboxes/{sid}/processes/{h}").status_code == 404
    assert exec_(c, sid, "pgrep -c -x sleep || true")["stdout"].strip() == "0"
    actions = [
        e["action"]
        for e in stack.admin.get("/v1/audit", params={"sandbox_id": sid, "limit": 1000}).json()[
            "events"
        ]
    ]
    assert "sandbox.process.start" in actions and "sandbox.process.release" in actions


# ------------------------------------------------------------------------------ sessions


def session(c: httpx.Client, sid: str, **body: Any) -> dict[str, Any]:
    r = c.post(f"/v1/sandboxes/{sid}/sessions", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def run(c: httpx.Client, sid: str, ses: str, command: str, **body: Any) -> dict[str, Any]:
    r = c.post(f"/v1/sandboxes/{sid}/sessions/{ses}/run", json={"command": command, **body})
    assert r.status_code == 200, r.text
    return r.json()


def keys(c: httpx.Client, sid: str, ses: str, **body: Any) -> None:
    r = c.post(f"/v1/sandboxes/{sid}/sessions/{ses}/keys", json=body)
    assert r.status_code == 204, r.text


def screen_until(c: httpx.Client, sid: str, ses: str, want: str) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while True:
        r = c.get(f"/v1/sandboxes/{sid}/sessions/{ses}/screen", params={"wait_s": 0.2})
        assert r.status_code == 200, r.text
        view = r.json()
        if want in "\n".join(view["display"]):
            return view
        assert time.monotonic() < deadline, "\n".join(view["display"])


def at_prompt(c: httpx.Client, sid: str, ses: str) -> None:
    deadline = time.monotonic() + 10
    while True:
        view = c.get(f"/v1/sandboxes/{sid}/sessions/{ses}/screen", params={"wait_s": 0.1}).json()
        if view["display"][view["cursor"][0]] == "$":
            return
        assert time.monotonic() < deadline, "\n".join(view["display"])


@pytest.mark.parametrize("pty", [True, False])
def test_session_keeps_cwd_and_env(stack: Stack, sid: str, pty: bool) -> None:
    c = stack.alice
    ses = session(c, sid, pty=pty)["id"]
    assert (
        run(c, sid, ses, "mkdir -p /tmp/s1 && cd /tmp/s1 && export GREETING=hi")["exit_code"] == 0
    )
    out = run(c, sid, ses, "pwd; echo $GREETING")
    assert out["output"].replace("\r\n", "\n") == "/tmp/s1\nhi\n"
    assert out["exit_code"] == 0 and out["timed_out"] is False
    assert run(c, sid, ses, "(exit 42)")["exit_code"] == 42
    assert c.delete(f"/v1/sandboxes/{sid}/sessions/{ses}").status_code == 204


def test_pty_heredoc_pager_and_repl(stack: Stack, sid: str) -> None:
    c = stack.alice
    ses = session(c, sid, rows=20, cols=70)["id"]
    out = run(c, sid, ses, "cat <<'EOF' > /tmp/h.txt\nfirst\nsecond\nEOF\nwc -l < /tmp/h.txt")
    assert out["exit_code"] == 0 and out["output"].endswith("2\r\n")
    assert run(c, sid, ses, "cat /tmp/h.txt")["output"] == "first\r\nsecond\r\n"
    # A pager: page through 100 lines, then quit with q.
    keys(c, sid, ses, text="seq 1 100 | less", keys=["Enter"])
    view = screen_until(c, sid, ses, "19")
    assert view["display"][0] == "1" and "50" not in view["display"]
    keys(c, sid, ses, keys=["Space"])
    view = screen_until(c, sid, ses, "38")
    keys(c, sid, ses, text="q")
    # A REPL: state lives across keys, Ctrl-C interrupts, exit() returns to the shell.
    keys(c, sid, ses, text="python3 -q", keys=["Enter"])
    screen_until(c, sid, ses, ">>>")
    keys(c, sid, ses, text="x = 6 * 7", keys=["Enter"])
    keys(c, sid, ses, text="print(x + 1)", keys=["Enter"])
    screen_until(c, sid, ses, "43")
    keys(c, sid, ses, text="while True: pass", keys=["Enter", "Enter"])
    screen_until(c, sid, ses, "...")
    time.sleep(0.3)  # ^C flushes typeahead, as on any terminal: let the loop start first
    keys(c, sid, ses, keys=["C-c"])
    screen_until(c, sid, ses, "KeyboardInterrupt")
    keys(c, sid, ses, text="exit()", keys=["Enter"])
    at_prompt(c, sid, ses)  # keys do not wait: the shell prompts once python is gone
    out = run(c, sid, ses, "echo back in $0")
    assert out["output"] == "back in /bin/bash\r\n" and out["exit_code"] == 0
    r = c.post(f"/v1/sandboxes/{sid}/sessions/{ses}/resize", json={"rows": 30, "cols": 100})
    assert r.status_code == 204
    assert run(c, sid, ses, "stty size")["output"] == "30 100\r\n"
    view = c.get(f"/v1/sandboxes/{sid}/sessions/{ses}/screen").json()
    assert len(view["display"]) == 30 and view["scrollback"]


def test_session_timeout_then_ctrl_c_and_bad_input(stack: Stack, sid: str) -> None:
    c = stack.alice
    ses = session(c, sid)["id"]
    out = run(c, sid, ses, "sleep 30", timeout_s=0.3)
    assert out["timed_out"] is True and out["exit_code"] is None
    keys(c, sid, ses, keys=["C-c"])
    assert run(c, sid, ses, "echo ok")["output"].endswith("ok\r\n")
    r = c.post(f"/v1/sandboxes/{sid}/sessions", json={"rows": 0})
    assert r.status_code == 422
    r = c.post(f"/v1/sandboxes/{sid}/sessions/{ses}/keys", json={})
    assert r.status_code == 400 and r.json()["field"] == "keys"
    r = stack.bob.post(f"/v1/sandboxes/{sid}/sessions/{ses}/run", json={"command": "id"})
    assert r.status_code == 404
    r = c.post(f"/v1/sandboxes/{sid}/sessions", json={"cwd": "/missing"})
    assert r.status_code == 400 and r.json()["field"] == "cwd"


def screen(c: httpx.Client, sid: str, ses: str, **params: Any) -> dict[str, Any]:
    r = c.get(f"/v1/sandboxes/{sid}/sessions/{ses}/screen", params=params, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize(
    "bad",
    [r"\033[4J", r"\033[" + "9" * 5000 + "m"],
    ids=["erase-in-display-4", "csi-param-of-5000-digits"],
)
def test_a_sequence_the_emulator_fails_on_leaves_the_screen_readable(
    stack: Stack, sid: str, bad: str
) -> None:
    c = stack.alice
    ses = session(c, sid)["id"]
    keys(c, sid, ses, text=f"printf '{bad}'; echo", keys=["Enter"])
    screen(c, sid, ses, wait_s=0.5)  # 200, not the 500 pyte's exception made
    keys(c, sid, ses, text="echo o''k", keys=["Enter"])
    view = screen_until(c, sid, ses, "\nok\n")
    assert view["dropped"] == 0
    assert run(c, sid, ses, "echo still")["output"] == "still\r\n"
    screen(c, sid, ses)


def test_a_decaln_flood_costs_a_screen_read_seconds_not_minutes(stack: Stack, sid: str) -> None:
    c = stack.alice
    ses = session(c, sid)["id"]
    flood = "python3 -c \"import sys; sys.stdout.write('\\x1b#8' * 60000)\"; echo; echo do''ne"
    assert run(c, sid, ses, flood, timeout_s=30)["exit_code"] == 0
    t0 = time.monotonic()
    view = screen(c, sid, ses)
    assert time.monotonic() - t0 < 10
    assert view["dropped"] > 0 and view["bytes_total"] > 180_000
    assert any(line.startswith("done") for line in view["display"])  # the newest bytes show
    t0 = time.monotonic()
    keys(c, sid, ses, text="echo a''gain", keys=["Enter"])
    screen_until(c, sid, ses, "again")
    assert time.monotonic() - t0 < 10


def test_a_screen_the_emulator_cannot_render_in_budget_is_refused(stack: Stack, sid: str) -> None:
    """One DECALN at 1000x1000 cost pyte 2 to 6 s of one server thread; a size over
    ``MAX_SCREEN_CELLS`` is a 400 naming the field, at start and at resize, and nothing
    changes: no session starts, the session keeps its size."""
    c = stack.alice
    before = c.get(f"/v1/sandboxes/{sid}/sessions").json()
    r = c.post(f"/v1/sandboxes/{sid}/sessions", json={"rows": 1000, "cols": 1000})
    assert r.status_code == 400 and r.headers["content-type"] == "application/problem+json"
    assert r.json()["field"] == "cols" and "32768" in r.json()["detail"], r.json()
    assert c.get(f"/v1/sandboxes/{sid}/sessions").json() == before
    ses = session(c, sid, rows=128, cols=256)  # exactly the most cells allowed
    assert (ses["rows"], ses["cols"]) == (128, 256)
    r = c.post(f"/v1/sandboxes/{sid}/sessions/{ses['id']}/resize", json={"rows": 200, "cols": 200})
    assert r.status_code == 400 and r.json()["field"] == "cols", r.text
    view = screen(c, sid, ses["id"])
    assert len(view["display"]) == 128  # the size it kept
