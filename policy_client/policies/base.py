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
from typing import Any, Literal, Protocol, runtime_checkable

Traffic = Literal["batch", "interactive"]


@dataclass(frozen=True, kw_only=True)
class EpisodeContext:
    """What a policy may know about an episode: ids, the task, where to act, and how it
    acts (``mode``: ``"exec"``, one command per reply, ``prompt.py``; ``"session"``,
    Terminus JSON of keystrokes per reply, ``session_prompt.py``)."""

    episode_id: str
    sandbox_id: str
    task_id: str
    suite: str
    instruction: str
    workdir: str
    mode: Literal["exec", "session"] = "exec"


@dataclass(frozen=True, kw_only=True)
class PolicyRequest:
    """One episode waiting for an action.

    ``messages`` is the chat so far (``system``, ``user`` instruction, then alternating
    ``assistant`` actions and ``user`` observations); ``turn`` counts from 0. ``traffic``
    says who waits for the answer: ``batch`` (a rollout job: throughput matters) or
    ``interactive`` (a person or a live evaluation: latency matters); a router
    (``RoutedPolicy``) may send the two to different endpoints.
    """

    episode: EpisodeContext
    messages: list[dict[str, str]]
    turn: int
    traffic: Traffic = "batch"


@dataclass(kw_only=True)
class PolicyAction:
    """A policy's answer. ``text`` is the raw model output (parsed by ``prompt.parse_action``).

    Token ids are in the policy's tokenizer. ``prompt_ids`` (first turn only): the rendered
    prompt. ``observation_ids`` (later turns): every token appended to the context between
    the previous reply's last sampled token and this reply's first (the template's end of
    turn, the observation turn, the next assistant header). ``response_ids``: the sampled
    tokens, ``logprobs`` one natural-log probability per sampled token (the policy's
    docstring says under which distribution). Concatenated over an episode,
    ``prompt_ids + (observation_ids + response_ids)...`` is the exact sequence the model saw.
    A policy without tokens returns text only (all lists empty). ``context_exhausted``:
    the context window is full, the episode must stop (stop reason ``context_length``).
    """

    text: str
    prompt_ids: list[int] = field(default_factory=list)  # first turn only
    observation_ids: list[int] = field(default_factory=list)  # turns after the first
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    context_exhausted: bool = False  # the context window is full: the episode must stop
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Policy(Protocol):
    """Anything that turns a batch of conversations into actions.

    A policy whose replies follow one episode mode's format whatever the chat says (a
    scripted one) declares the modes it can drive as ``modes`` (a tuple of ``"exec"`` /
    ``"session"``); ``RolloutRunner`` refuses a config of another mode up front. Without
    ``modes`` it is taken to follow the chat's instructions (a model), in either mode.
    """

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
