"""Answers built to crash or stall the document verifier's parsing score 0 with the reason
(status ok), and those that hit a cap name it in ``details["dodge"]``."""

from __future__ import annotations

import json
import time

import pytest

from service.verifiers.document import (
    MAX_JSON_DEPTH,
    GroundTruth,
    score_answer,
    score_bounded,
)

TRUTH = GroundTruth.model_validate(
    {
        "version": 1,
        "fields": {
            "a": {"type": "money", "value": 1284.372, "currency": "USD", "scale": "millions"},
            "b": {"type": "text", "value": "Kestrel Robotics Inc."},
            "c": {"type": "date", "value": "2023-12-31"},
        },
    }
)
RIGHT = {"a": 1284.372, "b": "Kestrel Robotics Inc.", "c": "2023-12-31"}


@pytest.mark.parametrize(
    ("data", "reason", "dodge"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "answer.json is nested deeper", "json_too_deep"),
        (
            b'{"a":' + b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1) + b"}",
            "answer.json is nested deeper",
            "json_too_deep",
        ),  # fmt: skip
        (b'{"a": NaN}', "answer.json is not valid JSON", None),
        (b'{"a": Infinity}', "answer.json is not valid JSON", None),
        (b'{"a": 1' + b"0" * 5000 + b"}", "answer.json is not valid JSON", None),
        (b"\xff\xfe{}", "answer.json is not UTF-8", "not_utf8"),
        (
            b"{" + b",".join(b'"k%d": 1' % i for i in range(2000)) + b"}",
            "answer.json has more than",
            "too_many_keys",
        ),  # fmt: skip
    ],
)
def test_answers_that_break_parsing_score_zero(data: bytes, reason: str, dodge: str) -> None:
    r = score_bounded(TRUTH, data)
    assert (r.status, r.reward) == ("ok", 0.0), r.details
    assert r.details["reason"].startswith(reason)
    assert r.details.get("dodge") == dodge


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("1e999999999", "out_of_range"),
        ("9" * 500, "out_of_range"),
        (1e300, "out_of_range"),
        ("1,000,000,000,000,000,000 trillion", "out_of_range"),
        ([1284.372], "wrong_type"),
        ({"value": 1284.372}, "wrong_type"),
        (True, "wrong_type"),
        ("x" * 100_000, "too_long"),
    ],
)
def test_hostile_values_score_zero_for_their_field(value: object, reason: str) -> None:
    answer = {**RIGHT, "a": value}
    r = score_bounded(TRUTH, json.dumps(answer).encode())
    assert r.status == "ok" and r.reward == pytest.approx(2 / 3)
    assert r.details["fields"]["a"] == {"score": 0.0, "reason": reason}


def test_a_huge_exponent_is_refused_fast() -> None:
    # Formatting 1e999999999 in full would build a billion-digit string.
    t0 = time.perf_counter()
    r = score_answer(TRUTH, json.dumps({**RIGHT, "a": "-1E+999999999"}).encode())
    assert r.details["fields"]["a"]["reason"] == "out_of_range"
    assert time.perf_counter() - t0 < 1.0


def test_the_right_answer_through_the_worker_scores_one() -> None:
    r = score_bounded(TRUTH, json.dumps(RIGHT).encode())
    assert (r.status, r.reward) == ("ok", 1.0)
    assert "expected" not in json.dumps({k: v for k, v in r.details.items() if k != "private"})
