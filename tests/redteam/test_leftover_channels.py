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
from pathlib import Path
from typing import Any

import pytest

from service import rewards
from service.tasks.loader import load_suite
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
def size():
    try:
        return os.path.getsize(R)
    except OSError:  # test.sh has not written it yet
        return 0
while time.time() < end and size() == 0:
    time.sleep(0.001)
while time.time() < end:
    time.sleep(0.001)
    try:
        with open(R, "r+b") as f:
            f.truncate()
            f.write(b"{value}")
    except OSError:  # moved away or refused this moment: the next round tries again
        continue
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
    # what the verdict shows of the test command's end (not the record's timings and
    # random ids: "verify_ms": 396.168 once matched by chance)
    shown = json.dumps(
        {k: rec[k] for k in ("verifier", "reward_components", "error", "missing_reason")}
    )
    assert "40" not in v["details"]["reason"] and "168" not in shown, shown
    assert _private(stack, ep)["signal"] == 40  # SIGRTMIN (34) + 6, for the operator


# In a real sandbox, as the verifier runs it: a root shell with the sandbox's capabilities
# starts a server without DAC_OVERRIDE before the session (as test.sh may); the judge's
# process starts a privileged helper, restricts its children as the observer does, starts a
# fixture's server, then (a test's call) a child and a daemon, and ends the call's leftovers,
# then the session's.
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
def alive(pid):
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False
helper = subprocess.Popen(["sleep", "302"], **quiet)
c._restrict_children()
fixture = subprocess.Popen(["sleep", "304"], **quiet)  # a fixture's server, set up before
mark = c.leftover_mark()  # a test's call begins
child = subprocess.Popen(["sleep", "300"], **quiet)
daemon = subprocess.Popen(["bash", "-c", "setsid sleep 301 </dev/null >/dev/null 2>&1 & echo $!"],
                          stdout=subprocess.PIPE, text=True)
daemon_pid = int(daemon.stdout.readline())
time.sleep(0.3)
print("call ended", c.end_leftovers(mark))
time.sleep(0.2)
print("child", alive(child.pid), "daemon", alive(daemon_pid), "fixture", alive(fixture.pid))
print("session ended", c.end_leftovers())
time.sleep(0.2)
print("fixture", alive(fixture.pid), "helper", alive(helper.pid))
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
    # what the test's call started ends with it; the fixture's server outlives the call
    assert "child False daemon False fixture True" in out, out
    assert "call ended 2" in out or "call ended 3" in out, out  # (and the daemon's bash)
    # the session's end ends the rest it started; a privileged helper is never touched
    assert "session ended 1" in out and "fixture False helper True" in out, out
    assert "server True" in out, out  # started before the session: test.sh's, left alone


JUDGE_STATE = Path(__file__).resolve().parents[1] / "fixtures" / "tasks" / "judge-state"
# Right on its first call (the one dataset it could have seen), then "0" for every other;
# the first call leaves a daemon that empties every dataset the tests wrote up front.
CROSS_TEST = r"""#!/bin/bash
if mkdir /tmp/.first-call 2>/dev/null; then
  awk '{ s += $1 } END { print s + 0 }' "$1" > "$2"
  # it starts emptying only once the call that started it has returned (what the call's
  # own processes do meanwhile is the task's to guard against, as its tests do not)
  empty='sleep 1; while :; do for f in $(dirname "$0")/in*.txt; do : > "$f"; done; sleep 0.01; done'
  setsid bash -c "$empty" "$1" </dev/null >/dev/null 2>&1 &
  exit 0
fi
echo 0 > "$2"
"""


@pytest.mark.parametrize("script", ["oracle", "cross-test-daemon"])
def test_a_daemon_one_test_left_never_reaches_the_next(stack: Stack, script: str) -> None:
    """The daemon the first test's program leaves, which starts emptying the datasets the
    later tests read back a second after the call (a task whose tests trust the disk between
    tests), is gone before it acts. The mechanism's own tests (above and below) are the ones
    that fail without the sweep; what a call's own processes do during the call is the
    fixture's known weakness."""
    stack.ctx.tasks.add_suite(load_suite(JUDGE_STATE))
    ep = episodes.start(stack, "cross-test-daemon", "judge-state")
    if script == "oracle":
        sh(stack, ep, (JUDGE_STATE / "cross-test-daemon" / "solution" / "solve.sh").read_text())
    else:
        _install_at(stack, ep, "/app/sum.sh", CROSS_TEST)
    rec = verify(stack, ep)
    v = rec["verifier"]
    assert v["status"] == "ok", v
    if script == "oracle":
        assert rec["reward"] == 1.0, v
        return
    assert rec["reward"] == 0.0, (v, _private(stack, ep))
    assert v["details"]["tests"] == {"sessions": 1, "total": 3, "passed": 1, "failed": 2}, v
    assert _private(stack, ep)["leftovers_killed"] >= 1


def _install_at(stack: Stack, ep: dict[str, Any], path: str, script: str) -> None:
    sh(stack, ep, f"cat > {path} <<'EOS'\n{script}EOS\nchmod 755 {path}\n")


# A process whose thread-group leader ended alone (SYS_exit) while a worker thread goes on:
# /proc shows the leader as a zombie (a sixth trial's daemon hid from the sweep that way).
ZOMBIE_LEADER = r"""
import ctypes, threading, time
def work():
    while True:
        open("/tmp/.beat", "w").write(str(time.time()))
        time.sleep(0.01)
threading.Thread(target=work).start()
time.sleep(0.1)
open("/tmp/.ready", "w").write("1")
ctypes.CDLL(None).syscall(60, 0)  # SYS_exit: this thread only
"""
ZOMBIE_JUDGE = (
    OBSERVER
    + r"""
import os, subprocess, time
c._restrict_children()
mark = c.leftover_mark()
p = subprocess.Popen(["python3", "-c", ZOMBIE_LEADER])
while not os.path.exists("/tmp/.ready"):
    time.sleep(0.01)
time.sleep(0.1)
state = open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()[0]
print("leader", state, "live", c._live(str(p.pid), state))
print("ended", c.end_leftovers(mark))
time.sleep(0.3)
state = open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()[0]
beat = os.stat("/tmp/.beat").st_mtime
time.sleep(0.3)
print("live", c._live(str(p.pid), state), "beating", os.stat("/tmp/.beat").st_mtime != beat)
# pids that wrapped around: a process started after the mark with a lower pid is still ended
wrapped = (10**9, c.leftover_mark()[1])
time.sleep(0.05)
q = subprocess.Popen(["sleep", "300"])
time.sleep(0.05)
print("wrapped ended", c.end_leftovers(wrapped))
"""
)


def test_a_process_whose_leader_ended_alone_is_still_ended(
    docker_runtime: Any, make_sandbox: Any
) -> None:
    from service.runtime.base import ExecRequest

    cid = make_sandbox()
    code = ZOMBIE_JUDGE.replace("ZOMBIE_LEADER", repr(ZOMBIE_LEADER))
    res = docker_runtime.exec(cid, ExecRequest(cmd=["python3", "-c", code], user="0", timeout_s=60))
    out = (res.stdout + res.stderr).decode()
    assert "leader Z live True" in out, out  # what the sweep saw before as gone
    assert "ended 1" in out and "live False beating False" in out, out
    assert "wrapped ended 1" in out, out


# Trial 26: a leftover whose name is not UTF-8 (a write to /proc/self/comm, or the exec of a
# file named so) made the judge's text read of /proc/<pid>/status raise, and the sweep took
# it for gone. Any read or parse failure of a pid that still exists is now ended.
COMM_JUDGE = (
    OBSERVER
    + r"""
import os, shutil, subprocess, time
c._restrict_children()
shutil.copy("/bin/sleep", b"/tmp/\xff\xfe")
mark = c.leftover_mark()
named = subprocess.Popen(["python3", "-c",
    "open('/proc/self/comm', 'wb').write(b'\\xff\\xfe'); import time; time.sleep(300)"])
execd = subprocess.Popen([b"/tmp/\xff\xfe", "301"])
time.sleep(0.5)
print("parsed", isinstance(c._status(str(named.pid)), tuple),
      isinstance(c._status(str(execd.pid)), tuple))
print("ended", c.end_leftovers(mark))
time.sleep(0.2)
print("named", named.poll(), "execd", execd.poll())
"""
)


def test_a_leftover_named_in_bytes_that_are_not_utf8_is_still_ended(
    docker_runtime: Any, make_sandbox: Any
) -> None:
    from service.runtime.base import ExecRequest

    cid = make_sandbox()
    res = docker_runtime.exec(
        cid, ExecRequest(cmd=["python3", "-c", COMM_JUDGE], user="0", timeout_s=60)
    )
    out = (res.stdout + res.stderr).decode(errors="replace")
    assert "parsed True True" in out, out
    assert "ended 2" in out and "named -9 execd -9" in out, out


# Trial 26: a lineage that never stays one pid (each member clone(CLONE_VM)s its successor
# and exits, ~25 us a generation, pinned off the judge's CPU) was never seen alive from a
# scan's listing to its reads, and the sweep stopped after the first round that found
# nothing (7 of 8 runs survived every sweep). A round now freezes the sandbox with one
# signal to every process (a child being forked gets it too), then reads /proc.
HYDRA = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>
#define K 512
#define SZ (64 * 1024)
static volatile unsigned long *gens;
static double *until;
static char (*stacks)[SZ];
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
static int member(void *arg) {
    long idx = (long)arg;
    for (;;) {
        unsigned long g = ++*gens;
        double t0 = now();
        if (t0 >= *until) break;
        while (now() - t0 < 25e-6) { }
        if (g % 256 == 0) {  /* the heartbeat: proof the lineage still runs */
            int fd = open("/tmp/.hydra-beat", O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (fd >= 0) { char b[32]; write(fd, b, snprintf(b, sizeof b, "%lu\n", g)); close(fd); }
        }
        long next = (idx + 1) % K;
        if (clone(member, stacks[next] + SZ, CLONE_VM | SIGCHLD, (void *)next) > 0)
            syscall(SYS_exit, 0);
    }
    syscall(SYS_exit, 0);
    return 0;
}
static void pin(int judge) {  /* the judge on the first CPU, the lineage on the second */
    cpu_set_t all, a, b;
    if (sched_getaffinity(0, sizeof all, &all) != 0) return;
    int first = -1, second = -1;
    for (int c = 0; c < CPU_SETSIZE && second < 0; c++)
        if (CPU_ISSET(c, &all)) { if (first < 0) first = c; else second = c; }
    if (second < 0) return;
    CPU_ZERO(&a); CPU_SET(first, &a); CPU_ZERO(&b); CPU_SET(second, &b);
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", judge);
    DIR *d = opendir(path);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL)
        if (e->d_name[0] >= '1' && e->d_name[0] <= '9')
            sched_setaffinity(atoi(e->d_name), sizeof a, &a);
    if (d) closedir(d);
    sched_setaffinity(0, sizeof b, &b);
}
int main(int argc, char **argv) {
    void *shared = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    gens = shared;
    until = (double *)((char *)shared + 64);
    stacks = mmap(0, (size_t)K * SZ, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    pin(atoi(argv[1]));
    *until = now() + atof(argv[2]);
    setsid();
    signal(SIGHUP, SIG_IGN);
    if (fork() == 0) { member((void *)0L); _exit(0); }
    return 0;
}
"""
HYDRA_JUDGE = (
    OBSERVER
    + r"""
import os, subprocess, time
c.SWEEP_LOCK = "/tmp/.crucible-sweep.lock"  # the judge's is in /logs, made as it starts
c._restrict_children()
def beat():
    try:
        return open("/tmp/.hydra-beat").read()
    except OSError:
        return ""
started_runs = 0
for run in range(2 * RUNS):  # a run whose lineage has not begun in 5 s (a loaded host) is retried
    if os.path.exists("/tmp/.hydra-beat"):
        os.unlink("/tmp/.hydra-beat")
    mark = c.leftover_mark()
    rc = subprocess.run(["/tmp/hydra", str(os.getpid()), "2"]).returncode
    for _ in range(500):
        time.sleep(0.01)
        if beat():
            break
    started = beat() != ""
    c.end_leftovers(mark)
    time.sleep(0.2)
    before = beat()
    time.sleep(0.3)
    print("run", run, "rc", rc, "started", started, "survived", beat() != before, flush=True)
    time.sleep(2)  # the lineage's time is up either way
    started_runs += started
    if started_runs == RUNS:
        break
"""
)


def test_a_lineage_that_forks_faster_than_a_scan_is_still_ended(
    docker_runtime: Any, make_sandbox: Any
) -> None:
    from service.runtime.base import ExecRequest
    from tests.redteam.native import compile_static

    cid = make_sandbox()
    hydra = compile_static(HYDRA)
    put = ExecRequest(cmd="cat > /tmp/hydra && chmod 755 /tmp/hydra", stdin=hydra, user="0")
    assert docker_runtime.exec(cid, put).exit_code == 0
    runs = 8  # the scanning sweep lost 1 to 6 of 8 such runs
    code = HYDRA_JUDGE.replace("RUNS", str(runs))
    judge = ExecRequest(cmd=["python3", "-c", code], user="0", timeout_s=120)
    res = docker_runtime.exec(cid, judge)
    out = (res.stdout + res.stderr).decode(errors="replace")
    assert out.count("started True") == runs, out
    assert "survived True" not in out, out


# What a freeze keeps runs on: a fixture's server that forks all the time (a child forked
# while the sandbox froze must not be left stopped: the server would wait for it forever),
# and a process a test stopped stays stopped.
KEPT_JUDGE = (
    OBSERVER
    + r"""
import os, signal, subprocess, time
c.SWEEP_LOCK = "/tmp/.crucible-sweep.lock"
c._restrict_children()
def beat():  # the server's count: a builtin writes it (a child's write left it empty
    deadline = time.monotonic() + 2  # for its start-up, and two reads of "" read as stalled)
    while time.monotonic() < deadline:
        try:
            got = open("/tmp/.server-beat").read()
        except OSError:
            got = ""
        if got.strip():
            return got
        time.sleep(0.001)
    return ""
loop = "i=0; while :; do /bin/true; i=$((i+1)); echo $i > /tmp/.server-beat; done"
server = subprocess.Popen(["bash", "-c", loop])
held = subprocess.Popen(["sleep", "300"])
os.kill(held.pid, signal.SIGSTOP)
time.sleep(0.3)
codes = set()
for _ in range(40):
    mark = c.leftover_mark()
    child = subprocess.Popen(["sleep", "300"])
    c.end_leftovers(mark)
    codes.add(child.wait(5))
before = beat()
time.sleep(0.5)
state = open(f"/proc/{held.pid}/stat").read().rsplit(")", 1)[1].split()[0]
print("children", sorted(codes), "server beating", beat() != before, "held", state)
"""
)


def test_what_a_freeze_keeps_runs_on(docker_runtime: Any, make_sandbox: Any) -> None:
    from service.runtime.base import ExecRequest

    cid = make_sandbox()
    judge = ExecRequest(cmd=["python3", "-c", KEPT_JUDGE], user="0", timeout_s=120)
    res = docker_runtime.exec(cid, judge)
    out = (res.stdout + res.stderr).decode(errors="replace")
    assert "children [-9] server beating True held T" in out, out
