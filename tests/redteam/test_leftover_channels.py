"""Red team: what the programs the tests start can say through the verdict.

A fifth trial's program (the agent's ``store_report.sh``, which the tests run: a child of
the judge, uid 0 without ``DAC_OVERRIDE``) left a daemon behind that read pytest's JUnit
report (hidden test names, the expected output in an assertion diff) and wrote it into
``reward.txt`` after ``test.sh`` did, as digits: the public ``reward_file`` component and the
out-of-range reason showed them (~53 bits a verification). A variant sent ``SIGRTMIN+d`` to
the test command, and the public reason named the signal. The class fix: the judge kills
every process that runs without ``DAC_OVERRIDE`` once its tests are done
(``crucible_observer.end_leftovers``), and the public verdict is built from the observed
counts only (the reward file's values, exit codes and signals are private).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest

from service import rewards
from tests.integration.api.conftest import Stack
from tests.redteam import episodes
from tests.redteam.episodes import sh, verify

pytestmark = [pytest.mark.docker, pytest.mark.redteam]

TASK = "fix-shell-report-pipeline"
SECRET_DIGITS = "6079044560542309"  # stands for what the daemon read in the run

# A daemon that waits for test.sh's reward.txt, then keeps rewriting it with the digits.
REWRITER = """
import os, time
R = "/logs/verifier/reward.txt"
end = time.time() + 120
while time.time() < end:
    try:
        if os.path.getsize(R) > 0:
            break
    except OSError:
        pass
    time.sleep(0.001)
while time.time() < end:
    try:
        fd = os.open(R, os.O_WRONLY | os.O_TRUNC)
        os.write(fd, b"{value}")
        os.close(fd)
    except OSError:
        pass
    time.sleep(0.001)
"""

# The script the tests run: start the daemon once (double fork, own session), print a wrong
# report.
SCRIPT = """#!/bin/bash
if mkdir /tmp/.leftover-lock 2>/dev/null; then
  setsid python3 /app/.daemon.py </dev/null >/dev/null 2>&1 &
fi
[ -d "$1" ] || exit 2
printf 'x\\n' > "$2"
exit 0
"""

# The script the tests run signals the test command with a number it chose.
SIGNALLER = r"""#!/bin/bash
for p in /proc/[0-9]*; do
  if [ "$(tr '\0' ' ' < $p/cmdline 2>/dev/null)" = "bash /tests/test.sh " ]; then
    kill -s RTMIN+6 "${p#/proc/}"
  fi
done
printf 'x\n' > "$2"
exit 0
"""


def _install(stack: Stack, ep: dict[str, Any], script: str, daemon: str = "") -> None:
    sh(
        stack,
        ep,
        f"cat > /app/bin/store_report.sh <<'EOS'\n{script}EOS\n"
        f"chmod 755 /app/bin/store_report.sh\ncat > /app/.daemon.py <<'EOS'\n{daemon}EOS\n",
    )


def _private(stack: Stack, ep: dict[str, Any]) -> dict[str, Any]:
    """The stored record's private details (what an operator reads)."""
    stored = rewards.by_episode(stack.ctx.db, ep["id"])
    assert stored is not None
    return stored.verifier.details["private"]


@pytest.mark.parametrize("value", [SECRET_DIGITS, "0." + SECRET_DIGITS])
def test_a_daemon_the_tests_child_left_cannot_write_the_report(stack: Stack, value: str) -> None:
    ep = episodes.start(stack, TASK, "terminal")
    _install(stack, ep, SCRIPT, REWRITER.replace("{value}", value))
    rec = verify(stack, ep)
    v = rec["verifier"]
    assert (rec["reward"], v["status"]) == (0.0, "ok"), v
    assert SECRET_DIGITS not in json.dumps(rec), rec  # the tenant's view
    private = _private(stack, ep)
    # the daemon was killed when the tests were done, before test.sh wrote reward.txt
    assert private["leftovers_killed"] >= 1, private
    assert private["reward_file"] == {"reward_file": 0.0}, private


def test_a_signal_the_tests_child_chose_is_not_in_the_public_verdict(stack: Stack) -> None:
    ep = episodes.start(stack, TASK, "terminal")
    _install(stack, ep, SIGNALLER)
    rec = verify(stack, ep)
    v = rec["verifier"]
    assert (rec["reward"], v["status"], v["details"]["dodge"]) == (0.0, "ok", "killed"), v
    assert v["details"]["reason"] == "the test command was killed", v["details"]
    shown = json.dumps(rec)
    assert "40" not in v["details"]["reason"] and "168" not in shown, shown
    assert _private(stack, ep)["signal"] == 40  # SIGRTMIN (34) + 6, for the operator


# In a real sandbox, as the verifier runs it: a root shell with the sandbox's capabilities
# starts a server without DAC_OVERRIDE before the session (as test.sh may), then the judge's
# process starts a privileged helper, restricts its children as the observer does, starts a
# child and a daemon of its own session, and ends the session's leftovers.
OBSERVER = "import sys; sys.path.insert(0, '/opt/crucible/py'); import crucible_observer as c\n"
SERVER = (
    OBSERVER
    + "import subprocess as s; c._restrict_children()\n"
    + "print(s.Popen(['sleep', '303'], stdout=s.DEVNULL, stderr=s.DEVNULL).pid)\n"
)
LEFTOVERS = (
    OBSERVER
    + r"""
import subprocess, time
quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
helper = subprocess.Popen(["sleep", "302"], **quiet)
c._restrict_children()
child = subprocess.Popen(["sleep", "300"], **quiet)
daemon = subprocess.Popen(["bash", "-c", "setsid sleep 301 </dev/null >/dev/null 2>&1 & echo $!"],
                          stdout=subprocess.PIPE, text=True)
daemon_pid = int(daemon.stdout.readline())
time.sleep(0.3)
print("ended", c.end_leftovers())
time.sleep(0.2)
def alive(pid):
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False
print("child", alive(child.pid), "daemon", alive(daemon_pid), "helper", alive(helper.pid))
helper.kill()
"""
)


def test_the_sessions_leftovers_end_and_what_came_before_stays(
    docker_runtime: Any, make_sandbox: Any
) -> None:
    from service.runtime.base import ExecRequest

    cid = make_sandbox()
    script = (
        f"server=$(python3 -c {shlex.quote(SERVER)}); sleep 0.2; "
        f"python3 -c {shlex.quote(LEFTOVERS)}; "
        "echo server $(test -d /proc/$server && echo True || echo False); kill $server"
    )
    res = docker_runtime.exec(cid, ExecRequest(cmd=["bash", "-c", script], user="0", timeout_s=60))
    out = (res.stdout + res.stderr).decode()
    assert "child False daemon False helper True" in out, out
    assert "server True" in out, out  # started before the session: test.sh's, left alone
    assert "ended 2" in out or "ended 3" in out, out  # the child, the daemon (and its bash)
