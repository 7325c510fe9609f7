"""A task whose task.toml names a non-root sandbox user: the agent's execs, sessions and
uploads are that uid, root is refused (the task does not allow it), and the verifier still
runs as root with the tests pristine: the oracle scores 1.0. Real task image, real verifier."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.api.conftest import Stack, start_stack
from tests.integration.api.test_sandboxes_api import run

pytestmark = pytest.mark.docker

TASK = "word-frequency-top20"
SOURCE = Path(__file__).resolve().parents[3] / "tasks" / "terminal" / TASK


@pytest.fixture(scope="module")
def user_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("taskuser")
    folder = shutil.copytree(SOURCE, tmp / "tasks" / "usersuite" / TASK)
    toml = folder / "task.toml"
    text = toml.read_text()
    assert "[environment]\n" in text
    toml.write_text(
        text.replace("[environment]\n", '[environment]\nuser = "solver"\nuid = 1500\ngid = 1600\n')
    )
    yield from start_stack(tmp, tasks_dir=tmp / "tasks", pool_targets={})


def test_a_task_user_runs_the_agent_and_root_verifies(user_stack: Stack) -> None:
    c = user_stack.alice
    r = c.post("/v1/episodes", json={"task_id": TASK, "suite": "usersuite"})
    assert r.status_code == 201, r.text
    ep = r.json()["episodes"][0]
    sid = ep["sandbox_id"]
    assert run(c, sid, "id -u; id -g; stat -c %u:%g /app")["stdout"] == "1500\n1600\n1500:1600\n"
    r = c.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "id -u", "user": "root"})
    assert r.status_code == 403, r.text
    r = c.post(f"/v1/sandboxes/{sid}/sessions", json={})
    assert r.status_code == 201, r.text
    out = c.post(
        f"/v1/sandboxes/{sid}/sessions/{r.json()['id']}/run", json={"command": "id -u"}
    ).json()
    assert out["output"].strip() == "1500"
    r = c.put(
        f"/v1/sandboxes/{sid}/files",
        params={"path": "/solution/solve.sh"},
        content=(SOURCE / "solution" / "solve.sh").read_bytes(),
    )
    assert r.status_code == 200, r.text
    assert run(c, sid, "stat -c %u:%g /solution/solve.sh")["stdout"] == "1500:1600\n"
    done = run(c, sid, "bash /solution/solve.sh && stat -c %u /app/top_words.tsv")
    assert (done["exit_code"], done["stdout"]) == (0, "1500\n"), done["stderr"]
    r = c.post(f"/v1/episodes/{ep['id']}/verify", json={"policy": {"name": "t", "version": "1"}})
    assert r.status_code == 200, r.text
    rec = r.json()
    assert (rec["reward"], rec["verifier"]["status"]) == (1.0, "ok"), rec["verifier"]
    assert rec["verifier"]["details"]["tampered"] == []
