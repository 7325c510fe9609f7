"""Red team: end states read through the engine's archive API, one path at a time.

That is how a control plane without the engine's storage reads every end state (the compose
stack: ``read_host_layers = false``), and how any control plane reads a resumed episode's
(its changes lie in a checkpoint's image layers). A fourth trial turned 0s into errors there
with one shell command each: a name that is not UTF-8 (the engine's diff and URLs cannot
carry it), a symlink loop (the engine resolves the path it is asked for), a file turned
into a directory (the engine's diff cannot mark it; the replay meets a file). A fifth:
a tree deeper than PATH_MAX (the engine's own diff fails), and checkpoint-then-resume on
such a control plane (it cannot diff a resumed episode: checkpoints are refused there).
Each is the end state's doing: 0 with ``status=ok``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.api.conftest import Stack, start_stack
from tests.redteam.episodes import TRAJ, sh, start, verify

pytestmark = [pytest.mark.docker, pytest.mark.redteam]

TASK = "word-frequency-top20"
PRIMITIVES = {
    "control": "touch /app/plain-name",
    "non-utf8-name": "touch /app/$'\\xff'",
    "symlink-loop": "ln -s loop /app/loop",
    "file-to-dir": "rm /etc/debian_version && mkdir /etc/debian_version && touch "
    "/etc/debian_version/x",
    "dir-to-file": "rm -rf /etc/cron.daily && echo f > /etc/cron.daily",
    # a fifth trial: deeper than PATH_MAX under the engine's storage, the engine's own diff
    # failed (its message naming the host's storage path)
    "deep-path": "cd /app && d=$(printf 'd%.0s' $(seq 1 200)) && for i in $(seq 1 25); do "
    "mkdir -p $d && cd $d; done && echo x > f",
}


@pytest.fixture(scope="module")
def engine_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    for stack in start_stack(
        tmp_path_factory.mktemp("redteam-engine"), pool_targets={}, read_host_layers=False
    ):
        assert stack.ctx.runtime._layers("none") is None  # the engine's API reads every path
        yield stack


def assert_zero(rec: dict[str, Any]) -> None:
    v = rec["verifier"]
    assert (rec["reward"], v["status"], rec["exclude_from_loss"]) == (0.0, "ok", False), v


@pytest.mark.parametrize("primitive", list(PRIMITIVES))
def test_primitives_read_through_the_engine_score_zero(engine_stack: Stack, primitive: str) -> None:
    ep = start(engine_stack, TASK, "terminal")
    sh(engine_stack, ep, "echo wrong > /app/top20.txt && " + PRIMITIVES[primitive])
    assert_zero(verify(engine_stack, ep))


def test_primitives_read_through_the_engine_name_no_host_path(engine_stack: Stack) -> None:
    ep = start(engine_stack, TASK, "terminal")
    sh(engine_stack, ep, PRIMITIVES["deep-path"])
    rec = verify(engine_stack, ep)
    assert_zero(rec)
    assert "/var/lib" not in str(rec) and "overlay2" not in str(rec), rec["verifier"]


def test_no_checkpoint_where_a_resumed_episode_could_not_be_verified(engine_stack: Stack) -> None:
    # A fifth trial: on a control plane without the engine's storage, checkpoint, give the
    # claim back, resume and verify made every unsolved 0 an error (the resumed episode's
    # changes lie in the checkpoint's image layers, which only the host can diff).
    a = engine_stack.alice
    job, _, ep = _claimed_episode(engine_stack)
    r = a.post(f"/v1/episodes/{ep['id']}/checkpoints", json={"turn": 1, "state": {}})
    assert r.status_code == 409 and "checkpoints need" in r.json()["detail"], r.text
    assert_zero(verify(engine_stack, ep))
    assert a.post(f"/v1/jobs/{job['id']}/cancel").status_code == 200


def _claimed_episode(stack: Stack) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(job, claimed item, its episode): a one-sample job of ``TASK``, claimed and started."""
    a = stack.alice
    job = a.post(
        "/v1/jobs",
        json={"suite": "terminal", "task_ids": [TASK], "group_size": 1, "policy": {"name": "p"}},
    ).json()
    item = a.post(f"/v1/jobs/{job['id']}/claim", json={"worker": "w", "lease_s": 600}).json()
    r = a.post(
        "/v1/episodes", json={"task_id": TASK, "suite": "terminal", "work_item_id": item["id"]}
    )
    assert r.status_code == 201, r.text
    return job, item, r.json()["episodes"][0]


def _resumed(stack: Stack) -> dict[str, Any]:
    """A job's episode checkpointed, its claim given back, and resumed from the checkpoint."""
    a = stack.alice
    job, item, ep = _claimed_episode(stack)
    sh(stack, ep, "echo wrong > /app/top20.txt")
    r = a.post(f"/v1/episodes/{ep['id']}/checkpoints", json={"turn": 1, "state": {}})
    assert r.status_code in (200, 201), r.text
    done = {"worker": "w", "ok": False, "cause": "infrastructure", "error": "lost"}
    assert a.post(f"/v1/work-items/{item['id']}/complete", json=done).status_code == 200
    again = a.post(f"/v1/jobs/{job['id']}/claim", json={"worker": "w", "lease_s": 600}).json()
    assert again["id"] == item["id"], again
    r = a.post(f"/v1/work-items/{item['id']}/resume", json={"sample_idx": 0})
    assert r.status_code in (200, 201), r.text
    body = r.json()
    return body["episodes"][0] if "episodes" in body else body


@pytest.mark.parametrize("primitive", ["control", "non-utf8-name", "symlink-loop"])
def test_primitives_on_a_resumed_episode_score_zero(stack: Stack, primitive: str) -> None:
    ep = _resumed(stack)
    sh(stack, ep, PRIMITIVES[primitive])
    rec = stack.alice.post(f"/v1/episodes/{ep['id']}/verify", json=TRAJ, timeout=600)
    assert rec.status_code == 200, rec.text
    assert rec.json()["resumed_from"]
    assert_zero(rec.json())
