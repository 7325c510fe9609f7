"""Policies that need no model: ``OraclePolicy`` replays a task's solution (it validates
tasks: every oracle must score 1.0) and ``NoopPolicy`` does nothing (every no-op must score 0)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

from policy_client import calls
from policy_client.policies.base import EpisodeContext, PolicyAction, PolicyRequest
from policy_client.prompt import DONE_MARKER


class NoopPolicy:
    """Declares the task done without acting."""

    name, version = "noop", "1"

    def act(self, batch: list[PolicyRequest]) -> list[PolicyAction]:
        """Always the done marker."""
        return [PolicyAction(text=DONE_MARKER) for _ in batch]

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
        """Turn 0: run the solution script in the workdir; then: done."""
        return [
            PolicyAction(
                text=f"```bash\nbash /solution/{self._solution(r.episode.task_id).name}\n```"
                if r.turn == 0
                else DONE_MARKER
            )
            for r in batch
        ]

    def end_episode(self, episode_id: str) -> None:
        """Nothing to forget."""
