"""A session ``run`` answers for exactly the line it wrote (trial 30), through real HTTP and
real Docker: it writes only while the shell is idle at its prompt (else a 409 saying why,
nothing written), erases a partly typed line on a terminal, reports a shell that exited
with its status, and a shell that cannot start or a full sandbox is a clear error."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tests.integration.api.conftest import Stack
from tests.integration.api.test_sessions_api import at_prompt, keys, lease, run, session

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def sid(stack: Stack) -> str:
    return lease(stack.alice)


def post_run(c: httpx.Client, sid: str, ses: str, command: str, **body: Any) -> httpx.Response:
    return c.post(f"/v1/sandboxes/{sid}/sessions/{ses}/run", json={"command": command, **body})


def test_ctrl_c_after_a_refused_run_leaves_the_session_in_step(stack: Stack, sid: str) -> None:
    # Trial 30: the second run was typed ahead behind `sleep 30`; C-c made bash discard it,
    # so its prompt never came and every later run timed out with the raw mark in its output.
    c = stack.alice
    ses = session(c, sid)["id"]
    out = run(c, sid, ses, "sleep 30", timeout_s=1)
    assert (out["timed_out"], out["exit_code"]) == (True, None)
    t0 = time.monotonic()
    r = post_run(c, sid, ses, "echo typed-ahead", timeout_s=5)
    assert r.status_code == 409, r.text
    assert r.headers["content-type"] == "application/problem+json"
    detail = r.json()["detail"]
    assert detail.startswith("the shell is busy: the command of an earlier run is still running")
    assert "nothing was written" in detail and "C-c" in detail
    assert 0.9 < time.monotonic() - t0 < 4  # waited its 1 s for a prompt, not the 5 s
    keys(c, sid, ses, keys=["C-c"])
    for word in ("one", "two", "three"):  # at once: the run waits for C-c's prompt
        out = run(c, sid, ses, f"echo {word}", timeout_s=5)
        assert (out["output"], out["exit_code"], out["timed_out"]) == (f"{word}\r\n", 0, False)
    screen = c.get(f"/v1/sandboxes/{sid}/sessions/{ses}/screen").json()
    assert "typed-ahead" not in "\n".join(screen["display"])  # never written


def test_run_behind_a_command_started_with_keys_is_its_own(stack: Stack, sid: str) -> None:
    # Trial 30: behind keys' `sleep 2; false`, run("echo queued") answered exit 1 and ''.
    c = stack.alice
    ses = session(c, sid)["id"]
    keys(c, sid, ses, text="sleep 0.2; false\n")
    out = run(c, sid, ses, "echo queued", timeout_s=10)  # waits for the keys' prompt
    assert (out["output"], out["exit_code"]) == ("queued\r\n", 0)
    keys(c, sid, ses, text="sleep 30; false\n")
    r = post_run(c, sid, ses, "echo refused", timeout_s=10)
    assert r.status_code == 409, r.text
    assert r.json()["detail"].startswith(
        "the shell is busy: a line sent with keys has not finished"
    )
    keys(c, sid, ses, keys=["C-c"])
    out = run(c, sid, ses, "echo $?", timeout_s=10)  # the status C-c left: bash's 130
    assert (out["output"], out["exit_code"]) == ("130\r\n", 0)
    # An open quote typed with keys: the shell waits for the rest (PS2), so a run would join
    # it; it is refused until C-c.
    keys(c, sid, ses, text='echo "open\n')
    r = post_run(c, sid, ses, "echo joined", timeout_s=3)
    assert r.status_code == 409 and "has not finished" in r.json()["detail"], r.text
    keys(c, sid, ses, keys=["C-c"])
    assert run(c, sid, ses, "echo closed")["output"] == "closed\r\n"


def test_a_partly_typed_line_is_erased_before_a_run_on_a_terminal(stack: Stack, sid: str) -> None:
    # Trial 30: after keys "echo partial" (no Enter), run("echo clean") ran
    # `echo partialecho clean`.
    c = stack.alice
    ses = session(c, sid)["id"]
    keys(c, sid, ses, text="echo partial")
    out = run(c, sid, ses, "echo clean", timeout_s=10)
    assert (out["output"], out["exit_code"]) == ("clean\r\n", 0)
    # Typed while a command runs (the terminal holds it), then read by the next prompt.
    out = run(c, sid, ses, "sleep 0.5", timeout_s=0.1)
    assert out["timed_out"] is True
    keys(c, sid, ses, text="echo half")
    out = run(c, sid, ses, "echo whole", timeout_s=10)
    assert (out["output"], out["exit_code"]) == ("whole\r\n", 0)
    assert run(c, sid, ses, "echo $((6 * 7))")["output"] == "42\r\n"


def test_a_pipe_session_refuses_a_run_behind_a_partly_typed_line(stack: Stack, sid: str) -> None:
    c = stack.alice
    ses = session(c, sid, pty=False)["id"]
    keys(c, sid, ses, text="echo partial")
    r = post_run(c, sid, ses, "echo clean", timeout_s=5)
    assert r.status_code == 409, r.text
    assert r.json()["detail"].startswith("the shell's input holds a partly typed line")
    keys(c, sid, ses, keys=["Enter"])
    out = run(c, sid, ses, "echo clean", timeout_s=10)  # after partial's own prompt
    assert (out["output"], out["exit_code"]) == ("clean\n", 0)


@pytest.mark.parametrize("pty", [False, True])
def test_the_run_after_a_timed_out_one_carries_no_prompt_mark(
    stack: Stack, sid: str, pty: bool
) -> None:
    # Trial 30: on pipes, the run after a timed-out one returned '\x1b]133;D\x07after\n' (the
    # earlier command's prompt mark), having been typed ahead behind it.
    c = stack.alice
    ses = session(c, sid, pty=pty)["id"]
    out = run(c, sid, ses, "sleep 0.6", timeout_s=0.3)
    assert out["timed_out"] is True
    out = run(c, sid, ses, "echo after", timeout_s=10)  # waits for sleep's prompt
    nl = "\r\n" if pty else "\n"
    assert (out["output"], out["exit_code"], out["timed_out"]) == (f"after{nl}", 0, False)
    assert "\x1b" not in out["output"]


@pytest.mark.parametrize("pty", [True, False])
def test_a_run_that_ends_the_shell_reports_its_status(stack: Stack, sid: str, pty: bool) -> None:
    # Trial 30: `exit 3` answered timed_out=true after 2 ms, later calls said "stdin is
    # closed", and the session was still listed with can_run=true.
    c = stack.alice
    ses = session(c, sid, pty=pty)["id"]
    out = run(c, sid, ses, "exit 3", timeout_s=30)
    assert (out["exit_code"], out["timed_out"], out["shell_exited"]) == (3, False, True)
    assert out["duration_ms"] < 10_000
    gone = "the session's shell exited (exit code 3)"
    r = post_run(c, sid, ses, "echo hi")
    assert r.status_code == 409 and r.json()["detail"].startswith(gone), r.text
    r = c.post(f"/v1/sandboxes/{sid}/sessions/{ses}/keys", json={"text": "echo hi\n"})
    assert r.status_code == 409 and r.json()["detail"].startswith(gone), r.text
    listed = {s["id"]: s for s in c.get(f"/v1/sandboxes/{sid}/sessions").json()["sessions"]}
    assert (listed[ses]["can_run"], listed[ses]["running"], listed[ses]["exit_code"]) == (
        False,
        False,
        3,
    )
    assert c.delete(f"/v1/sandboxes/{sid}/sessions/{ses}").status_code == 204


def test_a_shell_that_cannot_be_executed_is_a_400_naming_shell(stack: Stack, sid: str) -> None:
    # Trial 30: 201 (can_run false), the error only on the screen.
    c = stack.alice
    before = c.get(f"/v1/sandboxes/{sid}/sessions").json()
    r = c.post(f"/v1/sandboxes/{sid}/sessions", json={"shell": "/bin/nonexistent"})
    assert r.status_code == 400 and r.headers["content-type"] == "application/problem+json"
    assert r.json()["field"] == "shell"
    assert r.json()["detail"] == "shell: cannot execute /bin/nonexistent: No such file or directory"
    r = c.post(f"/v1/sandboxes/{sid}/sessions", json={"shell": "/etc/passwd", "pty": False})
    assert r.status_code == 400 and r.json()["field"] == "shell", r.text
    assert r.json()["detail"] == "shell: cannot execute /etc/passwd: Permission denied"
    assert c.get(f"/v1/sandboxes/{sid}/sessions").json() == before
    r = c.post(f"/v1/sandboxes/{sid}/processes", json={"cmd": ["/no/such-program"]})
    assert r.status_code == 400 and r.json()["field"] == "cmd", r.text


def test_the_keeper_limit_names_the_sandbox_and_counts_ended_handles(stack: Stack) -> None:
    c = stack.alice
    sid = lease(c)
    handles = []
    for _ in range(64):
        r = c.post(f"/v1/sandboxes/{sid}/processes", json={"cmd": "true"})
        assert r.status_code == 201, r.text
        handles.append(r.json()["handle"])
    r = c.post(f"/v1/sandboxes/{sid}/sessions", json={})
    assert r.status_code == 409, r.text
    assert r.json()["detail"] == (
        f"sandbox {sid} keeps 64 processes and sessions already, the most it may: one that "
        "ended still counts until it is released (DELETE .../processes/{handle} or "
        ".../sessions/{session_id})"
    )
    assert c.delete(f"/v1/sandboxes/{sid}/processes/{handles[0]}").status_code == 204
    ses = session(c, sid)["id"]
    assert run(c, sid, ses, "echo room")["output"] == "room\r\n"
    assert c.delete(f"/v1/sandboxes/{sid}").status_code in (200, 204)


def test_exit_status_survives_the_prompt_and_runs_back_to_back(stack: Stack, sid: str) -> None:
    # The prompt hook hands $? back without a fork (a subshell held the terminal's
    # foreground just after each prompt, so a run right after could look busy).
    c = stack.alice
    ses = session(c, sid)["id"]
    assert run(c, sid, ses, "(exit 42)")["exit_code"] == 42
    assert run(c, sid, ses, "echo $?")["output"] == "42\r\n"
    for i in range(30):
        out = run(c, sid, ses, f"echo n{i}", timeout_s=10)
        assert (out["output"], out["exit_code"]) == (f"n{i}\r\n", 0)
    at_prompt(c, sid, ses)


def test_the_list_answers_while_a_session_keeper_is_stopped(stack: Stack, sid: str) -> None:
    # The list asks each shell's state now; a keeper stopped in the sandbox (the agent's
    # `kill -STOP`) is shown not running after 2 s instead of holding the list 10 s.
    c = stack.alice
    ses = session(c, sid)
    r = c.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": f"kill -STOP {ses['handle']}"})
    assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text
    try:
        t0 = time.monotonic()
        listed = {s["id"]: s for s in c.get(f"/v1/sandboxes/{sid}/sessions").json()["sessions"]}
        assert time.monotonic() - t0 < 6
        assert (listed[ses["id"]]["running"], listed[ses["id"]]["can_run"]) == (False, False)
    finally:
        c.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": f"kill -CONT {ses['handle']}"})
    listed = {s["id"]: s for s in c.get(f"/v1/sandboxes/{sid}/sessions").json()["sessions"]}
    assert (listed[ses["id"]]["running"], listed[ses["id"]]["can_run"]) == (True, True)
    assert run(c, sid, ses["id"], "echo alive")["output"] == "alive\r\n"
