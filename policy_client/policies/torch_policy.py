"""``TorchPolicy``: a transformers causal LM from a local folder, batched across episodes, with
each episode's KV cache kept between its turns.

    policy = TorchPolicy.from_pretrained("ckpt/step-100", max_new_tokens=256, temperature=0.7)

Loading. ``from_pretrained`` reads the ``save_pretrained`` layout (``config.json``, weights,
``tokenizer.json``...) with ``local_files_only``: nothing is ever downloaded. Device: CUDA when
present (bfloat16), else CPU (float32), unless ``device``/``dtype`` say otherwise.

Prompt. The conversation (``policy_client.prompt``) is rendered with the tokenizer's chat
template; a tokenizer without one gets ``PLAIN_CHAT_TEMPLATE`` (``### System`` /
``### User`` / ``### Assistant`` headers, a blank line after each message).

Sampling. One batched decode over every episode in ``act``'s batch: left-aligned caches and
new tokens are left-padded into one tensor (attention mask 0 on padding, explicit position
ids), then one token per step with temperature and top-p (``temperature == 0``: greedy),
until each row has a complete fenced command block, the done marker, an end-of-sequence token,
``max_new_tokens`` tokens, or the context limit.

Logprobs. ``PolicyAction.logprobs[i]`` is ``log_softmax(logits / T)[token_i]`` in float32: the
log-probability of the sampled token under the *temperature-scaled* distribution, **before**
top-p truncation (the distribution a trainer recomputes: verl, OpenRLHF and TRL divide the
logits by the rollout temperature and do not truncate). With ``top_p == 1`` it is exactly
the sampling distribution; with ``top_p < 1`` the sampler drew from the renormalized nucleus,
whose log-probability is ``logprob - log(nucleus mass)``. With ``temperature == 0`` (greedy)
``T = 1`` is used (raw model logprobs). ``LOGPROB_DEFINITION`` states this in one line.

KV reuse. Per episode the policy keeps every token of its context (``ids``) and each layer's
keys and values for ``ids[:cached]`` (the last sampled token is never fed, so
``cached == len(ids) - 1`` after a turn). Turn k feeds only ``ids[cached:]`` plus the new
observation's tokens; ``end_episode`` frees the cache, and ``max_cached_tokens`` bounds the
total (least recently used caches are dropped and recomputed). During a decode the batch's
cache is preallocated for the whole reply (one in-place write per step, no ``torch.cat``).
Models whose cache is not plain full attention (sliding-window or linear layers) recompute
every turn (``reuse_kv`` is turned off for them).

Token accounting (the ``PolicyAction`` contract). Turn 0: ``prompt_ids`` = the rendered
prompt (system + instruction + the assistant header). Turn k > 0: ``observation_ids`` = the
tokens the template puts after the sampled reply (the end-of-turn marker, unless the model
sampled it), the observation's user turn and the next assistant header. ``response_ids`` =
the sampled tokens, ``logprobs`` one per sampled token. So ``prompt_ids + response_ids`` of a
record (observations included) is exactly the sequence the model saw, and ``loss_mask`` /
``rollout_logprobs`` align with ``response_ids`` token by token.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from policy_client.policies.base import EpisodeContext, PolicyAction, PolicyRequest
from policy_client.prompt import parse_action

PLAIN_CHAT_TEMPLATE = (
    "{{ bos_token if bos_token else '' }}"
    "{% for m in messages %}### {{ m['role'] | capitalize }}\n{{ m['content'] }}\n\n{% endfor %}"
    "{% if add_generation_prompt %}### Assistant\n{% endif %}"
)
"""The template for tokenizers without a chat template (documented in the module docstring)."""

LOGPROB_DEFINITION = "log_softmax(logits / temperature) of the sampled token, before top-p"

_SENTINEL = "\u2063crucible-reply\u2063"
_DUMMY_HEAD = [
    {"role": "system", "content": "s"},
    {"role": "user", "content": "u"},
    {"role": "assistant", "content": _SENTINEL},
]

KV = tuple[torch.Tensor, torch.Tensor]  # one layer's keys and values, (1, heads, T, head_dim)


@dataclass
class _EpisodeState:
    """What the policy remembers about one episode between its turns."""

    ids: list[int] = field(default_factory=list)  # the whole context: prompt + responses
    cache: list[KV] | None = None  # per layer, covering ids[:cached]
    cached: int = 0
    n_messages: int = 0  # messages of the conversation already in ``ids``
    ended_with_eos: bool = False  # the last reply's final token was an end-of-sequence id


@dataclass
class _Row:
    """One sequence of a batched decode: what to feed and how much it may generate."""

    cache: list[KV] | None
    cached: int
    new_ids: list[int]
    budget: int  # most tokens it may sample


@dataclass
class _Sampled:
    """One row's decode result; ``cache`` covers its context but the last sampled token."""

    ids: list[int]
    logprobs: list[float]
    cache: list[KV] | None
    hit_budget: bool


class TorchPolicy:
    """A transformers causal LM as a ``Policy`` (see the module docstring for the contract).

    Build it with ``from_pretrained``; ``reuse_kv=False`` recomputes every turn from the
    whole history instead (same tokens, more compute: the baseline of bench/policy.py).
    ``max_cached_tokens`` bounds the KV memory: past it, the caches of the episodes that
    acted least recently are dropped (their next turn recomputes from their token history;
    the tokens are the same). A cached token costs ``2 * layers * kv_heads * head_dim``
    values (a Llama-3-8B in bf16: 128 KiB).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_context_tokens: int | None = None,
        seed: int | None = None,
        name: str | None = None,
        reuse_kv: bool = True,
        max_cached_tokens: int | None = None,
    ) -> None:
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if temperature < 0 or not 0 < top_p <= 1:
            raise ValueError("temperature must be >= 0 and top_p in (0, 1]")
        self.model, self.tokenizer = model, tokenizer
        self.device = next(model.parameters()).device
        self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p
        self._plain_cache = _plain_cache_layers(model)
        self.reuse_kv = reuse_kv and self._plain_cache  # sliding windows: recompute instead
        self.max_cached_tokens = max_cached_tokens
        limit = getattr(model.config, "max_position_embeddings", None) or 4096
        self.max_context_tokens = min(max_context_tokens or limit, limit)
        if tokenizer.chat_template is None:
            tokenizer.chat_template = PLAIN_CHAT_TEMPLATE
        self.eos_ids = _eos_ids(model, tokenizer)
        self.pad_id = (
            tokenizer.pad_token_id
            if tokenizer.pad_token_id is not None
            else min(self.eos_ids, default=0)
        )
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed if seed is not None else torch.seed())
        self._cache_kwarg = _cache_kwarg(model)
        self._episodes: dict[str, _EpisodeState] = {}
        self._lock = threading.Lock()  # one batch at a time
        self.name = name or "torch"
        self.version = policy_version(temperature=temperature, top_p=top_p)

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        device: str | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
        max_context_tokens: int | None = None,
        seed: int | None = None,
        reuse_kv: bool = True,
        max_cached_tokens: int | None = None,
    ) -> TorchPolicy:
        """Load a causal LM and its tokenizer from a local ``save_pretrained`` folder.

        ``device``: default ``cuda`` when available, else ``cpu``. ``dtype``: default
        bfloat16 on CUDA, float32 on CPU. ``max_context_tokens``: default (and at most) the
        model's ``max_position_embeddings``. ``seed`` makes sampling reproducible.
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = Path(path)
        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if dtype is None:
            dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        elif isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
        model.to(device).eval()
        return cls(
            model,
            tokenizer,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            max_context_tokens=max_context_tokens,
            seed=seed,
            name=path.resolve().name,
            reuse_kv=reuse_kv,
            max_cached_tokens=max_cached_tokens,
        )

    # -- Policy protocol ----------------------------------------------------------------------

    def prepare(self, episode: EpisodeContext, client: Any) -> None:
        """Nothing to prepare: state is created on the episode's first ``act``."""

    def end_episode(self, episode_id: str) -> None:
        """Free the episode's KV cache and token history."""
        self._episodes.pop(episode_id, None)

    def act(self, batch: list[PolicyRequest]) -> list[PolicyAction]:
        """Sample one reply per request, all in one batched decode."""
        ids = [r.episode.episode_id for r in batch]
        if len(set(ids)) != len(ids):
            raise ValueError("one request per episode per batch")
        with self._lock, torch.inference_mode():
            return self._act(batch)

    # -- internals ----------------------------------------------------------------------------

    def _act(self, batch: list[PolicyRequest]) -> list[PolicyAction]:
        actions: list[PolicyAction | None] = [None] * len(batch)
        rows: list[_Row] = []
        plan: list[tuple[int, _EpisodeState, list[int]]] = []  # (batch index, state, new ids)
        for i, req in enumerate(batch):
            state = self._episodes.get(req.episode.episode_id)
            if state is None or req.turn == 0:
                state = _EpisodeState()
                new = self._encode(self._render(req.messages, add_generation_prompt=True))
            else:
                new = self._encode(self._continuation(state, req.messages[state.n_messages :]))
            budget = min(self.max_new_tokens, self.max_context_tokens - len(state.ids) - len(new))
            if budget < 1:  # the observation does not fit: nothing more is fed or sampled
                actions[i] = PolicyAction(text="", context_exhausted=True)
                continue
            state.n_messages = len(req.messages)
            if self.reuse_kv:
                rows.append(
                    _Row(state.cache, state.cached, state.ids[state.cached :] + new, budget)
                )
            else:
                rows.append(_Row(None, 0, state.ids + new, budget))
            plan.append((i, state, new))
        sampled = self._generate(rows) if rows else []
        for (i, state, new), row, out in zip(plan, rows, sampled, strict=True):
            self._episodes.pop(batch[i].episode.episode_id, None)  # re-inserted: most recent
            req = batch[i]
            first = not state.ids
            state.ids += new + out.ids
            state.cache = out.cache if self.reuse_kv else None
            state.cached = len(state.ids) - 1 if self.reuse_kv else 0
            state.ended_with_eos = bool(out.ids) and out.ids[-1] in self.eos_ids
            self._episodes[req.episode.episode_id] = state
            actions[i] = PolicyAction(
                text=self.tokenizer.decode(out.ids, skip_special_tokens=True),
                prompt_ids=new if first else [],
                observation_ids=[] if first else new,
                response_ids=out.ids,
                logprobs=out.logprobs,
                context_exhausted=out.hit_budget
                and len(state.ids) >= self.max_context_tokens
                and not state.ended_with_eos,
                info={"cached_tokens": row.cached},
            )
        self._evict()
        return [a for a in actions if a is not None]

    def _evict(self) -> None:
        """Drop the least recently used caches while more than ``max_cached_tokens`` are held."""
        if self.max_cached_tokens is None:
            return
        held = sum(s.cached for s in self._episodes.values())
        for state in list(self._episodes.values()):  # insertion order: least recent first
            if held <= self.max_cached_tokens:
                break
            held -= state.cached
            state.cache, state.cached = None, 0

    def _render(self, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _continuation(self, state: _EpisodeState, new_messages: list[dict[str, str]]) -> str:
        """The text the template puts after the last reply: its closing, the new messages
        (observations), and the next assistant header."""
        if not new_messages or new_messages[0]["role"] != "assistant":
            raise ValueError("a later turn's new messages start with the policy's own reply")
        text = self._render(_DUMMY_HEAD + new_messages[1:], add_generation_prompt=True)
        tail = text[text.index(_SENTINEL) + len(_SENTINEL) :]
        if state.ended_with_eos:  # the model closed its turn itself: do not close it twice
            eos_text = self.tokenizer.decode(state.ids[-1:], skip_special_tokens=False)
            if eos_text and tail.startswith(eos_text):
                tail = tail[len(eos_text) :]
        return tail

    def _generate(self, rows: list[_Row]) -> list[_Sampled]:
        """Batched decode of ``rows`` (see the module docstring); one ``_Sampled`` per row."""
        dev, b = self.device, len(rows)
        c = max(r.cached for r in rows)
        n = max(len(r.new_ids) for r in rows)
        input_ids = torch.full((b, n), self.pad_id, dtype=torch.long, device=dev)
        mask = torch.zeros((b, c + n), dtype=torch.long, device=dev)
        for i, r in enumerate(rows):
            input_ids[i, n - len(r.new_ids) :] = torch.tensor(r.new_ids, device=dev)
            mask[i, c - r.cached : c] = 1
            mask[i, c + n - len(r.new_ids) :] = 1
        if self._plain_cache:
            cache = _new_cache(self.model, rows, c, c + n + max(r.budget for r in rows))
        else:
            cache = DynamicCache(config=self.model.config)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, c:]
        logits = self._forward(input_ids, mask, positions, cache)

        out_ids: list[list[int]] = [[] for _ in rows]
        out_lp: list[list[float]] = [[] for _ in rows]
        running = [True] * b  # host-side: no device sync per row
        hit_budget = [False] * b
        for step in range(max(r.budget for r in rows)):
            tokens, logprobs = self._sample(logits)
            tok_list, lp_list = tokens.tolist(), logprobs.tolist()  # one sync per step
            for i in range(b):
                if not running[i]:
                    continue
                out_ids[i].append(tok_list[i])
                out_lp[i].append(lp_list[i])
                if tok_list[i] in self.eos_ids or self._complete(out_ids[i]):
                    running[i] = False
                elif step + 1 >= rows[i].budget:
                    running[i], hit_budget[i] = False, True
            if not any(running):
                break
            alive = torch.tensor(running, device=dev)
            feed = torch.where(alive, tokens, torch.full_like(tokens, self.pad_id))
            mask = torch.cat([mask, alive.long()[:, None]], dim=1)
            positions = (mask.sum(-1, keepdim=True) - 1).clamp(min=0)
            logits = self._forward(feed[:, None], mask, positions, cache)

        layers = _cache_layers(cache)
        results = []
        for i in range(b):
            keep = mask[i].nonzero().squeeze(-1)
            per_row = (
                [(k[i : i + 1, :, keep], v[i : i + 1, :, keep]) for k, v in layers]
                if self.reuse_kv
                else None
            )
            results.append(_Sampled(out_ids[i], out_lp[i], per_row, hit_budget[i]))
        return results

    def _forward(
        self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        """Logits of the last position, float32, shape (B, V); ``cache`` grows in place."""
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kwarg: cache},
        )
        return out.logits[:, -1].float()

    def _sample(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens (B,) and their logprobs (B,) per ``LOGPROB_DEFINITION``."""
        if self.temperature == 0:
            logp = torch.log_softmax(logits, dim=-1)
            tokens = logp.argmax(dim=-1)
            return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
        logp = torch.log_softmax(logits / self.temperature, dim=-1)
        probs = logp.exp()
        if self.top_p < 1.0:
            sorted_p, order = probs.sort(dim=-1, descending=True)
            outside = sorted_p.cumsum(-1) - sorted_p > self.top_p  # the top token always stays
            sorted_p = sorted_p.masked_fill(outside, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        tokens = torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)
        return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)

    def _complete(self, ids: list[int]) -> bool:
        """True once the reply holds a complete fenced command block or the done marker."""
        if len(ids) < 2:
            return False
        parsed = parse_action(self.tokenizer.decode(ids, skip_special_tokens=True))
        return parsed.command is not None or parsed.done


def policy_version(*, temperature: float = 1.0, top_p: float = 1.0, **_: Any) -> str:
    """The ``version`` a ``TorchPolicy`` reports: its sampling settings, e.g. ``T=0.7,top_p=1``
    (a trainer reads the rollout temperature from it; see examples/grpo_step.py)."""
    return f"T={temperature:g},top_p={top_p:g}"


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    for source in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(int(x) for x in source)
    return ids


def _cache_kwarg(model: Any) -> str:
    """``cache`` (transformers >= 5.x) or ``past_key_values`` (older)."""
    import inspect

    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _plain_cache_layers(model: Any) -> bool:
    """True when every layer of the model's cache is a plain full-attention ``DynamicLayer``
    (no sliding window, no linear attention): the layout per-episode KV reuse relies on."""
    layers = DynamicCache(config=model.config).layers
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


class _PreallocatedLayer(DynamicLayer):
    """A ``DynamicLayer`` that appends into a preallocated buffer of ``capacity`` positions
    (doubled when full), so a decode step writes one position in place instead of
    ``torch.cat``-ing the whole cache (O(T) per step). ``keys``/``values`` are views of
    the filled part, shape (B, heads, length, head_dim)."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity, self.length = capacity, 0
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def allocate(self, batch: int, like_k: torch.Tensor, like_v: torch.Tensor) -> None:
        """Zeroed buffers for ``batch`` rows, heads and head size as ``like_k``/``like_v``."""
        self.k = like_k.new_zeros((batch, like_k.shape[1], self.capacity, like_k.shape[3]))
        self.v = like_v.new_zeros((batch, like_v.shape[1], self.capacity, like_v.shape[3]))
        self.device, self.is_initialized = like_k.device, True
        self.set_length(0)

    def set_length(self, length: int) -> None:
        """Mark the first ``length`` positions as filled."""
        self.length = length
        self.keys, self.values = self.k[:, :, :length], self.v[:, :, :length]

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.allocate(key_states.shape[0], key_states, value_states)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self.k.shape[2]:
            grown = max(end, 2 * self.k.shape[2])
            k = self.k.new_zeros((*self.k.shape[:2], grown, self.k.shape[3]))
            v = self.v.new_zeros((*self.v.shape[:2], grown, self.v.shape[3]))
            k[:, :, : self.length], v[:, :, : self.length] = self.keys, self.values
            self.k, self.v = k, v
        self.k[:, :, self.length : end] = key_states
        self.v[:, :, self.length : end] = value_states
        self.set_length(end)
        return self.keys, self.values


def _new_cache(model: Any, rows: list[_Row], length: int, capacity: int) -> DynamicCache:
    """A cache of ``_PreallocatedLayer``s for ``capacity`` positions whose first ``length``
    hold row i's cache right-aligned (zeros, masked, before it)."""
    cache = DynamicCache(config=model.config)
    ref = next((r.cache for r in rows if r.cache), None)
    if ref is None:
        cache.layers = [_PreallocatedLayer(capacity) for _ in cache.layers]
        return cache
    layers = []
    for j, (k0, v0) in enumerate(ref):
        layer = _PreallocatedLayer(capacity)
        layer.allocate(len(rows), k0, v0)
        for i, r in enumerate(rows):
            if r.cached:
                layer.k[i, :, length - r.cached : length] = r.cache[j][0][0]
                layer.v[i, :, length - r.cached : length] = r.cache[j][1][0]
        layer.set_length(length)
        layers.append(layer)
    cache.layers = layers
    return cache


def _cache_layers(cache: DynamicCache) -> list[KV]:
    """Each layer's (keys, values), shape (B, heads, T, head_dim)."""
    return [(layer.keys, layer.values) for layer in cache.layers]
