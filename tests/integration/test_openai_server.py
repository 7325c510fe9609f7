"""``crucible rollout --policy openai`` against real OpenAI-compatible servers, through the real
service (real HTTP, real Docker, real verifiers):

- ``transformers serve`` (transformers' own server, strict: unknown request fields are a 422,
  no token ids, ``logprobs`` ignored) with a tiny local model: the README's line works, token
  ids are detected as missing once per endpoint and every record says so;
- a local stub answering with vLLM's documented token-id fields (``prompt_token_ids`` on the
  response, ``token_ids`` on the choice, ``token_id:<id>`` logprob tokens): records carry ids,
  masks and logprobs; a group of identical samples at temperature 1 is flagged;
- the same stub failing every request: the error is in each record, the job's progress and
  the summary count the failed episodes, and the CLI exits 1.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from policy_client.client import Client
from policy_client.prompt import initial_messages
from service.rewards import RewardRecord
from tests.integration.api.conftest import Stack, start_stack
from tests.tiny_model import build_tokenizer, save_tiny_model

pytestmark = [pytest.mark.docker, pytest.mark.serving]

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "tasks" / "terminal"
TASKS = ["word-frequency-top20", "access-log-top-ips"]
BIN = Path(sys.executable).parent
REPLY = "```bash\necho hi\n```"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from start_stack(tmp_path_factory.mktemp("stack"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"server exited with {proc.returncode}")
        try:
            r = httpx.get(url, timeout=2)
            if r.status_code == 200:
                return
            last = f"answered {r.status_code}"
        except httpx.HTTPError as e:  # not listening yet
            last = e
        time.sleep(0.3)
    raise AssertionError(f"{url} not up within {timeout_s} s (last: {last!r})")


def _stub_app() -> FastAPI:
    """vLLM's chat-completions answer with ``return_token_ids``/``return_tokens_as_token_ids``
    (``/vllm``), or a 500 with an OpenAI-style error body (``/fail``)."""
    tok = build_tokenizer()
    app = FastAPI()

    @app.post("/vllm/v1/chat/completions")
    async def vllm(request: Request) -> dict[str, Any]:
        body = await request.json()
        assert body["return_token_ids"] is True and body["return_tokens_as_token_ids"] is True
        messages = body["messages"]
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompt = tok.encode(text, add_special_tokens=False)
        reply = REPLY if len(messages) == 2 else "<done/>"
        ids = tok.encode(reply, add_special_tokens=False) + [tok.eos_token_id]
        content = [{"token": f"token_id:{i}", "logprob": -0.5, "bytes": None} for i in ids]
        return {
            "id": "cmpl-1",
            "object": "chat.completion",
            "model": body["model"],
            "prompt_token_ids": prompt,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": reply},
                    "logprobs": {"content": content},
                    "finish_reason": "stop",
                    "token_ids": ids,
                }
            ],
        }

    @app.post("/fail/v1/chat/completions")
    async def fail() -> JSONResponse:
        body = {"error": {"message": "the model exploded", "type": "server_error"}}
        return JSONResponse(body, status_code=500)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"ok": "yes"}

    return app


@pytest.fixture(scope="module")
def stub() -> Iterator[str]:
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(_stub_app(), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    _wait_http(url + "/health", 30)
    yield url
    server.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """``transformers serve`` of a tiny random model on CPU: (base URL with /v1, model)."""
    model = save_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")
    port = _free_port()
    log = open(tmp_path_factory.mktemp("serve") / "serve.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [str(BIN / "transformers"), "serve", str(model), "--device", "cpu", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    try:
        _wait_http(f"http://127.0.0.1:{port}/v1/models", 120, proc)
        yield f"http://127.0.0.1:{port}/v1", str(model)
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def _rollout(stack: Stack, out: Path, *args: str) -> tuple[int, dict, str]:
    key = stack.alice.headers["authorization"].split(" ", 1)[1]
    env = {**os.environ, "CRUCIBLE_URL": stack.url, "CRUCIBLE_API_KEY": key}
    cmd = [str(BIN / "crucible"), "rollout", "--suite", str(SUITE), "--policy", "openai"]
    cmd += ["--tasks", ",".join(TASKS), "--max-turns", "2", "--out", str(out), "--json", *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    try:
        summary = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(
            f"no JSON summary: {proc.stdout[-2000:]} {proc.stderr[-3000:]}"
        ) from None
    return proc.returncode, summary, proc.stderr


def _records(summary: dict) -> list[RewardRecord]:
    with open(summary["records"]["jsonl"]) as fp:
        return [RewardRecord.model_validate_json(line) for line in fp]


def test_rollout_against_transformers_serve(
    stack: Stack, served: tuple[str, str], tmp_path: Path
) -> None:
    endpoint, model = served
    rc, summary, err = _rollout(
        stack, tmp_path, "--endpoint", endpoint, "--served-model", model, "--max-new-tokens", "8"
    )
    assert rc == 0, err[-3000:]
    assert summary["state"] == "done" and summary["episodes"] == len(TASKS)
    assert summary["failed_episodes"] == 0 and summary["errors"] == 0
    assert "token_ids missing in 2 of 2 records" in summary["missing"]
    assert "refused" in summary["missing"]  # auto: the 422 turned the vLLM fields off
    for rec in _records(summary):
        assert rec.stop_reason in ("max_turns", "complete"), rec.error
        assert rec.error is None and rec.verifier.status == "ok"
        assert rec.missing == ["token_ids", "logprobs"]
        assert "Unexpected fields" in (rec.missing_reason or "")
        assert rec.prompt_ids == [] and rec.loss_mask == []
        assert rec.instruction and rec.prompt_messages[1].content == rec.instruction
        assert [m.model_dump() for m in rec.prompt_messages] == initial_messages(rec.instruction)


def test_rollout_against_a_vllm_stub(stack: Stack, stub: str, tmp_path: Path) -> None:
    rc, summary, err = _rollout(
        stack,
        tmp_path,
        "--endpoint",
        f"{stub}/vllm",  # no /v1: the policy adds it
        "--served-model",
        "stub",
        "--token-ids",
        "on",
        "--group-size",
        "2",
    )
    assert rc == 0, err[-3000:]
    assert summary["episodes"] == 2 * len(TASKS) and summary["failed_episodes"] == 0
    assert summary["missing"] is None
    assert len(summary["warnings"]) == len(TASKS)  # deterministic stub, temperature 1
    assert "identical at temperature 1" in summary["warnings"][0]
    tok = build_tokenizer()
    for rec in _records(summary):
        assert rec.missing == [] and rec.missing_reason is None
        messages = initial_messages(rec.instruction)
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert rec.prompt_ids == tok.encode(text, add_special_tokens=False)
        assert len(rec.response_ids) == len(rec.loss_mask) == len(rec.rollout_logprobs)
        assert 0 in rec.loss_mask and 1 in rec.loss_mask  # observation tokens between turns
        for m, lp in zip(rec.loss_mask, rec.rollout_logprobs, strict=True):
            assert lp == (-0.5 if m else 0.0)
        assert rec.stop_reason == "complete"


def test_every_episode_failing_is_loud(stack: Stack, stub: str, tmp_path: Path) -> None:
    rc, summary, err = _rollout(
        stack, tmp_path, "--endpoint", f"{stub}/fail/v1", "--served-model", "stub"
    )
    assert rc == 1, err[-3000:]
    assert "every episode failed" in err
    assert summary["failed_episodes"] == summary["episodes"] == len(TASKS)
    assert "the model exploded" in summary["first_error"]
    for rec in _records(summary):
        assert rec.stop_reason == "error" and rec.exclude_from_loss
        assert rec.error is not None and "500" in rec.error and "the model exploded" in rec.error
    key = stack.alice.headers["authorization"].split(" ", 1)[1]
    with Client(stack.url, key) as client:
        job = client.get_job(summary["job_id"])
    assert job.progress["failed_episodes"] == len(TASKS)
