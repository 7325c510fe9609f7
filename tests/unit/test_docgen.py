"""The document corpus generator: regenerating ``tasks/document`` from the seed reproduces
the committed ground truth and every file byte for byte (reportlab invariant mode)."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from pathlib import Path

import pytest

from service.docgen import fmt
from service.docgen.tasks import SEED, build_all, rng_for
from service.docgen.write import differences, ground_truth, suite_files

SUITE = Path(__file__).resolve().parents[2] / "tasks" / "document"


def test_ground_truth_regenerates_from_the_seed() -> None:
    """Without rendering (no reportlab needed): the truth is computed before printing."""
    for spec in build_all():
        committed = json.loads((SUITE / spec.id / "tests" / "expected.json").read_text())
        regenerated = json.loads(json.dumps(ground_truth(spec), default=float))
        assert committed == regenerated, spec.id
        assert committed["source"].startswith(f"service.docgen seed {SEED}")


def test_every_file_regenerates_byte_for_byte() -> None:
    files = suite_files(build_all())
    assert differences(SUITE, files) == []
    assert len([f for f in files if f.endswith(".pdf")]) >= 12


def test_generation_is_deterministic_in_process() -> None:
    a = suite_files(build_all())
    b = suite_files(build_all())
    assert a == b
    assert rng_for("x").random() == rng_for("x").random() != rng_for("y").random()


def test_suite_shape() -> None:
    specs = build_all()
    assert len(specs) >= 10
    assert len({s.id for s in specs}) == len(specs)
    assert {s.difficulty for s in specs} == {"easy", "medium", "hard"}
    types = {a.truth["type"] for s in specs for a in s.answers}
    assert types == {"money", "number", "percent", "date", "currency", "text"}
    for s in specs:
        for a in s.answers:
            if a.truth["type"] == "percent" and a.truth.get("bare", "auto") == "auto":
                assert abs(a.truth["value"]) >= 1, (s.id, a.key)


@pytest.mark.parametrize(
    ("value", "kwargs", "text"),
    [
        (Decimal("1284372"), {}, "1,284,372"),
        (Decimal("-11157"), {}, "(11,157)"),
        (Decimal("-4.25"), {"decimals": 1, "negative": "minus"}, "\u22124.3"),
        (Decimal("-4.25"), {"decimals": 1, "negative": "hyphen"}, "-4.3"),
        (0, {"nil": True}, "\u2014"),
        (Decimal("2.345"), {"decimals": 2}, "2.35"),  # half-up, not banker's rounding
    ],
)
def test_number_formats(value: Decimal, kwargs: dict[str, object], text: str) -> None:
    assert fmt.num(value, **kwargs) == text  # type: ignore[arg-type]


def test_other_formats() -> None:
    d = dt.date(2024, 12, 9)
    assert fmt.pct(Decimal("-2.35")) == "\u22122.4%"
    assert fmt.pct(Decimal("6.05"), plus=True) == "+6.1%"
    assert fmt.date_long(d) == "9 December 2024"
    assert fmt.date_us(d) == "December 9, 2024"
    assert fmt.date_abbr_us(d) == "Dec. 9, 2024"
    assert fmt.date_abbr_us(dt.date(2024, 5, 1)) == "May 1, 2024"
    assert fmt.date_dmy_dots(d) == "09.12.2024"
    assert fmt.date_mdy_slash(d) == "12/09/2024"
    assert fmt.date_dd_mon_yyyy(d) == "09-Dec-2024"
    assert fmt.date_weekday(d) == "Monday, 9 December 2024"
