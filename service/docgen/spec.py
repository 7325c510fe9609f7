"""What a generated document task is: its documents, and the fields an answer must have
with their ground truth (the entries of ``tests/expected.json``, see
``service.verifiers.document.GroundTruth``).

The ``Answer`` constructors (``money``, ``number``, ``percent``, ``date``, ``currency``,
``text``) take the true value as ``Decimal``/``date``/``str``, never as printed text, and
``evidence``: the strings the documents print for the field (checked against
``pdftotext`` output by the integration tests).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from service.docgen.pdf import Block, Doc, Heading, Para, Table
from service.docgen.pdf import PageBreak as Break

SCALE_WORDS = {"units": "", "thousands": "thousands of ", "millions": "millions of "}
CURRENCY_NAMES = {
    "USD": "US dollars",
    "EUR": "euros",
    "GBP": "pounds sterling",
    "CHF": "Swiss francs",
    "JPY": "Japanese yen",
    "CAD": "Canadian dollars",
}


@dataclass(frozen=True, kw_only=True)
class Answer:
    """One field of ``answer.json``: its key, the question and answer form shown to the
    agent, the ground-truth entry, and what the oracle writes (default: the value)."""

    key: str
    question: str
    form: str
    truth: dict[str, Any]
    oracle: Any
    evidence: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class TaskSpec:
    """A generated task: ``documents`` maps a file name in ``/app`` to its ``Doc``."""

    id: str
    title: str
    difficulty: str
    tags: tuple[str, ...]
    intro: str
    documents: dict[str, Doc]
    answers: tuple[Answer, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)


def _dec(value: Decimal) -> Decimal:
    return value.normalize() if value == value.to_integral_value() else value


def money(
    key: str,
    question: str,
    value: Decimal,
    *,
    currency: str,
    scale: str,
    tol: str,
    evidence: Sequence[str],
    oracle: Any = None,
    hint: str = "",
) -> Answer:
    """An amount of ``currency`` in ``scale``, right within ``tol`` (absolute, same scale)."""
    unit = f"{SCALE_WORDS[scale]}{CURRENCY_NAMES.get(currency, currency)}"
    form = f"number, in {unit}" + (f" ({hint})" if hint else "")
    truth = {
        "type": "money",
        "value": _dec(value),
        "currency": currency,
        "scale": scale,
        "tolerance": {"abs": Decimal(tol)},
    }
    return Answer(
        key=key,
        question=question,
        form=form,
        truth=truth,
        oracle=_dec(value) if oracle is None else oracle,
        evidence=tuple(evidence),
    )


def number(
    key: str,
    question: str,
    value: Decimal,
    *,
    unit: str,
    tol: str,
    evidence: Sequence[str],
    oracle: Any = None,
) -> Answer:
    """A plain quantity (``unit`` describes it: ``employees``, ``countries``)."""
    truth = {
        "type": "number",
        "value": _dec(value),
        "scale": "units",
        "unit": unit,
        "tolerance": {"abs": Decimal(tol)},
    }
    return Answer(
        key=key,
        question=question,
        form=f"number ({unit})",
        truth=truth,
        oracle=_dec(value) if oracle is None else oracle,
        evidence=tuple(evidence),
    )


def percent(
    key: str,
    question: str,
    value: Decimal,
    *,
    tol: str,
    evidence: Sequence[str],
    bare: str = "auto",
    oracle: Any = None,
    hint: str = "",
) -> Answer:
    """A percentage in points, right within ``tol`` points."""
    if bare == "auto" and abs(value) < 1:
        raise ValueError(f"{key}: a percent field under the auto rule must be >= 1 point")
    form = 'percentage, e.g. "12.5%"' if bare == "auto" else "number, in percent"
    truth = {"type": "percent", "value": _dec(value), "tolerance": {"abs": Decimal(tol)}}
    if bare != "auto":
        truth["bare"] = bare
    return Answer(
        key=key,
        question=question,
        form=form + (f" ({hint})" if hint else ""),
        truth=truth,
        oracle=f"{_dec(value)}%" if oracle is None else oracle,
        evidence=tuple(evidence),
    )


def date(key: str, question: str, value: dt.date, *, evidence: Sequence[str]) -> Answer:
    """A calendar date."""
    return Answer(
        key=key,
        question=question,
        form="date, YYYY-MM-DD",
        truth={"type": "date", "value": value.isoformat()},
        oracle=value.isoformat(),
        evidence=tuple(evidence),
    )


def currency(key: str, question: str, code: str, *, evidence: Sequence[str]) -> Answer:
    """A currency (ISO 4217 code)."""
    return Answer(
        key=key,
        question=question,
        form='ISO 4217 currency code, e.g. "USD"',
        truth={"type": "currency", "value": code},
        oracle=code,
        evidence=tuple(evidence),
    )


def text(
    key: str,
    question: str,
    value: str,
    *,
    evidence: Sequence[str] = (),
    aliases: Sequence[str] = (),
    exact: bool = False,
) -> Answer:
    """Free text scored by ANLS (``aliases`` are other accepted spellings). ``exact``: an
    identifier (an invoice number), where a near miss is a wrong answer, not partial
    credit: only the printed text (up to case and spacing) scores. (A trial earned 0.26
    of an invoice number by guessing its format.)"""
    truth: dict[str, Any] = {"type": "text", "value": value}
    if aliases:
        truth["aliases"] = list(aliases)
    if exact:
        truth["exact"] = True
    return Answer(
        key=key,
        question=question,
        form="text, exactly as printed" if exact else "text, as printed",
        truth=truth,
        oracle=value,
        evidence=tuple(evidence) or (value,),
    )


def cover(company: str, *lines: str) -> list[Block]:
    """A cover page: the company name, then centred lines, then a page break."""
    return [Heading(company, 0), *[Para(line, "cover") for line in lines], Break()]


@dataclass(frozen=True)
class Line:
    """A statement line: ``values`` per column (None leaves the cell empty, a str is printed
    as is); ``bold`` and ``rule`` (a rule above the numbers) mark totals."""

    label: str
    values: Sequence[Decimal | int | str | None] = ()
    bold: bool = False
    rule: bool = False
    indent: int = 0


def statement(
    columns: Sequence[str],
    lines: Sequence[Line],
    *,
    decimals: int = 0,
    caption: str | None = None,
    label_width: float = 0.52,
    font_size: float = 8.5,
    header_label: str = "",
) -> Table:
    """A financial statement table: a label column and right-aligned amount columns with
    parenthesised negatives."""
    from service.docgen.fmt import num

    rest = (1 - label_width) / max(1, len(columns))
    rows: list[list[str]] = []
    bold: set[int] = set()
    rules: set[int] = set()
    for i, line in enumerate(lines):
        cells = ["\u00a0" * (3 * line.indent) + line.label]
        for v in line.values:
            if v is None:
                cells.append("")
            elif isinstance(v, str):
                cells.append(v)
            else:
                cells.append(num(v, decimals, nil=True))
        cells += [""] * (len(columns) + 1 - len(cells))
        rows.append(cells)
        if line.bold:
            bold.add(i)
        if line.rule:
            rules.add(i)
    return Table(
        header=[[header_label, *columns]],
        rows=rows,
        widths=[label_width, *[rest] * len(columns)],
        align="L" + "R" * len(columns),
        bold=frozenset(bold),
        rule_above=frozenset(rules),
        caption=caption,
        font_size=font_size,
    )
