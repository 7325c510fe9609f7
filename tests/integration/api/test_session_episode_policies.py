"""Session episodes (``RolloutConfig(mode="session")``) through a real rollout job: the
bundled oracle and no-op policies answer in Terminus JSON there and score 1.0 and 0.0, a
policy that cannot drive the mode is refused up front, and a keystrokes string that is
exactly a tmux key name (``"C-c"``) is sent as that key (trial 30). Real HTTP, real Docker,
the real task image and verifier."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from policy_client import AsyncClient, Client
from policy_client.policies.base import EpisodeContext, PolicyAction, PolicyRequest
from policy_client.policies.scripted import NoopPolicy, OraclePolicy
from policy_client.rollout import RolloutConfig, RolloutRunner
from policy_client.schemas import RewardRecord
from tests.integration.api.conftest import Stack

pytestmark = pytest.mark.docker

SUITE_DIR = Path(__file__).resolve().parents[3] / "tasks" / "terminal"
TASK = "access-log-top-ips"


EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "terminus_agent.py"


def run_session_job(stack: Stack, policy: Any, *, max_turns: int = 6) -> RewardRecord:
    """One session episode of ``TASK`` with ``policy``, through the example's job runner."""
    spec = importlib.util.spec_from_file_location("terminus_agent", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    sys.modules["terminus_agent"] = example
    spec.loader.exec_module(example)
    key = stack.alice.headers["authorization"].split(" ", 1)[1]
    return example.run_session_job(stack.url, key, policy, task=TASK, max_turns=max_turns)


def test_the_oracle_solves_a_task_in_session_mode(stack: Stack) -> None:
    # Trial 30: its reply was a ```bash fence, every turn a parse error: 0.0 at max_turns.
    record = run_session_job(stack, OraclePolicy(SUITE_DIR))
    assert (record.reward, record.verifier.status, record.stop_reason) == (1.0, "ok", "complete")
    assert record.policy.version == "1+promptterminus-2"
    first = json.loads(record.turns[0].action)
    assert first["commands"] == [
        {
            "keystrokes": 'bash /solution/solve.sh; echo "crucible-oracle-exit=$?"\n',
            "duration": 600.0,
        }
    ]
    assert record.turns[0].keys == [first["commands"][0]["keystrokes"]]
    assert "crucible-oracle-exit=0" in (record.turns[0].screen or "")
    assert json.loads(record.turns[-1].action)["task_complete"] is True


def test_the_noop_scores_zero_in_session_mode_by_declaring_done(stack: Stack) -> None:
    record = run_session_job(stack, NoopPolicy())
    assert (record.reward, record.stop_reason, len(record.turns)) == (0.0, "complete", 1)
    assert json.loads(record.turns[0].action) == {
        "analysis": "",
        "plan": "",
        "commands": [],
        "task_complete": True,
    }


class ExecOnly:
    """A scripted policy that only knows exec mode's format."""

    name, version, modes = "exec-only", "1", ("exec",)

    def act(self, batch: list[PolicyRequest]) -> list[PolicyAction]:
        return [PolicyAction(text="```bash\nls\n```") for _ in batch]

    def prepare(self, episode: EpisodeContext, client: Any) -> None:
        pass

    def end_episode(self, episode_id: str) -> None:
        pass


def test_a_policy_that_cannot_drive_the_mode_is_refused_up_front(stack: Stack) -> None:
    key = stack.alice.headers["authorization"].split(" ", 1)[1]

    async def build(mode: str) -> RolloutRunner:
        async with AsyncClient(stack.url, key) as aclient:
            with Client(stack.url, key) as client:
                config = RolloutConfig(mode=mode)  # type: ignore[arg-type]
                return RolloutRunner(aclient, ExecOnly(), config=config, sync_client=client)

    with pytest.raises(ValueError, match=r"cannot drive 'session' episodes") as err:
        asyncio.run(build("session"))
    assert "answers only in 'exec' mode" in str(err.value)
    assert asyncio.run(build("exec")).config.mode == "exec"  # its own mode


class CtrlC:
    """Starts a long sleep, interrupts it with the tmux key name, then shows ``$?``."""

    name, version = "ctrl-c", "1"

    def act(self, batch: list[PolicyRequest]) -> list[PolicyAction]:
        out = []
        for r in batch:
            commands = [
                {"keystrokes": "sleep 300\n", "duration": 0.5},
                {"keystrokes": "C-c", "duration": 5.0},
                {"keystrokes": "echo after-$?\n", "duration": 5.0},
            ]
            reply = {"commands": commands if r.turn == 0 else [], "task_complete": r.turn > 0}
            out.append(PolicyAction(text=json.dumps(reply)))
        return out

    def prepare(self, episode: EpisodeContext, client: Any) -> None:
        pass

    def end_episode(self, episode_id: str) -> None:
        pass


def test_a_tmux_key_name_as_keystrokes_is_sent_as_that_key(stack: Stack) -> None:
    # Trial 30: "C-c" was typed as three characters onto the sleep's terminal.
    record = run_session_job(stack, CtrlC())
    turn = record.turns[0]
    assert turn.keys == ["sleep 300\n", "C-c", "echo after-$?\n"]  # as the policy wrote them
    lines = (turn.screen or "").rstrip().splitlines()
    assert lines[-3:] == ["$ echo after-$?", "after-130", "$"], lines
    assert "C-c" not in (turn.screen or "")
