"""Policies that need no model: ``OraclePolicy`` replays a task's solution (it validates
tasks: every oracle must score 1.0) and ``NoopPolicy`` does nothing (every no-op must score 0).
Both answer in the episode's mode (``EpisodeContext.mode``): a fenced command or the done
marker in exec mode, Terminus JSON in session mode."""

from __future__ import annotations

import io
import json
import re
import tarfile
from pathlib import Path
from typing import Any

from policy_client import calls
from policy_client.policies.base import EpisodeContext, PolicyAction, PolicyRequest
from policy_client.prompt import DONE_MARKER

# Session mode: the oracle types its run and this echo, then waits on the screen for it.
ORACLE_EXIT_RE = re.compile(r"crucible-oracle-exit=(\d+)")
ORACLE_RUN_S = 600.0  # the most one turn waits (``session_prompt.MAX_DURATION_S``)
ORACLE_POLL_S = 30.0


def terminus_reply(commands: list[tuple[str, float]], *, done: bool) -> str:
    """A Terminus JSON reply (session mode): ``(keystrokes, duration)`` in order."""
    return json.dumps(
        {
            "analysis": "",
            "plan": "",
            "commands": [{"keystrokes": k, "duration": d} for k, d in commands],
            "task_complete": done,
        }
    )


class NoopPolicy:
    """Declares the task done without acting."""

    name, version = "noop", "1"
    modes = ("exec", "session")

    def act(self, batch: list[PolicyRequest]) -> list[PolicyAction]:
        """Always done: the done marker (exec), ``task_complete`` and no keys (session)."""
        return [
            PolicyAction(
                text=terminus_reply([], done=True) if r.episode.mode == "session" else DONE_MARKER
            )
            for r in batch
        ]

    def prepare(self, episode: EpisodeContext, client: Any) -> None:
        """Nothing to prepare."""

    def end_episode(self, episode_id: str) -> None:
        """Nothing to forget."""


class OraclePolicy:
    """Uploads the task's ``solution/`` to ``/solution`` and runs ``solve.sh`` in the workdir.

    ``suite_dir`` is the local folder of the suite (the solutions never go through the API).
    Reading it takes the server's task loader: under a client-only install
    (``crucible-client``) this raises ``ImportError`` saying so.
    """

    name, version = "oracle", "1"
    modes = ("exec", "session")

    def __init__(self, suite_dir: str | Path) -> None:
        try:
            from service.tasks.loader import load_suite
        except ImportError as e:
            raise ImportError(
                "OraclePolicy reads the suite's solutions with the server's task loader, which "
                "crucible-client does not ship: install the crucible distribution instead (it "
                "holds the client too)"
            ) from e
        self.suite = load_suite(suite_dir)

    def _solution(self, task_id: str) -> Path:
        task = self.suite.get(task_id)
        if task.solution_path is None:
            raise ValueError(f"task {task_id} has no oracle solution")
        return task.solution_path

    def prepare(self, episode: EpisodeContext, client: Any) -> None:
        """Upload the solution (Harbor: the ``solution/`` folder; TB1: ``solution.sh``) to
        ``/solution`` (the client is sync; runners call this in a thread)."""
        script = self._solution(episode.task_id)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            if script.parent.name == "solution":
                t.add(str(script.parent), arcname=".")
            else:
                t.add(str(script), arcname=script.name)
        client.run(calls.put_file(episode.sandbox_id, "/solution", buf.getvalue(), tar=True))

    def act(self, batch: list[PolicyRequest]) -> list[PolicyAction]:
        """Exec mode: turn 0 runs the solution script in the workdir; then done. Session
        mode: turn 0 types that run and an echo of its exit status; later turns wait on the
        screen until the status shows, then done."""
        return [PolicyAction(text=self._act(r)) for r in batch]

    def _act(self, r: PolicyRequest) -> str:
        run = f"bash /solution/{self._solution(r.episode.task_id).name}"
        if r.episode.mode != "session":
            return f"```bash\n{run}\n```" if r.turn == 0 else DONE_MARKER
        if r.turn == 0:
            keys = f'{run}; echo "crucible-oracle-exit=$?"\n'
            return terminus_reply([(keys, ORACLE_RUN_S)], done=False)
        if ORACLE_EXIT_RE.search(r.messages[-1]["content"]):
            return terminus_reply([], done=True)
        return terminus_reply([("", ORACLE_POLL_S)], done=False)  # still running: wait

    def end_episode(self, episode_id: str) -> None:
        """Nothing to forget."""
