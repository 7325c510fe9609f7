"""The SDK's session and kept-process methods against the real service (real HTTP, Docker)."""

from __future__ import annotations

import time

import pytest

from policy_client import Client
from policy_client.errors import APIError, Forbidden
from tests.integration.api.conftest import Stack

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def client(stack: Stack) -> Client:
    key = stack.alice.headers["authorization"].split(" ", 1)[1]
    return Client(stack.url, key)


def test_session_methods(client: Client) -> None:
    with client.sandbox("terminal", ttl_s=300) as sb:
        s = client.create_session(sb.id, rows=10, cols=40)
        assert (s.rows, s.cols, s.pty, s.can_run) == (10, 40, True, True)
        assert [x.id for x in client.list_sessions(sb.id).sessions] == [s.id]
        run = client.session_run(sb.id, s.id, "cd /tmp && export ZZ=7")
        assert (run.exit_code, run.timed_out) == (0, False)
        run = client.session_run(sb.id, s.id, "echo $PWD $ZZ; id -u")
        assert (run.output.replace("\r\n", "\n"), run.exit_code) == ("/tmp 7\n1000\n", 0)
        client.send_keys(sb.id, s.id, text="echo typed", keys=["Enter"])
        deadline = time.monotonic() + 10
        screen = client.screen(sb.id, s.id, wait_s=1)
        while "typed" not in screen.display and time.monotonic() < deadline:
            screen = client.screen(sb.id, s.id, wait_s=1)
        assert "typed" in screen.display and screen.running
        client.resize_session(sb.id, s.id, rows=20, cols=60)
        assert len(client.screen(sb.id, s.id).display) == 20
        client.close_session(sb.id, s.id)
        assert client.list_sessions(sb.id).sessions == []


def test_kept_process_methods(client: Client) -> None:
    with client.sandbox("terminal", ttl_s=300) as sb:
        p = client.start_process(sb.id, "read line; echo got:$line; sleep 1000")
        assert p.running and p.stdin_open
        assert [x.handle for x in client.list_processes(sb.id).processes] == [p.handle]
        client.write_stdin(sb.id, p.handle, data="hello\n")
        out = client.process_output(sb.id, p.handle, wait_s=5)
        assert (out.data, out.offset, out.next) == ("got:hello\n", 0, 10)
        st = client.signal_process(sb.id, p.handle, signal=9)
        deadline = time.monotonic() + 5
        while st.running and time.monotonic() < deadline:
            st = client.get_process(sb.id, p.handle)
        assert (st.running, st.exit_code, st.signal) == (False, 137, 9)
        client.release_process(sb.id, p.handle)
        with pytest.raises(APIError) as info:
            client.get_process(sb.id, p.handle)
        assert info.value.status == 404
        root = client.start_process(sb.id, "id -u", user="root")  # terminal allows root
        assert client.process_output(sb.id, root.handle, wait_s=5).data == "0\n"


def test_a_template_without_root_refuses_another_user(stack: Stack, client: Client) -> None:
    terminal = stack.ctx.templates.get("terminal")
    stack.ctx.templates.register(
        terminal.model_copy(update={"name": "sdk-locked", "allow_root": False})
    )
    with client.sandbox("sdk-locked", ttl_s=300) as sb:
        for start in (
            lambda: client.start_process(sb.id, "true", user="root"),
            lambda: client.create_session(sb.id, user="0"),
            lambda: client.exec(sb.id, "true", user="daemon"),
        ):
            with pytest.raises(Forbidden) as info:
                start()
            assert (info.value.status, info.value.field) == (403, "user")
        assert client.list_processes(sb.id).processes == []
        assert client.list_sessions(sb.id).sessions == []
