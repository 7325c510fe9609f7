"""Red team, document domain: unsolved answers that try to be paid anyway, through the
public API on bundled tasks. Each scores exactly 0 with ``status=ok``:

- copying what a tenant's own records show (they carry per-field scores and reason codes,
  never an expected value) into a second episode;
- answering only what the instruction gives away (``guessable`` fields);
- answers that break parsing (deep JSON, huge numbers, non-finite numbers, wrong types,
  non-UTF-8, lone surrogates, gigantic strings) and an ``answer.json`` that is a directory,
  a FIFO, a symlink to a device, or a tree too large to read; those that hit a cap name it
  in ``details["dodge"]``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.tasks.loader import load_suite
from service.verifiers.document import check_for, score_field
from tests.integration.api.conftest import Stack, start_stack
from tests.integration.api.test_sandboxes_api import run
from tests.redteam import episodes
from tests.redteam.episodes import verify

pytestmark = [pytest.mark.docker, pytest.mark.redteam]

TASK = "effective-tax-rate"
SUITE = Path(__file__).resolve().parents[2] / "tasks" / "document"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from start_stack(tmp_path_factory.mktemp("redteam-doc"), pool_targets={})


def start(stack: Stack, task: str = TASK) -> dict[str, Any]:
    return episodes.start(stack, task, "document")


def put(stack: Stack, ep: dict[str, Any], data: bytes) -> None:
    episodes.upload(stack, ep, "/app/answer.json", data)


def assert_zero(rec: dict[str, Any]) -> None:
    assert (rec["reward"], rec["verifier"]["status"], rec["exclude_from_loss"]) == (
        0.0,
        "ok",
        False,
    ), rec["verifier"]


def strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)


def test_copying_what_the_records_show_earns_nothing(stack: Stack) -> None:
    ep = start(stack)
    put(stack, ep, b'{"profit_before_tax_2023": 1, "reporting_currency": "USD"}')
    first = verify(stack, ep)
    listed = stack.alice.get("/v1/rewards", params={"task_id": TASK}).json()["records"]
    exported = stack.alice.get("/v1/rewards/export", params={"task_id": TASK}).text
    shown = [first, listed, [json.loads(line) for line in exported.splitlines()]]
    seen = sorted(set(strings(shown)) | {json.dumps(shown)})
    # the best copy per field (scored by the verifier's own rules), sent as a second episode
    truth = check_for(next(t for t in load_suite(SUITE) if t.id == TASK)).truth
    answer = {}
    for key, spec in truth.fields.items():
        if spec.guessable:
            continue
        best = max(seen, key=lambda c: score_field(spec, c).score)
        assert score_field(spec, best).score == 0.0, (key, best)
        answer[key] = best
    ep = start(stack)
    put(stack, ep, json.dumps(answer).encode())
    assert_zero(verify(stack, ep))


def test_only_what_the_instruction_gives_away_earns_nothing(stack: Stack) -> None:
    ep = start(stack)
    put(
        stack, ep, json.dumps({"reporting_currency": "EUR", "statutory_tax_rate": "25.8%"}).encode()
    )
    rec = verify(stack, ep)
    assert_zero(rec)
    fields = rec["verifier"]["details"]["fields"]
    assert fields["reporting_currency"] == {"score": 1.0}  # right, and worth nothing alone
    assert fields["profit_before_tax_2023"] == {"score": 0.0, "reason": "missing"}


DEEP = b"[" * 200_000 + b"]" * 200_000


@pytest.mark.parametrize(
    ("name", "data", "dodge"),
    [
        ("deep JSON", DEEP, "json_too_deep"),
        ("huge exponent", b'{"profit_before_tax_2023": "1e999999999"}', None),
        # past what decimal accepts: InvalidOperation, which the verifier did not list, made
        # the verdict an error (out of the loss) in a seventh trial
        (
            "exponent past decimal's",
            b'{"profit_before_tax_2023": "1e99999999999999999999"}',
            "parse_crashed",
        ),
        ("huge integer", b'{"profit_before_tax_2023": 1' + b"0" * 4000 + b"}", None),
        ("NaN", b'{"profit_before_tax_2023": NaN}', None),
        (
            "wrong types",
            b'{"profit_before_tax_2023": {"a": [1, 2]}, "reporting_currency": []}',
            None,
        ),  # fmt: skip
        ("non-UTF-8", b'{"reporting_currency": "\xff\xfe"}', "not_utf8"),
        # a lone surrogate (valid ASCII, a str Python cannot encode) reached the verdict's
        # details, the record refused it and verify answered 400 forever: no record at all
        ("lone surrogate key", b'{"profit_before_tax_2023": 1, "\\ud800": 1}', None),
        ("lone surrogate value", b'{"reporting_currency": "\\udfff"}', None),
        ("infinite number", b'{"profit_before_tax_2023": 1e999, "Infinity": -1e999}', None),
        ("gigantic string", b'{"profit_before_tax_2023": "' + b"9" * 900_000 + b'"}', None),
    ],
)
def test_answers_that_break_parsing_score_zero(
    stack: Stack, name: str, data: bytes, dodge: str | None
) -> None:
    ep = start(stack)
    put(stack, ep, data)
    rec = verify(stack, ep)
    assert_zero(rec)
    assert rec["verifier"]["details"].get("dodge") == dodge, (name, rec["verifier"]["details"])


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        ("mkfifo /app/answer.json", "is not a regular file (a FIFO)"),
        ("ln -s /dev/zero /app/answer.json", "is not a regular file (a link)"),
        ("ln -s answer.json /app/answer.json", "cannot be read"),  # the engine's link loop
        ("mkdir /app/answer.json", "is not a regular file (a directory)"),
        (
            "mkdir /app/answer.json && cd /app/answer.json && "
            "head -c 3000000 /dev/urandom > big && seq 1 3000 | xargs touch",
            "is larger than",
        ),
    ],
)
def test_unreadable_answer_files_score_zero(stack: Stack, setup: str, reason: str) -> None:
    ep = start(stack)
    out = run(stack.alice, ep["sandbox_id"], setup)
    assert out["exit_code"] == 0, out["stderr"]
    rec = verify(stack, ep)
    assert_zero(rec)
    details = rec["verifier"]["details"]
    assert reason in details["reason"]
    assert details["dodge"] in ("not_a_file", "answer_too_large", "unreadable_path")
