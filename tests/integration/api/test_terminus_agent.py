"""examples/terminus_agent.py end to end: a session episode (keys sent, screen read; no exec,
no file API) solves a bundled terminal task, and the real verifier scores it 1.0. Real
Docker, real HTTP, the real task image and verifier."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tests.integration.api.conftest import Stack

pytestmark = pytest.mark.docker

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "terminus_agent.py"
TASK = "access-log-top-ips"


def _example():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("terminus_agent", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["terminus_agent"] = module
    spec.loader.exec_module(module)
    return module


def test_the_terminus_agent_scores_one_through_send_keys_alone(stack: Stack) -> None:
    agent = _example()
    key = stack.alice.headers["authorization"].split(" ", 1)[1]
    record = agent.run_agent(stack.url, key, task=TASK)
    assert (record.reward, record.verifier.status, record.stop_reason) == (1.0, "ok", "complete")
    assert record.policy.version == "1+promptterminus-2"
    turns = record.turns
    assert len(turns) == 3
    # turn 0 typed the solution (setup, mkdir, one heredoc per file), turn 1 ran it, turn 2
    # only read the screen
    solve = (agent.SUITE_DIR / TASK / "solution" / "solve.sh").read_text()
    assert turns[0].keys == [
        agent.SETUP_KEYS,
        "mkdir -p /solution\n",
        agent.heredoc_keys("/solution/solve.sh", solve),
    ]
    assert turns[1].keys == [agent.RUN_KEYS]
    assert turns[2].keys == []
    # the screens are what the terminal showed: the heredoc's end, then the exit status
    # right above a fresh prompt
    assert agent.DELIMITER in turns[0].screen and turns[0].screen.rstrip().endswith("$")
    lines = turns[1].screen.rstrip().splitlines()
    assert lines[-2:] == ["crucible-exit=0", "$"]
    assert turns[2].screen == turns[1].screen
    # the agent acted only by keys: after its session started, no exec and no file upload
    r = stack.admin.get("/v1/audit", params={"sandbox_id": record.sandbox_id, "limit": 1000})
    assert r.status_code == 200, r.text
    actions = [e["action"] for e in r.json()["events"]]
    agent_part = actions[actions.index("sandbox.session.start") :]
    assert agent_part.count("sandbox.session.keys") == 4, agent_part
    assert not {"sandbox.exec", "sandbox.file_put"} & set(agent_part), agent_part
