"""Policies served over the OpenAI chat-completions API (vLLM, SGLang, ``transformers
serve``...), and a router.

``OpenAICompatiblePolicy`` posts each request of a batch to ``{base_url}/v1/chat/completions``
(``base_url`` given with or without its ``/v1``), concurrently, up to ``max_concurrency`` at
once, with ``logprobs: true``. ``token_ids`` says whether to ask for token ids with vLLM's
fields ``return_tokens_as_token_ids`` (each logprob entry's token reads ``token_id:<id>``) and
``return_token_ids`` (vLLM >= 0.10.2: ``prompt_token_ids`` of the rendered conversation and
the choice's ``token_ids``): ``"on"`` always, ``"off"`` never (a strict server refuses unknown
fields), ``"auto"`` (default) detects it once per endpoint: the first request asks, and a
400/422 answer turns the fields off for good (the request is repeated without them). What
the endpoint does not give (``token_ids``, ``logprobs``) is in ``missing``, why in
``missing_reason``, after the first answer.

Token accounting. A record needs the whole sequence the model saw, so token ids are
reported only when the server gives both sides: the sampled ids (``token_ids``, else the
``token_id:<id>`` logprob tokens) and the prompt's (``prompt_token_ids``). Turn 0's prompt ids
are ``prompt_ids``; on turn k the server re-renders the whole conversation, and when that
rendering starts with the episode's history (previous prompt + sampled ids) the rest is
``observation_ids``. If it does not (the template re-tokenized an earlier reply differently),
or the server returned no ids, the action is text only from then on for that episode (empty
id lists; the runner then records no tokens for the episode) and ``info`` says why; the
per-turn sampled ids and logprobs stay in ``info["response_ids"]``/``info["logprobs"]``.

Logprobs are the server's: vLLM (V1) reports by default the raw model logprobs, before
temperature and top-p (``--logprobs-mode processed_logprobs`` on the server reports them after
temperature and top-p). Match that in the trainer (see ``TorchPolicy`` for its definition).

``RoutedPolicy`` sends ``interactive`` traffic to a fast endpoint and ``batch`` traffic to a
standard one (sticky per episode), and ``check_consistency`` measures how far the two drift
apart on a sample: greedy outputs compared token by token, and the logprob differences where
both chose the same token after the same context.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from policy_client.errors import APIError, BadRequest, raise_for_problem
from policy_client.policies.base import EpisodeContext, Policy, PolicyAction, PolicyRequest

Route = Literal["fast", "standard"]
TokenIds = Literal["auto", "on", "off"]
VLLM_TOKEN_FIELDS = {"return_tokens_as_token_ids": True, "return_token_ids": True}


def api_root(base_url: str) -> str:
    """The server root of an OpenAI-compatible base URL given with or without ``/v1``
    (``http://h:8000/v1/`` and ``http://h:8000`` both give ``http://h:8000``)."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


@dataclass(frozen=True)
class Completion:
    """One chat completion: text, and per generated token its id (when the server gave
    ids), its text form and its logprob; ``prompt_ids`` when the server gave them."""

    text: str
    token_ids: list[int] | None
    tokens: list[str]
    logprobs: list[float]
    prompt_ids: list[int] | None
    finish_reason: str | None


@dataclass
class _EpisodeTokens:
    history: list[int] = field(default_factory=list)  # prompt + observations + sampled ids
    ok: bool = True  # False once the episode fell back to text only


class OpenAICompatiblePolicy:
    """A model behind an OpenAI-compatible chat-completions endpoint (see module docstring).

    ``base_url``: the server, with or without ``/v1`` (``http://host:8000/v1``). ``model``:
    the served model name. ``max_tokens``, ``temperature``, ``top_p``, ``seed`` go into every
    request, ``extra_body`` is merged into it (e.g. ``{"stop": [...]}``, vLLM's
    ``{"top_k": 20}``). ``token_ids``: ``"auto"``, ``"on"`` or ``"off"`` (``True``/``False``
    mean on/off). ``transport`` replaces httpx's (tests).

    Raises:
        ValueError: ``token_ids`` is none of the above.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        max_tokens: int = 256,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        token_ids: TokenIds | bool = "auto",
        max_concurrency: int = 16,
        timeout_s: float = 300.0,
        extra_body: dict[str, Any] | None = None,
        name: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if isinstance(token_ids, bool):
            token_ids = "on" if token_ids else "off"
        if token_ids not in ("auto", "on", "off"):
            raise ValueError(f"token_ids must be auto, on or off, not {token_ids!r}")
        self.base_url, self.model = api_root(base_url), model
        self.max_tokens, self.temperature, self.top_p, self.seed = (
            max_tokens,
            temperature,
            top_p,
            seed,
        )
        self.token_ids: TokenIds = token_ids
        self.extra_body = dict(extra_body or {})
        self.name = name or model
        self.version = f"T={temperature:g},top_p={top_p:g}"
        # what the endpoint gives, learnt from its first answer (None: not asked yet)
        self.ask_token_ids: bool = token_ids != "off"
        self.missing: list[str] | None = None
        self.missing_reason: str | None = None
        self._probe = threading.Lock()
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=timeout_s,
            transport=transport,
            limits=httpx.Limits(max_connections=max_concurrency),
        )
        self._pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="oai")
        self._episodes: dict[str, _EpisodeTokens] = {}

    def close(self) -> None:
        """Close the connection pool and the request threads."""
        self._pool.shutdown(wait=False)
        self._http.close()

    # -- one completion ------------------------------------------------------------------------

    def complete(
        self,
        messages: Sequence[dict[str, str]],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
    ) -> Completion:
        """One chat completion of ``messages`` (the instance's sampling unless overridden)."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": list(messages),
            "max_tokens": max_tokens or self.max_tokens,
            "temperature": self.temperature if temperature is None else temperature,
            "top_p": self.top_p if top_p is None else top_p,
            "logprobs": True,
        }
        if self.seed is not None:
            body["seed"] = self.seed
        body.update(self.extra_body)
        if self.missing is not None:
            return self._post(body)
        with self._probe:  # the first answer tells what the endpoint gives: learn it once
            if self.missing is not None:
                return self._post(body)
            try:
                completion = self._post(body)
            except BadRequest as e:
                if self.token_ids != "auto" or e.status not in (400, 422):
                    raise
                self.ask_token_ids = False
                completion = self._post(body)  # the endpoint refused vLLM's token fields
                refused = f"the endpoint refused vLLM's token-id fields ({e.status}: {e.detail})"
                self._learn(completion, reason=refused[:500])
                return completion
            self._learn(completion)
            return completion

    def _post(self, body: dict[str, Any]) -> Completion:
        if self.ask_token_ids:
            body = {**body, **VLLM_TOKEN_FIELDS}
        response = self._http.post("/v1/chat/completions", json=body)
        _raise_for_error(response)
        return parse_completion(response.json())

    def _learn(self, c: Completion, *, reason: str | None = None) -> None:
        missing = []
        if c.token_ids is None or c.prompt_ids is None:
            missing.append("token_ids")
        if not c.logprobs:
            missing.append("logprobs")
        if missing and reason is None:
            reason = (
                "token ids were not asked for (token_ids=off)"
                if not self.ask_token_ids and "token_ids" in missing
                else f"the endpoint's answer has no {' and no '.join(missing)}"
            )
        self.missing, self.missing_reason = missing, reason if missing else None

    # -- Policy protocol -----------------------------------------------------------------------

    def act(self, batch: list[PolicyRequest]) -> list[PolicyAction]:
        """One completion per request, concurrently; token ids per the module docstring.

        A 400 answer saying the prompt exceeds the model's context becomes an action with
        ``context_exhausted`` (the episode stops with ``context_length``).
        """
        return list(self._pool.map(self._act_one, batch))

    def _act_one(self, request: PolicyRequest) -> PolicyAction:
        try:
            completion = self.complete(request.messages)
        except BadRequest as e:
            if "context" in e.detail.lower() and "length" in e.detail.lower():
                return PolicyAction(text="", context_exhausted=True, info={"error": e.detail})
            raise
        return self._action(request, completion)

    def prepare(self, episode: EpisodeContext, client: Any) -> None:
        """Nothing to prepare."""

    def end_episode(self, episode_id: str) -> None:
        """Forget the episode's token history."""
        self._episodes.pop(episode_id, None)

    def _action(self, request: PolicyRequest, c: Completion) -> PolicyAction:
        info: dict[str, Any] = {"finish_reason": c.finish_reason}
        if c.token_ids is not None:
            info["response_ids"], info["logprobs"] = c.token_ids, c.logprobs
        key = request.episode.episode_id
        state = self._episodes.get(key)
        if state is None or request.turn == 0:
            state = self._episodes[key] = _EpisodeTokens()
        text_only = PolicyAction(text=c.text, info=info)
        if not state.ok:
            info["text_only"] = "an earlier turn"
            return text_only
        if c.token_ids is None or c.prompt_ids is None:
            state.ok = False
            info["text_only"] = self.missing_reason or "the server returned no token ids"
            return text_only
        logprobs = list(c.logprobs) if len(c.logprobs) == len(c.token_ids) else []
        first = not state.history
        if not first and c.prompt_ids[: len(state.history)] != state.history:
            state.ok = False
            info["text_only"] = "the re-rendered prompt does not extend the episode's tokens"
            return text_only
        new = c.prompt_ids[len(state.history) :]
        state.history = list(c.prompt_ids) + list(c.token_ids)
        return PolicyAction(
            text=c.text,
            prompt_ids=new if first else [],
            observation_ids=[] if first else new,
            response_ids=list(c.token_ids),
            logprobs=logprobs,
            info=info,
        )


def _raise_for_error(response: httpx.Response) -> None:
    """``raise_for_problem``, reading OpenAI-style error bodies (``{"message": ...}`` or
    ``{"error": {"message": ...}}``) as well as problem+json."""
    try:
        raise_for_problem(response)
    except APIError as e:
        if e.detail:
            raise
        err = e.body.get("error") if isinstance(e.body.get("error"), dict) else e.body
        detail = str(err.get("message", "")) or response.text[:500]
        raise type(e)(e.status, e.title or "error", detail, e.field, e.body) from None


def parse_completion(data: dict[str, Any]) -> Completion:
    """Read a chat-completions answer (vLLM's and SGLang's extensions included)."""
    choice = data["choices"][0]
    entries = (choice.get("logprobs") or {}).get("content") or []
    tokens = [str(e.get("token", "")) for e in entries]
    logprobs = [float(e["logprob"]) for e in entries]
    ids: list[int] | None = None
    if choice.get("token_ids") is not None:
        ids = [int(t) for t in choice["token_ids"]]
    elif tokens and all(t.startswith("token_id:") for t in tokens):
        ids = [int(t.removeprefix("token_id:")) for t in tokens]
    prompt = data.get("prompt_token_ids", choice.get("prompt_token_ids"))
    return Completion(
        text=(choice.get("message") or {}).get("content") or "",
        token_ids=ids,
        tokens=tokens,
        logprobs=logprobs,
        prompt_ids=[int(t) for t in prompt] if prompt is not None else None,
        finish_reason=choice.get("finish_reason"),
    )


# --------------------------------------------------------------------------- router


@dataclass(frozen=True)
class SampleDrift:
    """How one greedy sample differs between the two endpoints.

    ``agreement``: positions with the same token / the longer output's length.
    ``first_divergence``: index of the first differing token (None: identical).
    ``logprob_diffs``: ``|lp_fast - lp_standard|`` at each position of the common prefix
    (same token after the same context).
    """

    exact: bool
    agreement: float
    first_divergence: int | None
    logprob_diffs: list[float]


@dataclass(frozen=True)
class ConsistencyReport:
    """Drift between the fast and the standard endpoint over a sample of conversations.

    ``exact_match_rate``: share of samples with identical greedy text. ``token_agreement``:
    mean of the per-sample positional agreement. ``mean_abs_logprob_diff`` /
    ``max_abs_logprob_diff``: over every common-prefix position of every sample (nats).
    ``ok``: agreement at least ``min_token_agreement`` and mean logprob difference at most
    ``max_mean_logprob_diff``.
    """

    n: int
    exact_match_rate: float
    token_agreement: float
    mean_abs_logprob_diff: float
    max_abs_logprob_diff: float
    ok: bool
    samples: list[SampleDrift]


def compare_completions(a: Completion, b: Completion) -> SampleDrift:
    """Token-level comparison of two completions of the same prompt (ids when both have
    them, else the tokens' text forms)."""
    ta: Sequence[Any] = a.token_ids if a.token_ids is not None and b.token_ids else a.tokens
    tb: Sequence[Any] = b.token_ids if a.token_ids is not None and b.token_ids else b.tokens
    longest = max(len(ta), len(tb))
    same = sum(1 for x, y in zip(ta, tb, strict=False) if x == y)
    first = next((i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y), None)
    if first is None and len(ta) != len(tb):
        first = min(len(ta), len(tb))
    prefix = min(len(ta), len(tb)) if first is None else first
    diffs = [abs(a.logprobs[i] - b.logprobs[i]) for i in range(prefix)]
    return SampleDrift(
        exact=a.text == b.text and first is None,
        agreement=same / longest if longest else 1.0,
        first_divergence=first,
        logprob_diffs=diffs,
    )


class RoutedPolicy:
    """Interactive traffic to ``fast``, batch traffic to ``standard``, sticky per episode.

    ``route`` maps a request to ``"fast"`` or ``"standard"`` (default: by
    ``request.traffic``); an episode keeps the endpoint of its first request, so its token
    history and the server's prefix cache stay on one model.
    """

    def __init__(
        self,
        *,
        fast: Policy,
        standard: Policy,
        route: Callable[[PolicyRequest], Route] | None = None,
    ) -> None:
        self.fast, self.standard = fast, standard
        self.route = route or (lambda r: "fast" if r.traffic == "interactive" else "standard")
        self.name = f"routed:{standard.name}"
        self.version = standard.version
        self._routes: dict[str, Route] = {}
        self.counts: dict[Route, int] = {"fast": 0, "standard": 0}

    def _policy(self, route: Route) -> Policy:
        return self.fast if route == "fast" else self.standard

    def act(self, batch: list[PolicyRequest]) -> list[PolicyAction]:
        """Split the batch by route, act on both parts at once, answer in order."""
        parts: dict[Route, list[int]] = {"fast": [], "standard": []}
        for i, r in enumerate(batch):
            key = r.episode.episode_id
            if key not in self._routes or r.turn == 0:
                self._routes[key] = self.route(r)
            parts[self._routes[key]].append(i)
        actions: list[PolicyAction | None] = [None] * len(batch)
        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = {
                route: pool.submit(self._policy(route).act, [batch[i] for i in idx])
                for route, idx in parts.items()
                if idx
            }
            for route, fut in futures.items():
                for i, action in zip(parts[route], fut.result(), strict=True):
                    action.info["route"] = route
                    actions[i] = action
                self.counts[route] += len(parts[route])
        return [a for a in actions if a is not None]

    def prepare(self, episode: EpisodeContext, client: Any) -> None:
        """Prepare on both endpoints' policies (the route is chosen at the first request)."""
        self.fast.prepare(episode, client)
        self.standard.prepare(episode, client)

    def end_episode(self, episode_id: str) -> None:
        """Forget the episode on the policy that served it."""
        route = self._routes.pop(episode_id, None)
        for r in (route,) if route else ("fast", "standard"):
            self._policy(r).end_episode(episode_id)

    def check_consistency(
        self,
        conversations: Sequence[Sequence[dict[str, str]]],
        *,
        max_tokens: int = 64,
        min_token_agreement: float = 0.95,
        max_mean_logprob_diff: float = 0.05,
    ) -> ConsistencyReport:
        """Greedy-complete each conversation on both endpoints and measure the drift.

        Both policies must offer ``complete`` (``OpenAICompatiblePolicy`` does).
        """
        fast, standard = self.fast, self.standard
        if not (hasattr(fast, "complete") and hasattr(standard, "complete")):
            raise TypeError("check_consistency needs policies with complete()")
        samples = []
        for messages in conversations:
            a = fast.complete(messages, max_tokens=max_tokens, temperature=0.0, top_p=1.0)
            b = standard.complete(messages, max_tokens=max_tokens, temperature=0.0, top_p=1.0)
            samples.append(compare_completions(a, b))
        diffs = [d for s in samples for d in s.logprob_diffs]
        agreement = statistics.fmean(s.agreement for s in samples) if samples else 1.0
        mean_diff = statistics.fmean(diffs) if diffs else 0.0
        return ConsistencyReport(
            n=len(samples),
            exact_match_rate=statistics.fmean(s.exact for s in samples) if samples else 1.0,
            token_agreement=agreement,
            mean_abs_logprob_diff=mean_diff,
            max_abs_logprob_diff=max(diffs, default=0.0),
            ok=agreement >= min_token_agreement and mean_diff <= max_mean_logprob_diff,
            samples=samples,
        )
