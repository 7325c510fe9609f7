"""Fields the instruction alone gives away earn no credit on their own.

A guesser that sees only a task's instruction (never its documents) answers every field
from what the instruction states: the currencies of the countries and nationalities it
names and of the currency words in its answer forms, period ends of the years it mentions,
dates it prints, names it prints, and the statutory rates of the countries it names; and
from priors: the largest economies, for any text field. Every
field that such a guess scores above 0 on must be declared ``guessable`` in the task's
ground truth (``service.docgen.tasks.GUESSABLE``), and the guesser's best answer must
score 0 on every bundled task.
"""

from __future__ import annotations

import calendar
import itertools
import json
import re
from pathlib import Path

import pytest

from service.tasks.loader import load_suite
from service.verifiers.document import GroundTruth, check_for, combine, score_answer, score_field

SUITE = Path(__file__).resolve().parents[2] / "tasks" / "document"
TASKS = {t.id: t for t in load_suite(SUITE)}

#: What a guesser knows without the documents (common knowledge, not task data).
COUNTRY_CURRENCY = {
    "dutch": "EUR", "netherlands": "EUR", "european": "EUR", "euro": "EUR", "euros": "EUR",
    "german": "EUR",
    "swiss": "CHF", "schweiz": "CHF", "switzerland": "CHF", "canadian": "CAD", "canada": "CAD",
    "uk": "GBP", "british": "GBP", "sterling": "GBP", "us": "USD", "u.s.": "USD",
    "new york": "USD", "japan": "JPY", "japanese": "JPY", "yen": "JPY", "brazil": "BRL",
    "brasil": "BRL",
}  # fmt: skip
STATUTORY_RATES = {"dutch": ["25.8%", "19%", "21%"], "uk": ["25%", "20%"], "us": ["21%"],
                   "swiss": ["14.6%", "8.5%", "7.7%"], "canadian": ["26.5%", "15%"]}  # fmt: skip
VAT_RATES = ["21%", "20%", "19%", "25%", "22%", "23%", "24%", "17%", "7.7%", "8.1%"]
MONTHS = {m.lower(): i for i, m in enumerate(calendar.month_name) if m}
#: Answers a guesser tries on any text field without reading anything: the largest
#: economies and markets (a trial's "Germany" for a food group's largest market: 0.2).
PRIORS = ["United States", "China", "Germany", "Japan", "United Kingdom", "France", "India",
          "Brazil", "Italy", "Canada"]  # fmt: skip


def candidates(instruction: str) -> dict[str, list[str]]:
    """Guesses per field type, from the instruction text alone."""
    low = instruction.lower()
    words = set(re.findall(r"[a-z.]+", low))
    named = [k for k in COUNTRY_CURRENCY if (k in words if " " not in k else k in low)]
    currencies = sorted({COUNTRY_CURRENCY[k] for k in named})
    years = sorted({int(y) for y in re.findall(r"(?<!\d)(20\d\d)(?!\d)", instruction)})
    years = sorted({y + d for y in years for d in (-1, 0, 1)})
    dates = [
        f"{y}-{m:02d}-{calendar.monthrange(y, m)[1]:02d}" for y in years for m in (3, 6, 9, 12)
    ]
    for d, month, y in re.findall(r"(\d{1,2}) ([A-Z][a-z]+) (20\d\d)", instruction):
        if month.lower() in MONTHS:
            for yy in (int(y) - 1, int(y), int(y) + 1):
                dates.append(f"{yy}-{MONTHS[month.lower()]:02d}-{int(d):02d}")
    for month, d, y in re.findall(r"([A-Z][a-z]+) (\d{1,2}), (20\d\d)", instruction):
        if month.lower() in MONTHS:
            dates.append(f"{y}-{MONTHS[month.lower()]:02d}-{int(d):02d}")
    names = re.findall(r"[A-Z][\w.]*(?: (?:[A-Z][\w.]*|do|de|of))+", instruction)
    rates = [r for k in named for r in STATUTORY_RATES.get(k, [])]
    if "vat" in words:  # the common standard VAT rates (a trial's "21%" for euros: 1/6)
        rates += VAT_RATES
    return {
        "currency": currencies,
        "date": sorted(set(dates)),
        "text": sorted(set(names) | set(PRIORS)),
        "percent": rates,
        "money": [],
        "number": [],
    }


@pytest.mark.parametrize("task_id", sorted(TASKS))
def test_every_field_the_instruction_gives_away_is_declared_guessable(task_id: str) -> None:
    task = TASKS[task_id]
    truth = check_for(task).truth
    guesses = candidates(task.instruction)
    for key, spec in truth.fields.items():
        best = max((score_field(spec, g).score for g in guesses[spec.type]), default=0.0)
        if best > 0:
            assert spec.guessable, f"{task_id}.{key}: the instruction alone scores {best}"


@pytest.mark.parametrize("task_id", sorted(TASKS))
def test_the_best_instruction_only_answer_scores_zero(task_id: str) -> None:
    task = TASKS[task_id]
    truth = check_for(task).truth
    guesses = candidates(task.instruction)
    answer: dict[str, str] = {}
    for key, spec in truth.fields.items():
        scored = [(score_field(spec, g).score, g) for g in guesses[spec.type]]
        if scored:
            answer[key] = max(scored)[1]
    assert score_answer(truth, json.dumps(answer).encode()).reward == 0.0, answer


def test_guessable_fields_count_in_proportion_to_the_others() -> None:
    truth = GroundTruth.model_validate(
        {
            "version": 1,
            "fields": {
                "a": {"type": "currency", "value": "EUR"},
                "b": {"type": "currency", "value": "USD"},
                "c": {"type": "currency", "value": "CHF", "guessable": True},
            },
        }
    )
    for a, b, c in itertools.product((0.0, 1.0), repeat=3):
        got = combine({"a": a, "b": b, "c": c}, truth)
        assert got == pytest.approx((a + b) / 2 * (2 + c) / 3)
    assert combine({"a": 0.0, "b": 0.0, "c": 1.0}, truth) == 0.0
    assert combine({"a": 1.0, "b": 1.0, "c": 1.0}, truth) == 1.0
    with pytest.raises(ValueError, match="not guessable add up to 0"):
        GroundTruth.model_validate(
            {"version": 1, "fields": {"c": {"type": "currency", "value": "CHF", "guessable": True}}}
        )


def test_every_bundled_task_declares_what_its_instruction_gives_away() -> None:
    declared = {
        t: sorted(k for k, f in check_for(task).truth.fields.items() if f.guessable)
        for t, task in TASKS.items()
    }
    assert declared["effective-tax-rate"] == ["reporting_currency", "statutory_tax_rate"]
    assert declared["subsidiaries-multi-currency"] == [
        "largest_subsidiary_by_usd_revenue",
        "swiss_functional_currency",
    ]
