"""Red team: what an agent's own actions could make the bundled rollout runner do with its
sample. A sample the runner takes for an infrastructure failure is re-rolled (no record, no
attempt used), so no action of the agent's may look like one:

- ``kill -9 -1`` as root kills everything in the sandbox, its main process too: the
  container stops, and every later exec answers 409 ``Sandbox not running``. The runner took
  that for a lost sandbox and re-rolled the sample, again and again: a way out of every 0.
  Now the episode ends (``sandbox_stopped``) and its end state is verified like any other;
- a NUL byte in a command: the exec answers 400 and the runner ended the episode as an
  ``error`` (excluded from the loss). A command the API refuses, and a 409 from a sandbox
  still leased, are now the turn's observation and the episode goes on;
- (trial 19, session episodes) ``exit`` ends the session's shell, and each later send-keys
  answered 409: re-rolled 30 times. A session gone from a leased sandbox now ends the
  episode (``sandbox_stopped``) and it is verified; keys the API refuses (over its size)
  ended it as an ``error``: now the turn's observation; a lone surrogate in a reply made the
  client raise ``UnicodeEncodeError`` and stopped the whole runner: now U+FFFD.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import func, select

from policy_client.client import AsyncClient
from policy_client.errors import ConflictError, SandboxStopped
from policy_client.policies.base import EpisodeContext, PolicyAction, PolicyRequest
from policy_client.prompt import DONE_MARKER
from policy_client.rollout import RolloutRunner
from service.db.models import Episode
from tests.integration.api.conftest import Stack, start_stack
from tests.runnerutil import key_of, run_job

pytestmark = [pytest.mark.docker, pytest.mark.redteam]

TASK = "word-frequency-top20"


class Script:
    """Plays ``script`` (one reply per turn, the last one repeated); ``episodes`` counts the
    episodes it played."""

    name, version = "script", "1"

    def __init__(self, script: list[str]) -> None:
        self.script = script
        self.episodes: list[str] = []
        self._lock = threading.Lock()

    def prepare(self, episode: EpisodeContext, client: Any) -> None:
        with self._lock:
            self.episodes.append(episode.episode_id)

    def act(self, batch: list[PolicyRequest]) -> list[PolicyAction]:
        last = len(self.script) - 1
        return [PolicyAction(text=self.script[min(r.turn, last)]) for r in batch]

    def end_episode(self, episode_id: str) -> None:
        pass


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from start_stack(tmp_path_factory.mktemp("runner-dodges"))


def _run(stack: Stack, policy: Script, **config: Any) -> tuple[dict[str, Any], RolloutRunner]:
    """Run a one-sample job of ``TASK`` with ``policy`` through the bundled runner
    (``config``: more ``RolloutConfig`` fields)."""
    r = stack.alice.post(
        "/v1/jobs",
        json={
            "suite": "terminal",
            "task_ids": [TASK],
            "group_size": 1,
            "policy": {"name": "script", "version": "1"},
        },
    )
    assert r.status_code == 201, r.text
    job = r.json()
    key = key_of(stack.alice)
    config = {"concurrency": 1, "max_turns": 5, **config}
    return job, run_job(stack.url, key, job["id"], policy, timeout_s=120, **config)


def _played_once(stack: Stack, job: dict[str, Any], policy: Script) -> None:
    assert len(policy.episodes) == 1, policy.episodes  # never re-rolled
    final = stack.alice.get(f"/v1/jobs/{job['id']}").json()
    assert final["state"] == "done" and final["progress"]["records"] == {"ok": 1}, final
    with stack.ctx.db.read() as s:
        n = s.execute(
            select(func.count()).select_from(Episode).where(Episode.job_id == job["id"])
        ).scalar_one()
    assert n == 1


def test_an_agent_that_stops_its_sandbox_gets_its_zero_not_a_re_roll(stack: Stack) -> None:
    policy = Script(["```bash\nkill -9 -1; sleep 5\n```", "```bash\necho next\n```", DONE_MARKER])
    job, runner = _run(stack, policy)
    _played_once(stack, job, policy)
    (outcome,) = runner.outcomes
    rec = outcome.record
    assert (rec.reward, rec.verifier.status, rec.stop_reason) == (0.0, "ok", "sandbox_stopped")
    assert rec.exclude_from_loss is False


def test_a_verify_slower_than_the_clients_timeout_is_waited_for_not_re_rolled(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Trial 20: a verify runs the task's tests to their limit (120 s, the client's default
    # timeout too), so an agent whose code hangs the tests (or whose FIFO the replay
    # reads) made every verify outlast the client: the runner took it for infrastructure
    # and re-rolled the sample (past the client's retry deadline). Here the clients time
    # out after 3 s and retry for 2 s, and the verification takes 6 s longer than it would.
    from service import episodes

    real = episodes.run_verifier

    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(6)
        return real(*args, **kwargs)

    monkeypatch.setattr(episodes, "run_verifier", slow)
    policy = Script(["```bash\necho hi\n```", DONE_MARKER])
    job, runner = _run(stack, policy, client={"timeout_s": 3.0, "retry_deadline_s": 2.0})
    _played_once(stack, job, policy)
    (outcome,) = runner.outcomes
    assert (outcome.record.reward, outcome.record.verifier.status) == (0.0, "ok")


def test_a_command_the_api_refuses_is_an_observation_not_an_error(stack: Stack) -> None:
    policy = Script(["```bash\necho a\x00b\n```", DONE_MARKER])
    job, runner = _run(stack, policy)
    _played_once(stack, job, policy)
    (outcome,) = runner.outcomes
    rec = outcome.record
    assert (rec.reward, rec.verifier.status, rec.stop_reason) == (0.0, "ok", "complete")
    assert rec.exclude_from_loss is False and rec.error is None
    assert rec.turns[0].exit_code is None


def test_a_409_is_the_policys_only_while_its_sandbox_is_leased(stack: Stack) -> None:
    key = key_of(stack.alice)
    r = stack.alice.post("/v1/sandboxes", json={"template": "terminal", "ttl_s": 300})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    refused = ConflictError(409, "Conflict", "the sandbox's processes hold every pid")
    stopped = SandboxStopped(409, "Sandbox not running", "stopped")

    async def go() -> list[bool]:
        async with AsyncClient(stack.url, key) as aclient:
            runner = RolloutRunner(aclient, Script([DONE_MARKER]))  # type: ignore[arg-type]
            leased = await runner._refused_by_its_sandbox(sid, refused)
            is_stopped = await runner._refused_by_its_sandbox(sid, stopped)
            await aclient.release(sid)
            released = await runner._refused_by_its_sandbox(sid, refused)
            return [leased, is_stopped, released]

    assert asyncio.run(go()) == [True, False, False]


def _keys(*keys: str) -> str:
    return json.dumps({"commands": [{"keystrokes": k, "duration": 1} for k in keys]})


@pytest.mark.parametrize("end", ["exit\n", "kill -9 -1\n", "kill -STOP $PPID\n"])
def test_a_session_whose_shell_is_gone_is_verified_not_re_rolled(stack: Stack, end: str) -> None:
    done = json.dumps({"commands": [], "task_complete": True})
    policy = Script([_keys(end), _keys("ls\n"), done])
    job, runner = _run(stack, policy, mode="session")
    _played_once(stack, job, policy)
    (outcome,) = runner.outcomes
    rec = outcome.record
    assert (rec.reward, rec.verifier.status, rec.stop_reason) == (0.0, "ok", "sandbox_stopped")


def test_session_keys_the_api_refuses_are_an_observation_not_an_error(stack: Stack) -> None:
    done = json.dumps({"commands": [], "task_complete": True})
    policy = Script([_keys("x" * (1 << 21)), done])
    job, runner = _run(stack, policy, mode="session")
    _played_once(stack, job, policy)
    rec = runner.outcomes[0].record
    assert (rec.reward, rec.verifier.status, rec.stop_reason) == (0.0, "ok", "complete")
    assert rec.exclude_from_loss is False


def test_a_reply_with_a_lone_surrogate_does_not_stop_the_runner(stack: Stack) -> None:
    policy = Script(["```bash\necho a\ud800b\n```", DONE_MARKER])
    job, runner = _run(stack, policy)
    _played_once(stack, job, policy)
    rec = runner.outcomes[0].record
    assert (rec.reward, rec.verifier.status, rec.exclude_from_loss) == (0.0, "ok", False)
    assert rec.turns[0].exit_code == 0
