"""The ``Policy`` protocol: a batch of conversations in, actions out (with tokens when the
policy has them).

A rollout runner calls ``act`` with one ``PolicyRequest`` per episode that is waiting for
its next action, gathered across episodes into one batch. Token bookkeeping is the
policy's: on an episode's first call it returns the prompt's token ids; on later calls the
token ids of the observation it was given (``observation_ids``, loss mask 0) and always the
sampled ``response_ids`` (loss mask 1) with their ``logprobs``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True, kw_only=True)
class EpisodeContext:
    """What a policy may know about an episode: ids, the task, where to act."""

    episode_id: str
    sandbox_id: str
    task_id: str
    suite: str
    instruction: str
    workdir: str


@dataclass(frozen=True, kw_only=True)
class PolicyRequest:
    """One episode waiting for an action.

    ``messages`` is the chat so far (``system``, ``user`` instruction, then alternating
    ``assistant`` actions and ``user`` observations); ``turn`` counts from 0.
    """

    episode: EpisodeContext
    messages: list[dict[str, str]]
    turn: int


@dataclass(kw_only=True)
class PolicyAction:
    """A policy's answer. ``text`` is the raw model output (parsed by ``prompt.parse_action``)."""

    text: str
    prompt_ids: list[int] = field(default_factory=list)  # first turn only
    observation_ids: list[int] = field(default_factory=list)  # turns after the first
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    context_exhausted: bool = False  # the context window is full: the episode must stop
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Policy(Protocol):
    """Anything that turns a batch of conversations into actions."""

    name: str
    version: str

    def act(self, batch: list[PolicyRequest]) -> list[PolicyAction]:
        """One action per request, in order. May block (runners call it in a thread)."""
        ...

    def prepare(self, episode: EpisodeContext, client: Any) -> None:
        """Optional set-up before the first turn (the oracle uploads its solution here)."""
        ...

    def end_episode(self, episode_id: str) -> None:
        """Forget per-episode state (KV caches, token histories)."""
        ...
