"""The document domain end to end, through the real API and engine: for every bundled
document task the oracle scores 1.0 and a no-op 0.0; every field's evidence string is in
the ``pdftotext`` output of the task's PDFs inside its sandbox; partial and malformed
answers score what the rules say; the ground truth never reaches the sandbox."""

from __future__ import annotations

import io
import json
import re
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.api.conftest import Stack, start_stack
from tests.integration.api.test_sandboxes_api import run

pytestmark = pytest.mark.docker

SUITE = Path(__file__).resolve().parents[3] / "tasks" / "document"
TASK_IDS = sorted(p.name for p in SUITE.iterdir() if (p / "task.toml").is_file())
TRAJ = {"policy": {"name": "test", "version": "1"}}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from start_stack(tmp_path_factory.mktemp("docstack"), pool_targets={})


def start(stack: Stack, task: str) -> dict[str, Any]:
    r = stack.alice.post("/v1/episodes", json={"task_id": task, "suite": "document"})
    assert r.status_code == 201, r.text
    return r.json()["episodes"][0]


def upload_dir(stack: Stack, ep: dict[str, Any], src: Path, dest: str) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        t.add(str(src), arcname=".")
    r = stack.alice.put(
        f"/v1/sandboxes/{ep['sandbox_id']}/files",
        params={"path": dest},
        content=buf.getvalue(),
        headers={"content-type": "application/x-tar"},
    )
    assert r.status_code == 200, r.text


def run_oracle(stack: Stack, ep: dict[str, Any], task: str) -> float:
    """Upload ``solution/`` to /solution and run it, as a worker would; returns seconds."""
    t0 = time.perf_counter()
    upload_dir(stack, ep, SUITE / task / "solution", "/solution")
    out = run(stack.alice, ep["sandbox_id"], "bash /solution/solve.sh", cwd=ep["workdir"])
    assert out["exit_code"] == 0, (out["stdout"], out["stderr"])
    return time.perf_counter() - t0


def write_answer(stack: Stack, ep: dict[str, Any], answer: bytes) -> None:
    r = stack.alice.put(
        f"/v1/sandboxes/{ep['sandbox_id']}/files",
        params={"path": "/app/answer.json"},
        content=answer,
        headers={"content-type": "application/octet-stream"},
    )
    assert r.status_code == 200, r.text


def verify(stack: Stack, ep: dict[str, Any]) -> dict[str, Any]:
    r = stack.alice.post(f"/v1/episodes/{ep['id']}/verify", json=TRAJ)
    assert r.status_code == 200, r.text
    return r.json()


def expected(task: str) -> dict[str, Any]:
    return json.loads((SUITE / task / "tests" / "expected.json").read_text())["fields"]


def test_document_suite_is_listed_without_answers(stack: Stack) -> None:
    body = stack.alice.get("/v1/tasks", params={"suite": "document"}).json()
    assert body["errors"] == []
    assert sorted(t["id"] for t in body["tasks"]) == TASK_IDS and len(TASK_IDS) >= 10
    listed = json.dumps(body)
    assert "expected.json" not in listed and "solve.sh" not in listed


@pytest.mark.parametrize("task", TASK_IDS)
def test_oracle_scores_one_and_noop_zero(stack: Stack, task: str) -> None:
    ep = start(stack, task)
    sid = ep["sandbox_id"]
    # the sandbox has the documents, the tools, and no ground truth
    probe = run(
        stack.alice,
        sid,
        "ls /app; test ! -e /tests && test ! -e /app/answer.json && "
        'for f in /app/*.pdf; do pdftotext "$f" -; done',
    )
    assert probe["exit_code"] == 0, probe["stderr"]
    text = " ".join(probe["stdout"].split())
    for key, field in expected(task).items():
        for evidence in field.get("evidence", []):
            assert " ".join(str(evidence).split()) in text, (task, key, evidence)
    oracle_s = run_oracle(stack, ep, task)
    rec = verify(stack, ep)
    assert (rec["reward"], rec["verifier"]["status"], rec["exclude_from_loss"]) == (
        1.0,
        "ok",
        False,
    ), rec["verifier"]
    fields = expected(task)
    assert rec["reward_components"]["fields_total"] == len(fields)
    assert rec["reward_components"]["fields_right"] == len(fields)
    assert all(rec["reward_components"][f"field.{k}"] == 1.0 for k in fields)
    assert rec["domain"] == "document" and rec["verifier"]["name"] == "document"
    assert oracle_s + rec["timing"]["verify_ms"] / 1e3 < 5.0, (oracle_s, rec["timing"])

    noop = start(stack, task)
    rec0 = verify(stack, noop)
    assert (rec0["reward"], rec0["verifier"]["status"], rec0["exclude_from_loss"]) == (
        0.0,
        "ok",
        False,
    )
    assert rec0["verifier"]["details"]["reason"] == "/app/answer.json does not exist"


def test_partial_answer_scores_the_fraction_right(stack: Stack) -> None:
    task = "effective-tax-rate"
    fields = expected(task)
    ep = start(stack, task)
    answer = {
        "profit_before_tax_2023": f"€{fields['profit_before_tax_2023']['value']}m",
        "income_tax_expense_2023": -fields["income_tax_expense_2023"]["value"],  # wrong sign
        "effective_tax_rate_2023": round(fields["effective_tax_rate_2023"]["value"] / 100, 3),
        "statutory_tax_rate": "25.8 %",
        "reporting_currency": "€",
        "extra": "ignored",
    }
    write_answer(stack, ep, json.dumps(answer).encode())
    rec = verify(stack, ep)
    # 2 of the 3 fields that are not guessable right; the 2 guessable ones count in proportion
    assert (rec["reward"], rec["verifier"]["status"]) == (pytest.approx(2 / 3), "ok")
    assert rec["reward_components"]["field.income_tax_expense_2023"] == 0.0
    assert rec["verifier"]["details"]["unknown_keys"] == ["extra"]
    assert rec["verifier"]["details"]["fields"]["income_tax_expense_2023"] == {
        "score": 0.0,
        "reason": "mismatch",
    }


def _values(fields: dict[str, Any]) -> list[re.Pattern[str]]:
    """The expected values of a ground truth, as they would appear in JSON.

    A number matches only as a whole token: ``0.84`` is in ``"x": 0.84`` but not in a
    timing such as ``100.845`` (a CI run once failed on exactly that).
    """
    out = []
    for f in fields.values():
        text = re.escape(json.dumps(f["value"]))
        if isinstance(f["value"], (int, float)):
            text = rf"(?<![\d.]){text}(?![\d])"
        out.append(re.compile(text))
    return out


def test_tenants_never_see_expected_values_admins_do(stack: Stack) -> None:
    task = "fund-factsheet"
    ep = start(stack, task)
    write_answer(stack, ep, b'{"fund_name": "Wrong Fund", "one_year_return": "1%"}')
    rec = verify(stack, ep)
    assert rec["reward"] == 0.0 and "private" not in rec["verifier"]["details"]
    exports = {
        "verify": json.dumps(rec),
        "list": stack.alice.get("/v1/rewards", params={"task_id": task}).text,
        "jsonl": stack.alice.get("/v1/rewards/export", params={"task_id": task}).text,
        "parquet": stack.alice.get(
            "/v1/rewards/export", params={"task_id": task, "format": "parquet"}
        ).content.decode("latin-1"),
    }
    for where, text in exports.items():
        for value in _values(expected(task)):
            assert not value.search(text), (where, value.pattern)
    for route in ("/v1/rewards", "/v1/rewards/export"):
        r = stack.alice.get(route, params={"private": "true"})
        assert r.status_code == 403 and r.headers["content-type"] == "application/problem+json"
    # an admin's own episode: the admin view carries the truth; the stored row keeps it
    r = stack.admin.post("/v1/episodes", json={"task_id": task, "suite": "document"})
    admin_ep = r.json()["episodes"][0]
    r = stack.admin.put(
        f"/v1/sandboxes/{admin_ep['sandbox_id']}/files",
        params={"path": "/app/answer.json"},
        content=b'{"fund_name": "Wrong Fund"}',
        headers={"content-type": "application/octet-stream"},
    )
    assert r.status_code == 200, r.text
    r = stack.admin.post(f"/v1/episodes/{admin_ep['id']}/verify", json=TRAJ)
    assert "private" not in r.json()["verifier"]["details"]
    page = stack.admin.get("/v1/rewards", params={"task_id": task, "private": "true"}).json()
    private = page["records"][0]["verifier"]["details"]["private"]["fields"]
    assert private["fund_name"]["expected"] == expected(task)["fund_name"]["value"]
    jsonl = stack.admin.get("/v1/rewards/export", params={"task_id": task, "private": "true"})
    assert json.dumps(expected(task)["fund_name"]["value"]) in jsonl.text
    plain = stack.admin.get("/v1/rewards", params={"task_id": task}).json()
    assert "private" not in plain["records"][0]["verifier"]["details"]


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        ("printf '[1,2]' > /app/answer.json", "answer.json must hold a JSON object"),
        ("printf '{oops' > /app/answer.json", "answer.json is not valid JSON"),
        ("ln -s /etc/hostname /app/answer.json", "/app/answer.json is not a regular file"),
        ("mkdir /app/answer.json", "/app/answer.json is not a regular file"),
        ("mkfifo /app/answer.json", "/app/answer.json is not a regular file"),
    ],
)
def test_malformed_answers_score_zero_with_reason(stack: Stack, setup: str, reason: str) -> None:
    ep = start(stack, "fund-factsheet")
    out = run(stack.alice, ep["sandbox_id"], setup)
    assert out["exit_code"] == 0, out["stderr"]
    rec = verify(stack, ep)
    assert (rec["reward"], rec["verifier"]["status"]) == (0.0, "ok")
    assert rec["verifier"]["details"]["reason"].startswith(reason), rec["verifier"]
