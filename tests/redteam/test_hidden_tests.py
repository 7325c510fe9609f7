"""Red team: what the processes the tests start can reach (issue 9). The agent's own
programs are among them (the tests run them), so a program written to read the hidden
tests' expected values, or to import their helpers, or to take the session keys, would be
paid without solving the task. The tests and the key file belong to a user no process runs
as, and the judge's children lose the capabilities that bypass file modes or switch users.

The fixture's own tests (pristine, run by the judge) probe it from a child: reading and
listing the tests, reading the key file, chmod, chown, setuid/setgid to the owner,
``setpriv``, ``os.system``, ``os.popen`` and ``os.fork``. Its twin declares
``[crucible] children_privileged = true``: the same probes then succeed, so it scores 0.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from service import rewards
from service.tasks.loader import load_suite
from tests.integration.api.conftest import Stack
from tests.redteam import episodes
from tests.redteam.episodes import sh, verify

pytestmark = [pytest.mark.docker, pytest.mark.redteam]

SUITE = Path(__file__).resolve().parents[1] / "fixtures" / "tasks" / "hidden-tests"


@pytest.mark.parametrize(
    ("task", "reward"), [("children-cannot-read", 1.0), ("children-privileged", 0.0)]
)
def test_the_tests_children_cannot_reach_the_hidden_tests(
    stack: Stack, task: str, reward: float
) -> None:
    stack.ctx.tasks.add_suite(load_suite(SUITE))
    ep = episodes.start(stack, task, "hidden-tests")
    sh(stack, ep, "echo ok > /app/answer.txt")
    rec = verify(stack, ep)
    assert (rec["reward"], rec["verifier"]["status"]) == (reward, "ok"), rec["verifier"]
    assert rec["reward_components"]["tests_total"] == 6
    # trial 26: workers that spawn and forkserver start (and a raw fork's exec) keep no
    # capabilities, unless the task declared its children privileged
    tests = rewards.by_episode(stack.ctx.db, ep["id"]).verifier.details["private"]["tests"]
    outcome = tests["test_outputs.py::test_processes_started_by_any_api_are_restricted"]
    assert outcome == ("passed" if reward == 1.0 else "failed"), tests
