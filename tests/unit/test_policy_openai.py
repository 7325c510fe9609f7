"""``OpenAICompatiblePolicy`` and ``RoutedPolicy`` against real local HTTP servers (stdlib
``http.server`` on free ports) that answer like vLLM / plain OpenAI-compatible endpoints.

The fake model is byte-level: a token id is a byte of UTF-8 text, the chat template renders
``<role>content</role>`` per message and ``<assistant>`` as the generation prompt, so every id
the policy reports can be checked against text."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from policy_client.policies.base import EpisodeContext, PolicyRequest
from policy_client.policies.openai_compat import OpenAICompatiblePolicy, RoutedPolicy
from policy_client.prompt import initial_messages

CONTEXT_LIMIT = 2000  # bytes of rendered prompt


def render(messages: list[dict[str, str]]) -> str:
    return "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages) + "<assistant>"


@dataclass
class FakeModel:
    """How a fake server answers. ``mode``: ``vllm`` (``token_ids`` + ``prompt_token_ids``),
    ``legacy`` (``token_id:N`` logprob tokens + ``prompt_token_ids``), ``plain`` (text
    tokens only). ``drift``: from token ``drift`` on, greedy output differs, and every logprob
    is 0.01 higher. ``strip_replies``: the template drops the last character of earlier replies
    (a re-rendering that breaks the token prefix)."""

    mode: str = "vllm"
    drift: int | None = None
    strip_replies: bool = False
    requests: list[dict[str, Any]] = field(default_factory=list)

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.requests.append(body)
        messages = body["messages"]
        if self.strip_replies:
            messages = [
                {**m, "content": m["content"][:-1]} if m["role"] == "assistant" else m
                for m in messages
            ]
        prompt = render(messages).encode()
        if len(prompt) > CONTEXT_LIMIT:
            return 400, {
                "object": "error",
                "message": f"This model's maximum context length is {CONTEXT_LIMIT} tokens.",
                "type": "BadRequestError",
                "code": 400,
            }
        turn = sum(1 for m in messages if m["role"] == "user")
        text = f"```bash\necho turn {turn}\n```"
        ids = list(text.encode())
        if self.drift is not None:
            ids[self.drift :] = [ord("x")] * (len(ids) - self.drift)
            text = bytes(ids).decode()
        ids = ids[: body["max_tokens"]]
        logprobs = [-0.1 - 0.01 * (i % 5) + (0.01 if self.drift is not None else 0.0) for i in ids]
        if self.mode == "legacy":
            tokens = [f"token_id:{i}" for i in ids]
        else:
            tokens = [chr(i) for i in ids]
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": bytes(ids).decode()},
            "finish_reason": "stop",
            "logprobs": {
                "content": [
                    {"token": t, "logprob": lp, "top_logprobs": []}
                    for t, lp in zip(tokens, logprobs, strict=True)
                ]
            },
        }
        data: dict[str, Any] = {"id": "c1", "object": "chat.completion", "choices": [choice]}
        if self.mode == "vllm":
            choice["token_ids"] = ids
        if self.mode in ("vllm", "legacy"):
            data["prompt_token_ids"] = list(prompt)
        return 200, data


@contextmanager
def serve(model: FakeModel) -> Iterator[str]:
    """A real HTTP server on a free loopback port answering ``/v1/chat/completions``."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            if self.path != "/v1/chat/completions":
                self.send_error(404)
                return
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            status, data = model.answer(body)
            payload = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _ctx(i: int) -> EpisodeContext:
    return EpisodeContext(
        episode_id=f"ep{i}", sandbox_id="sb", task_id="t", suite="s", instruction="", workdir="/"
    )


def _two_turns(policy: Any, i: int = 0, traffic: str = "batch") -> list:
    messages = initial_messages(f"task {i}")
    first = policy.act([PolicyRequest(episode=_ctx(i), messages=messages, turn=0, traffic=traffic)])
    messages = messages + [
        {"role": "assistant", "content": first[0].text},
        {"role": "user", "content": "[exit code 0]\nok"},
    ]
    second = policy.act(
        [PolicyRequest(episode=_ctx(i), messages=messages, turn=1, traffic=traffic)]
    )
    return [first[0], second[0], messages]


@pytest.mark.parametrize("mode", ["vllm", "legacy"])
def test_token_ids_from_a_vllm_server(mode: str) -> None:
    model = FakeModel(mode=mode)
    with serve(model) as url:
        policy = OpenAICompatiblePolicy(url, "m", max_tokens=64, temperature=0.5, seed=1)
        first, second, messages = _two_turns(policy)
    assert first.prompt_ids == list(render(messages[:2]).encode())
    assert first.text == "```bash\necho turn 1\n```"
    assert first.response_ids == list(first.text.encode())
    assert len(first.logprobs) == len(first.response_ids)
    assert not first.observation_ids
    assert bytes(second.observation_ids).decode() == (
        "</assistant><user>[exit code 0]\nok</user><assistant>"
    )
    assert not second.prompt_ids and second.text == "```bash\necho turn 2\n```"
    body = model.requests[0]
    assert body["logprobs"] is True and body["return_tokens_as_token_ids"] is True
    assert body["model"] == "m" and body["max_tokens"] == 64 and body["temperature"] == 0.5
    assert body["seed"] == 1 and body["messages"] == messages[:2]


def test_text_only_when_the_server_gives_no_ids() -> None:
    model = FakeModel(mode="plain")
    with serve(model) as url:
        policy = OpenAICompatiblePolicy(url, "m", token_ids=False)
        first, second, _ = _two_turns(policy)
    assert "return_tokens_as_token_ids" not in model.requests[0]
    for action in (first, second):
        assert action.text.startswith("```bash")
        assert not (action.prompt_ids or action.response_ids or action.logprobs)
        assert "text_only" in action.info


def test_a_prefix_break_falls_back_to_text_only_for_the_episode() -> None:
    with serve(FakeModel(strip_replies=True)) as url:
        policy = OpenAICompatiblePolicy(url, "m")
        first, second, _ = _two_turns(policy)
    assert first.response_ids and first.prompt_ids
    assert not second.response_ids and not second.observation_ids
    assert "does not extend" in second.info["text_only"]
    assert second.info["response_ids"]  # the per-turn ids are kept for whoever wants them


def test_a_full_context_ends_the_episode() -> None:
    with serve(FakeModel()) as url:
        policy = OpenAICompatiblePolicy(url, "m")
        long = initial_messages("x" * (CONTEXT_LIMIT + 1))
        action = policy.act([PolicyRequest(episode=_ctx(0), messages=long, turn=0)])[0]
    assert action.context_exhausted and not action.text
    assert "maximum context length" in action.info["error"]


def test_router_sends_interactive_to_fast_and_batch_to_standard() -> None:
    fast_model, standard_model = FakeModel(), FakeModel()
    with serve(fast_model) as fast_url, serve(standard_model) as standard_url:
        router = RoutedPolicy(
            fast=OpenAICompatiblePolicy(fast_url, "fast"),
            standard=OpenAICompatiblePolicy(standard_url, "standard"),
        )
        batch = [
            PolicyRequest(episode=_ctx(0), messages=initial_messages("a"), turn=0),
            PolicyRequest(
                episode=_ctx(1), messages=initial_messages("b"), turn=0, traffic="interactive"
            ),
            PolicyRequest(episode=_ctx(2), messages=initial_messages("c"), turn=0),
        ]
        actions = router.act(batch)
        # sticky: a later turn of episode 1 stays on the fast endpoint whatever it says
        later = PolicyRequest(
            episode=_ctx(1),
            messages=initial_messages("b")
            + [{"role": "assistant", "content": actions[1].text}, {"role": "user", "content": "o"}],
            turn=1,
        )
        again = router.act([later])[0]
        router.end_episode("ep1")
    assert [a.info["route"] for a in actions] == ["standard", "fast", "standard"]
    assert again.info["route"] == "fast" and again.observation_ids
    assert [r["model"] for r in fast_model.requests] == ["fast", "fast"]
    assert sorted(r["messages"][1]["content"] for r in standard_model.requests) == ["a", "c"]
    assert router.counts == {"fast": 2, "standard": 2}
    assert "ep1" not in router.fast._episodes


def test_consistency_check_measures_drift() -> None:
    sample = [initial_messages(f"task {i}") for i in range(4)]
    drifting_model = FakeModel(drift=12)
    with (
        serve(FakeModel()) as standard_url,
        serve(FakeModel()) as same_url,
        serve(drifting_model) as drifting_url,
    ):
        standard = OpenAICompatiblePolicy(standard_url, "m")
        same = RoutedPolicy(fast=OpenAICompatiblePolicy(same_url, "m"), standard=standard)
        drifting = RoutedPolicy(fast=OpenAICompatiblePolicy(drifting_url, "m"), standard=standard)
        ok = same.check_consistency(sample, max_tokens=32)
        bad = drifting.check_consistency(sample, max_tokens=32)
    assert ok.ok and ok.n == 4 and ok.exact_match_rate == 1.0 and ok.token_agreement == 1.0
    assert ok.mean_abs_logprob_diff == 0.0
    n = len("```bash\necho turn 1\n```")
    assert not bad.ok and bad.exact_match_rate == 0.0
    assert bad.token_agreement == pytest.approx(12 / n)
    assert all(s.first_divergence == 12 and len(s.logprob_diffs) == 12 for s in bad.samples)
    assert bad.mean_abs_logprob_diff == pytest.approx(0.01)
    assert bad.max_abs_logprob_diff == pytest.approx(0.01)
    assert all(r["temperature"] == 0.0 and r["top_p"] == 1.0 for r in drifting_model.requests)
