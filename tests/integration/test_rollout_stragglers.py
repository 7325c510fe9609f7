"""The rollout runner under a job's straggler policy (``schedule.straggler``), through the real
service (real HTTP, real Docker sandboxes, real verifiers): once the claim is ``deadline_s``
old and ``min_samples`` samples have records, the runner cuts the rest (their turn loops stop,
their sandboxes are released) and completes the item ok, so the server marks them
stragglers; with fewer records the deadline changes nothing; a group done before its
deadline completes normally. The slow samples are a real policy's: it answers ``sleep 1``
turn after turn. And an item timed out as a long tail (``schedule.timeout``) resumes its
sample from its checkpoint on the next claim, the timed-out claim's episode cut."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import func, select

from policy_client.policies.base import EpisodeContext, PolicyAction, PolicyRequest
from policy_client.prompt import DONE_MARKER
from policy_client.rollout import EpisodeOutcome, RolloutRunner
from service.db.models import AuditEvent, Episode, Sandbox, WorkItem
from tests.integration.api.conftest import Stack, start_stack
from tests.runnerutil import key_of, run_job

pytestmark = pytest.mark.docker

TASK = "word-frequency-top20"
SLEEP = "```bash\nsleep 1\n```"


class TailPolicy:
    """The group's episodes take roles in the order they are prepared: ``fast`` declares
    done at once; ``slow`` runs ``sleep 1`` turns until ``slow_s`` seconds after its
    preparation, then declares done; ``endless`` runs ``sleep 1`` turns until ``max_turns``.
    ``turns`` counts each episode's policy calls."""

    name, version = "tail", "1"

    def __init__(self, roles: list[str], slow_s: float = 0.0) -> None:
        self.roles, self.slow_s = list(roles), slow_s
        self.role: dict[str, str] = {}
        self.started: dict[str, float] = {}
        self.turns: dict[str, int] = {}
        self._lock = threading.Lock()

    def prepare(self, episode: EpisodeContext, client: Any) -> None:
        with self._lock:
            self.role[episode.episode_id] = self.roles.pop(0)
            self.started[episode.episode_id] = time.monotonic()

    def act(self, batch: list[PolicyRequest]) -> list[PolicyAction]:
        out = []
        for r in batch:
            ep = r.episode.episode_id
            with self._lock:
                self.turns[ep] = self.turns.get(ep, 0) + 1
            role = self.role[ep]
            if role == "fast" or (
                role == "slow" and time.monotonic() - self.started[ep] >= self.slow_s
            ):
                out.append(PolicyAction(text=DONE_MARKER))
            else:
                out.append(PolicyAction(text=SLEEP))
        return out

    def end_episode(self, episode_id: str) -> None:
        pass


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from start_stack(tmp_path_factory.mktemp("stragglers"))


def _job(stack: Stack, group_size: int, straggler: dict[str, Any]) -> dict[str, Any]:
    r = stack.alice.post(
        "/v1/jobs",
        json={
            "suite": "terminal",
            "task_ids": [TASK],
            "group_size": group_size,
            "policy": {"name": "tail", "version": "1"},
            "schedule": {"straggler": straggler},
        },
    )
    assert r.status_code == 201, r.text
    return r.json()


def _run(stack: Stack, job_id: str, policy: TailPolicy, timeout_s: float) -> RolloutRunner:
    return run_job(
        stack.url,
        key_of(stack.alice),
        job_id,
        policy,
        timeout_s=timeout_s,
        concurrency=1,
        max_turns=200,
    )


def _episodes(stack: Stack, job_id: str) -> dict[str, Episode]:
    with stack.ctx.db.read() as s:
        rows = s.execute(select(Episode).where(Episode.job_id == job_id)).scalars()
        return {e.id: e for e in rows}


def _sandbox_state(stack: Stack, sandbox_id: str) -> str:
    with stack.ctx.db.read() as s:
        return s.execute(select(Sandbox.state).where(Sandbox.id == sandbox_id)).scalar_one()


def test_the_runner_cuts_stragglers_after_the_deadline_once_m_samples_are_recorded(
    stack: Stack,
) -> None:
    # n=3, m=2, deadline 4 s: at the deadline only the fast sample has a record (the slow
    # one runs until 8 s after its start), so nothing is cut; when the slow one is recorded
    # the endless one (200 turns of `sleep 1`) is cut
    job = _job(stack, 3, {"min_samples": 2, "deadline_s": 4})
    policy = TailPolicy(["fast", "slow", "endless"], slow_s=8.0)
    t0 = time.monotonic()
    runner = _run(stack, job["id"], policy, timeout_s=45)
    took = time.monotonic() - t0
    outcomes: list[EpisodeOutcome] = runner.outcomes
    by_role = {policy.role[o.record.episode_id]: o.record for o in outcomes}
    assert sorted(by_role) == ["fast", "slow"], by_role
    assert all(r.verifier.status == "ok" for r in by_role.values())
    assert by_role["slow"].stop_reason == "complete" and len(by_role["slow"].turns) >= 4
    (endless,) = [e for e, role in policy.role.items() if role == "endless"]
    assert runner.stragglers == [endless]
    episodes = _episodes(stack, job["id"])
    final = stack.alice.get(f"/v1/jobs/{job['id']}").json()
    assert final["state"] == "done", final["progress"]
    stragglers = final["progress"]["schedule"]["stragglers"]
    assert [s["samples"] for s in stragglers] == [[episodes[endless].sample_idx]]
    assert final["progress"]["records"] == {"ok": 2}
    assert final["progress"]["expected_records"] == 2 and final["progress"]["missing"] == []
    assert took < 40, took
    # the endless episode's turn loop stopped and its sandbox was released by the runner;
    # the server then abandons the episode (its item is no longer claimed)
    assert _sandbox_state(stack, episodes[endless].sandbox_id) == "released"
    turns = policy.turns[endless]
    time.sleep(1.5)
    assert policy.turns[endless] == turns
    stack.wait_for(lambda: _episodes(stack, job["id"])[endless].state == "abandoned", 30)


def test_a_group_done_before_its_deadline_completes_normally(stack: Stack) -> None:
    job = _job(stack, 3, {"min_samples": 1, "deadline_s": 120})
    policy = TailPolicy(["fast", "slow", "fast"], slow_s=2.0)
    runner = _run(stack, job["id"], policy, timeout_s=45)
    assert len(runner.outcomes) == 3 and runner.stragglers == []
    assert all(o.record.verifier.status == "ok" for o in runner.outcomes)
    final = stack.alice.get(f"/v1/jobs/{job['id']}").json()
    assert final["state"] == "done", final["progress"]
    assert final["progress"]["schedule"]["stragglers"] == []
    assert final["progress"]["records"] == {"ok": 3}


class TimeoutPolicy:
    """Task ``FAST`` runs ``sleep 3`` once, then declares done; the first episode of task
    ``LONG`` runs ``sleep 1`` turns until ``max_turns`` (the long tail), any later one (the
    resumed sample) declares done at once."""

    name, version = "tail", "1"

    def __init__(self) -> None:
        self.first_long: str | None = None
        self._lock = threading.Lock()

    def prepare(self, episode: EpisodeContext, client: Any) -> None:
        with self._lock:
            if episode.task_id == LONG and self.first_long is None:
                self.first_long = episode.episode_id

    def act(self, batch: list[PolicyRequest]) -> list[PolicyAction]:
        out = []
        for r in batch:
            if r.episode.task_id == FAST:
                text = "```bash\nsleep 3\n```" if r.turn == 0 else DONE_MARKER
            else:
                text = SLEEP if r.episode.episode_id == self.first_long else DONE_MARKER
            out.append(PolicyAction(text=text))
        return out

    def end_episode(self, episode_id: str) -> None:
        pass


FAST, LONG = "access-log-top-ips", "word-frequency-top20"


def _last_seq(stack: Stack) -> int:
    with stack.ctx.db.read() as s:
        return s.execute(select(func.max(AuditEvent.seq))).scalar() or 0


def _events(stack: Stack, since: int) -> str:
    """The audit trail since ``since``, a line per event (what a failure message shows)."""
    with stack.ctx.db.read() as s:
        rows = s.execute(
            select(AuditEvent).where(AuditEvent.seq > since).order_by(AuditEvent.seq)
        ).scalars()
        return "\n".join(f"{e.ts[11:23]} {e.action} {str(e.details)[:200]}" for e in rows)


def test_an_item_timed_out_as_a_long_tail_resumes_from_its_checkpoint(stack: Stack) -> None:
    # bob's first items of these tasks: FAST's duration d is the only measurement, so LONG's
    # claim times out at 2 d (at the next claim, the idle worker's poll); the next claim
    # resumes LONG's sample from its last checkpoint in a new sandbox and completes it. The
    # timed-out claim's slot finds its claim gone at its next heartbeat and cuts its episode
    # (else it would run its 200 turns: the server's release of its sandbox can meet a
    # checkpoint's snapshot and be refused, and exec goes on in a sandbox still leased). The
    # two slots claim under their own worker names: under one name the old slot's complete
    # (its episode lost) re-queued the new claim, and a fresh episode ran beside the resumed one
    r = stack.bob.post(
        "/v1/jobs",
        json={
            "suite": "terminal",
            "task_ids": [FAST, LONG],
            "policy": {"name": "tail", "version": "1"},
            "schedule": {"order": "fifo", "timeout": {"factor": 2, "floor_s": 1, "min_samples": 1}},
        },
    )
    assert r.status_code == 201, r.text
    job = r.json()
    policy = TimeoutPolicy()
    since = _last_seq(stack)
    runner = run_job(
        stack.url,
        key_of(stack.bob),
        job["id"],
        policy,
        timeout_s=50,
        concurrency=2,
        max_turns=200,
        checkpoint_every=1,
        claim_lease_s=4,  # a heartbeat every 1.3 s finds the claim gone
    )
    final = stack.bob.get(f"/v1/jobs/{job['id']}").json()
    assert final["state"] == "done", final["progress"]
    assert final["progress"]["records"] == {"ok": 2}
    by_task = {o.record.task_id: o.record for o in runner.outcomes}
    assert sorted(o.record.task_id for o in runner.outcomes) == sorted([FAST, LONG])
    long = by_task[LONG]
    assert long.episode_id != policy.first_long
    assert long.resumed_from is not None, _events(stack, since)
    assert long.stop_reason == "complete" and long.verifier.status == "ok"
    assert all(t.action == "sleep 1" for t in long.turns) and long.turns  # carried over
    with stack.ctx.db.read() as s:
        item = s.execute(
            select(WorkItem).where(WorkItem.job_id == job["id"], WorkItem.task_id == LONG)
        ).scalar_one()
        timeouts = [
            e.details["work_item_id"]
            for e in s.execute(
                select(AuditEvent).where(AuditEvent.action == "job.item_timeout")
            ).scalars()
            if e.details.get("job_id") == job["id"]
        ]
    assert item.state == "done" and item.attempts >= 1  # the timeout used an attempt
    assert timeouts and set(timeouts) == {item.id}, timeouts
    episodes = _episodes(stack, job["id"])
    later = [e for e in episodes.values() if e.task_id == LONG and e.id != policy.first_long]
    assert later and all(e.timing.get("resumed") for e in later), _events(stack, since)
    assert _sandbox_state(stack, episodes[policy.first_long].sandbox_id) == "released"
    stack.wait_for(lambda: _episodes(stack, job["id"])[policy.first_long].state == "abandoned")
    assert runner.stragglers == []
