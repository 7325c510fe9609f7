"""A Terminus-style agent: it solves a bundled terminal task only by typing into a PTY
session and reading the screen, and the real verifier scores it.

    .venv/bin/python examples/terminus_agent.py [--task access-log-top-ips] \\
        [--url http://127.0.0.1:8000] [--api-key KEY]

(``CRUCIBLE_URL`` / ``CRUCIBLE_API_KEY`` are the defaults, as for every client.)

The policy is scripted, not a model: ``TerminusScriptPolicy`` answers in Terminus's JSON
format (``commands`` of ``keystrokes`` + ``duration``, ``task_complete``), exactly what a
model would have to answer in a session episode (``RolloutConfig(mode="session")``):

1. turn 0 types the task's solution into the terminal: readline's completion and bash's
   history expansion off (so tabs and ``!`` are typed as they are), then each file of the
   task's ``solution/`` folder as a quoted heredoc into ``/solution``;
2. turn 1 types ``bash /solution/solve.sh`` and an echo of its exit status; the runner waits
   on the screen until the shell prompts again;
3. turn 2 reads that screen: ``task_complete`` once the exit status is on it.

Nothing goes through exec or the file API: the trajectory's turns record the keys sent and
the screen read after them, and the record's reward is the verifier's (1.0 for a solved
task). The solution is read from the local task folder (the API never serves solutions).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from pathlib import Path

from policy_client import AsyncClient, Client
from policy_client.policies.base import EpisodeContext, Policy, PolicyAction, PolicyRequest
from policy_client.rollout import RolloutConfig, RolloutRunner
from policy_client.schemas import RewardRecord

SUITE_DIR = Path(__file__).resolve().parents[1] / "tasks" / "terminal"
DEFAULT_TASK = "access-log-top-ips"
SETUP_KEYS = "bind 'set disable-completion on'; set +H; export PAGER=cat GIT_PAGER=cat\n"
RUN_KEYS = 'bash /solution/solve.sh; echo "crucible-exit=$?"\n'
EXIT_RE = re.compile(r"crucible-exit=(\d+)")
DELIMITER = "CRUCIBLE_TERMINUS_EOF"


def heredoc_keys(path: str, text: str) -> str:
    """Keystrokes that write ``text`` to ``path`` through a quoted heredoc (nothing in it is
    expanded). Raises ``ValueError`` when ``text`` holds the delimiter line."""
    if DELIMITER in text.splitlines():
        raise ValueError(f"{path}: contains the heredoc delimiter line {DELIMITER}")
    body = text if text.endswith("\n") else text + "\n"
    return f"cat > {path} <<'{DELIMITER}'\n{body}{DELIMITER}\n"


def _reply(commands: list[tuple[str, float]], *, done: bool, analysis: str) -> str:
    return json.dumps(
        {
            "analysis": analysis,
            "plan": "type the next keys" if commands else "finish",
            "commands": [{"keystrokes": k, "duration": d} for k, d in commands],
            "task_complete": done,
        }
    )


class TerminusScriptPolicy:
    """Types a task's oracle solution into the session and watches the screen for its exit
    status (see the module docstring). ``suite_dir``: the local suite folder."""

    name, version = "terminus-script", "1"
    modes = ("session",)  # Terminus JSON only

    def __init__(self, suite_dir: Path = SUITE_DIR, *, run_timeout_s: float = 300.0) -> None:
        self.suite_dir, self.run_timeout_s = Path(suite_dir), run_timeout_s
        self._typing: dict[str, list[tuple[str, float]]] = {}

    def prepare(self, episode: EpisodeContext, client: object) -> None:
        """Plan the keystrokes of ``episode``'s solution (text files of ``solution/``)."""
        folder = self.suite_dir / episode.task_id / "solution"
        if not (folder / "solve.sh").is_file():
            raise ValueError(f"task {episode.task_id} has no solution/solve.sh")
        keys = [(SETUP_KEYS, 5.0), ("mkdir -p /solution\n", 5.0)]
        for f in sorted(p for p in folder.rglob("*") if p.is_file()):
            rel = f.relative_to(folder).as_posix()
            if "/" in rel:
                keys.append((f"mkdir -p /solution/{Path(rel).parent.as_posix()}\n", 5.0))
            keys.append((heredoc_keys(f"/solution/{rel}", f.read_text()), 10.0))
        self._typing[episode.episode_id] = keys

    def act(self, batch: list[PolicyRequest]) -> list[PolicyAction]:
        """One Terminus JSON reply per episode, from its turn and the screen it was shown."""
        return [PolicyAction(text=self._act(r)) for r in batch]

    def _act(self, request: PolicyRequest) -> str:
        screen = request.messages[-1]["content"]
        if request.turn == 0:
            return _reply(
                self._typing[request.episode.episode_id], done=False, analysis="a fresh shell"
            )
        if request.turn == 1:
            return _reply(
                [(RUN_KEYS, self.run_timeout_s)], done=False, analysis="the solution is typed"
            )
        found = EXIT_RE.findall(screen)
        if found:
            return _reply([], done=True, analysis=f"solve.sh exited {found[-1]}")
        return _reply([("", 5.0)], done=False, analysis="still running: wait on the screen")

    def end_episode(self, episode_id: str) -> None:
        """Forget the episode's plan."""
        self._typing.pop(episode_id, None)


def run_session_job(
    url: str | None, api_key: str | None, policy: Policy, *, task: str, max_turns: int = 8
) -> RewardRecord:
    """Run one session episode of ``task`` (suite ``terminal``) with ``policy`` through a
    rollout job (``RolloutConfig(mode="session")``); returns its reward record. Raises
    ``RuntimeError`` when the job produced no record."""
    with Client(url, api_key) as client:
        job = client.create_job(
            suite="terminal",
            task_ids=[task],
            group_size=1,
            policy={"name": policy.name, "version": policy.version},
        )

        async def go() -> list[RewardRecord]:
            async with AsyncClient(url, api_key) as aclient:
                runner = RolloutRunner(
                    aclient,
                    policy,
                    sync_client=client,
                    config=RolloutConfig(mode="session", concurrency=1, max_turns=max_turns),
                )
                return [o.record for o in await runner.run_job(job.id)]

        records = asyncio.run(go())
    if not records:
        raise RuntimeError(f"job {job.id} produced no record")
    return records[0]


def run_agent(
    url: str | None,
    api_key: str | None,
    *,
    task: str = DEFAULT_TASK,
    suite_dir: Path = SUITE_DIR,
    max_turns: int = 8,
) -> RewardRecord:
    """Run one session episode of ``task`` with the scripted Terminus policy
    (``run_session_job``); returns its reward record."""
    policy = TerminusScriptPolicy(suite_dir)
    return run_session_job(url, api_key, policy, task=task, max_turns=max_turns)


def main(argv: list[str] | None = None) -> int:
    """Run the agent on one task and print its reward and turns; exit 0 on reward 1.0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default=DEFAULT_TASK)
    parser.add_argument("--url", default=None)
    parser.add_argument("--api-key", default=None)
    args = parser.parse_args(argv)
    record = run_agent(args.url, args.api_key, task=args.task)
    for i, turn in enumerate(record.turns):
        print(f"--- turn {i}: {len(turn.keys)} key strings sent; screen after them:")
        print(turn.screen or "")
    print(f"reward {record.reward} ({record.verifier.status}), stop {record.stop_reason}")
    return 0 if record.reward == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
