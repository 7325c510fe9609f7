"""The document-domain verifier: compare the fields of the agent's ``answer.json`` with the
task's ground truth, field by field, after normalization (``service.verifiers.normalize``).

Where the answer comes from: the episode's end state. The episode's container is frozen
(every process suspended, so nothing can change the file while it is read) and
``answer.json`` is read from it engine-side as an archive (symlinks resolved inside the
container's root by the engine); nothing is executed in the agent's sandbox. The ground
truth (``tests/expected.json``) never enters a sandbox: it is read on the control plane.

Task settings (``[crucible.settings]`` of ``task.toml``; unknown keys are an error):
  * ``answer_path``: where the agent writes its answer (default ``<workdir>/answer.json``;
    a relative path is taken relative to the workdir);
  * ``ground_truth``: the file under ``tests/`` holding the ground truth (default
    ``expected.json``).

Ground-truth schema (``GroundTruth``, version 1)::

    {"version": 1, "source": "...", "fields": {"<key>": {"type": ..., "value": ...}, ...}}

Field types and how one is scored (each field scores in [0, 1]):
  * ``number``: ``value`` in ``scale`` (``units``, ``thousands``, ``millions``,
    ``billions``); the answer is read by ``parse_amount`` and brought to ``scale`` by
    ``to_scale`` (a number without a scale word is already in ``scale``). Right (1) when
    ``|answer - value| <= max(tolerance.abs, tolerance.rel * |value|)``, else 0; a currency
    or percent mark in the answer is wrong. ``unit`` (e.g. ``"shares"``) is descriptive.
  * ``money``: a ``number`` with an ISO 4217 ``currency``; a currency written in the
    answer must be that one (an answer without a currency is taken to be in it).
  * ``percent``: ``value`` in percentage points; the answer is read by ``percent_points``
    with the field's ``bare`` rule (``auto``: a bare ``|x| < 1`` is a fraction).
  * ``date``: ``value`` ``YYYY-MM-DD``; right when ``parse_date`` gives that date
    (``order`` resolves ``03/04/2024``-style answers).
  * ``currency``: ``value`` an ISO code; right when ``parse_currency`` gives it.
  * ``text``: ``value`` (+ ``aliases``); the score is ANLS (``anls``, threshold 0.5 by
    default): partial credit ``1 - NL`` for a near miss, 0 past the threshold. With
    ``"exact": true`` (identifiers: an invoice number) only the text itself scores, up to
    case and spacing (``normalize_text``): a near miss of an identifier is another
    identifier (a trial earned 0.26 of one by guessing its format).

Reward. With ``n`` the weighted mean score of the fields that are not guessable, ``g``
that of the guessable ones (``"guessable": true``: the instruction alone gives the value
away, e.g. the currency of the country it names, a period end it states), and ``W_n``,
``W_g`` their total weights: ``reward = n * (W_n + W_g * g) / (W_n + W_g)``. A guessable
field counts like any other when the rest is right, in proportion when it is partly right,
and not at all on its own. Without guessable fields it is the weighted mean (``weight``
defaults to 1): the fraction of fields right, text fields counting their ANLS.
Components: ``field.<key>`` (each score), ``fields_right`` (scores of exactly 1) and
``fields_total``. Keys in the answer that the ground truth does not name are ignored
(listed in ``details.unknown_keys``).

What tenants see: ``details.fields.<key>`` holds the field's ``score`` and, when it lost
points, a ``reason`` code (``missing``, ``too_long``, ``wrong_type``, ``unparseable``,
``out_of_range``, ``mismatch``, ``partial``), never the expected value. The expected
value, the answer as read and the full explanation are in ``details["private"]`` (admins
only; ``service.rewards.redact``).

Caps (each scores 0 with the reason, status ok): ``answer.json`` over 1 MiB, not UTF-8,
nested deeper than ``MAX_JSON_DEPTH``, with more than ``MAX_ANSWER_KEYS`` keys, ``NaN`` /
``Infinity``; a string value over ``MAX_VALUE_CHARS`` (1000) characters or a number out
of range (``normalize.OutOfRange``) scores 0 for that field. Parsing and scoring run in a
bounded worker (``service.verifiers.bounded``: ``PARSE_TIMEOUT_S``, ``PARSE_MEMORY_MB``);
past a limit, or if it crashes, the answer scores 0.

Outcomes: a missing answer scores 0 (``details.reason``). One that is a directory, a
link, a FIFO, oversized, not UTF-8, too deep, or past a worker limit scores 0 with the
cause in ``details["dodge"]`` too; not JSON or not an object scores 0. A malformed task
(no or invalid ground truth, unknown settings), a runtime failure or no worker process is
``status="error"`` with reward None (excluded from loss, retried).
"""

from __future__ import annotations

import datetime as dt
import io
import json
import posixpath
import tarfile
import time
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from service.errors import CrucibleError, NotFound, VerifierError
from service.runtime.base import SandboxRuntime
from service.tasks.models import Task
from service.verifiers.base import VerifierResult
from service.verifiers.bounded import BoundExceeded, WorkerUnavailable, run_bounded
from service.verifiers.normalize import (
    ISO_CODES,
    SCALES,
    BareRule,
    DateOrder,
    NormalizationError,
    OutOfRange,
    anls,
    json_repr,
    normalize_text,
    parse_amount,
    parse_currency,
    parse_date,
    percent_points,
    to_scale,
)
from service.verifiers.readback import engine_reads_container
from service.verifiers.registry import EndState, register

NAME = "document"
VERSION = "2"
#: Largest ``answer.json`` read, in bytes; a larger one scores 0.
MAX_ANSWER_BYTES = 1 << 20
#: Longest string value scored, in characters; a longer one scores 0 without being parsed.
MAX_VALUE_CHARS = 1000
#: Deepest nesting of ``answer.json`` (an object of scalars is 1); deeper scores 0.
MAX_JSON_DEPTH = 16
#: Most keys in the answer object; more score 0.
MAX_ANSWER_KEYS = 1000
#: Wall-clock (s) and memory (MiB) limits of parsing and scoring, in a bounded worker.
PARSE_TIMEOUT_S = 10.0
PARSE_MEMORY_MB = 1024
DEFAULT_GROUND_TRUTH = "expected.json"
ANSWER_FILE = "answer.json"
_SETTINGS = frozenset({"answer_path", "ground_truth"})


# --------------------------------------------------------------------------- ground truth


class Tolerance(BaseModel):
    """How far a number may be from the truth: ``abs`` in the field's scale (or percentage
    points), ``rel`` as a fraction of the true value; the larger bound applies."""

    model_config = ConfigDict(extra="forbid")

    abs: Decimal = Field(Decimal(0), ge=0)
    rel: Decimal = Field(Decimal(0), ge=0)

    def allows(self, error: Decimal, truth: Decimal) -> bool:
        """Whether ``error`` (an absolute difference) is within the tolerance."""
        return error <= max(self.abs, self.rel * abs(truth))


class _FieldBase(BaseModel):
    """What every field has: ``weight`` in the reward, ``guessable`` (the instruction alone
    gives the value away: the field earns credit only in proportion to the others, see
    ``combine``), ``evidence`` (the strings the document prints for it; used by the corpus
    checks, never by scoring)."""

    model_config = ConfigDict(extra="forbid")

    weight: float = Field(1.0, ge=0)
    guessable: bool = False
    evidence: list[str] = Field(default_factory=list)


class NumberField(_FieldBase):
    """A quantity in ``scale``; ``unit`` describes it (``"shares"``, ``"employees"``)."""

    type: Literal["number"]
    value: Decimal
    scale: str = "units"
    unit: str | None = None
    tolerance: Tolerance = Field(default_factory=Tolerance)

    @field_validator("scale")
    @classmethod
    def _scale(cls, value: str) -> str:
        if value not in SCALES:
            raise ValueError(f"unknown scale {value!r}; known: {sorted(SCALES)}")
        return value


class MoneyField(NumberField):
    """An amount of ``currency`` (ISO 4217) in ``scale``."""

    type: Literal["money"]  # type: ignore[assignment]
    currency: str

    @field_validator("currency")
    @classmethod
    def _currency(cls, value: str) -> str:
        if value not in ISO_CODES:
            raise ValueError(f"{value!r} is not a known ISO 4217 code")
        return value


class PercentField(_FieldBase):
    """A percentage; ``value`` and ``tolerance.abs`` in percentage points."""

    type: Literal["percent"]
    value: Decimal
    bare: BareRule = "auto"
    tolerance: Tolerance = Field(default_factory=Tolerance)


class DateField(_FieldBase):
    """A calendar date; ``order`` resolves ambiguous numeric answers."""

    type: Literal["date"]
    value: dt.date
    order: DateOrder | None = None


class CurrencyField(_FieldBase):
    """A currency, as an ISO 4217 code."""

    type: Literal["currency"]
    value: str

    @field_validator("value")
    @classmethod
    def _code(cls, value: str) -> str:
        if value not in ISO_CODES:
            raise ValueError(f"{value!r} is not a known ISO 4217 code")
        return value


class TextField(_FieldBase):
    """Free text scored by ANLS against ``value`` and ``aliases``."""

    type: Literal["text"]
    value: str = Field(min_length=1)
    aliases: list[str] = Field(default_factory=list)
    threshold: float = Field(0.5, gt=0, le=1)
    exact: bool = False


FieldSpec = Annotated[
    NumberField | MoneyField | PercentField | DateField | CurrencyField | TextField,
    Field(discriminator="type"),
]


class GroundTruth(BaseModel):
    """A task's ``tests/expected.json``: the fields an answer must have, in order, and
    ``source``, where the truth came from (free text, e.g. the generator and its seed)."""

    model_config = ConfigDict(extra="forbid")

    version: Literal[1]
    source: str = ""
    fields: dict[str, FieldSpec] = Field(min_length=1)

    @field_validator("fields")
    @classmethod
    def _some_weight(cls, value: dict[str, Any]) -> dict[str, Any]:
        if sum(f.weight for f in value.values() if not f.guessable) <= 0:
            raise ValueError("the weights of the fields that are not guessable add up to 0")
        return value


def load_ground_truth(path: Path) -> GroundTruth:
    """Read and validate a ground-truth file.

    Raises:
        VerifierError: the file is missing or does not match the schema (a task defect).
    """
    try:
        return GroundTruth.model_validate_json(path.read_bytes())
    except OSError as e:
        raise VerifierError(f"ground truth {path} unreadable: {e.strerror}") from None
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        where = ".".join(str(x) for x in first["loc"])
        raise VerifierError(f"ground truth {path}: {where}: {first['msg']}") from None


# --------------------------------------------------------------------------- scoring

#: The public reason of a field that lost points: what kind of miss, never the truth.
ReasonCode = Literal[
    "missing", "too_long", "wrong_type", "unparseable", "out_of_range", "mismatch", "partial"
]


@dataclass(frozen=True, kw_only=True)
class FieldScore:
    """One field's outcome: ``score`` in [0, 1]; ``reason`` (public: a ``ReasonCode``, None
    when it scored 1); ``detail`` (private: the full explanation, which may name the truth)
    and what the answer was read as (``normalized``, private)."""

    score: float
    reason: ReasonCode | None = None
    detail: str | None = None
    normalized: str | None = None

    def public(self) -> dict[str, Any]:
        """What a tenant sees of this field: its score and reason code."""
        out: dict[str, Any] = {"score": self.score}
        if self.reason is not None:
            out["reason"] = self.reason
        return out

    def private(self, *, expected: str, given: object) -> dict[str, Any]:
        """What only an admin sees: the truth, the answer, how it was read, why it lost."""
        out: dict[str, Any] = {"expected": expected, "given": given}
        if self.normalized is not None:
            out["normalized"] = self.normalized
        if self.detail is not None:
            out["detail"] = self.detail
        return out


def expected_text(spec: FieldSpec) -> str:
    """The truth of a field as a short human-readable string (for private details)."""
    if isinstance(spec, MoneyField):
        return f"{spec.value} {spec.currency} ({spec.scale})"
    if isinstance(spec, NumberField):
        return f"{spec.value} ({spec.scale})"
    if isinstance(spec, PercentField):
        return f"{spec.value}%"
    if isinstance(spec, DateField):
        return spec.value.isoformat()
    return spec.value


def _plain(number: Decimal) -> str:
    text = format(number.normalize(), "f")
    return "0" if text in ("-0", "") else text


def _verdict(ok: bool, normalized: str, detail: str) -> FieldScore:
    if ok:
        return FieldScore(score=1.0, normalized=normalized)
    return FieldScore(score=0.0, reason="mismatch", detail=detail, normalized=normalized)


def score_field(spec: FieldSpec, given: object) -> FieldScore:
    """Score one answer value against its field (pure; never raises for any JSON value)."""
    if given is None:
        return FieldScore(score=0.0, reason="missing", detail="no answer")
    if isinstance(given, str) and len(given) > MAX_VALUE_CHARS:
        return FieldScore(
            score=0.0, reason="too_long", detail=f"longer than {MAX_VALUE_CHARS} characters"
        )
    if not isinstance(given, str | int | float) or isinstance(given, bool):
        return FieldScore(
            score=0.0, reason="wrong_type", detail=f"expected a scalar, got {json_repr(given)}"
        )
    try:
        if isinstance(spec, NumberField):
            return _score_number(spec, given)
        if isinstance(spec, PercentField):
            points = percent_points(given, bare=spec.bare)
            ok = spec.tolerance.allows(abs(points - spec.value), spec.value)
            return _verdict(ok, f"{_plain(points)}%", f"{_plain(points)}% is not {spec.value}%")
        if isinstance(spec, DateField):
            date = parse_date(given, order=spec.order)
            iso = date.isoformat()
            return _verdict(date == spec.value, iso, f"{iso} is not {spec.value.isoformat()}")
        if isinstance(spec, CurrencyField):
            code = parse_currency(given)
            return _verdict(code == spec.value, code, f"{code} is not {spec.value}")
        return _score_text(spec, given)
    except OutOfRange as e:
        return FieldScore(score=0.0, reason="out_of_range", detail=str(e))
    except NormalizationError as e:
        return FieldScore(score=0.0, reason="unparseable", detail=f"unreadable: {e}")


def _score_number(spec: NumberField, given: object) -> FieldScore:
    amount = parse_amount(given)
    if amount.percent:
        return FieldScore(
            score=0.0, reason="wrong_type", detail="a percentage where an amount was asked for"
        )
    want = spec.currency if isinstance(spec, MoneyField) else None
    if amount.currency is not None and amount.currency != want:
        return FieldScore(
            score=0.0,
            reason="mismatch",
            detail=f"currency {amount.currency} where {want or 'no currency'} was asked for",
        )
    value = to_scale(amount, scale=spec.scale)
    shown = f"{_plain(value)} ({spec.scale})"
    ok = spec.tolerance.allows(abs(value - spec.value), spec.value)
    return _verdict(ok, shown, f"{shown} is not {spec.value} within {_tolerance_text(spec)}")


def _tolerance_text(spec: NumberField) -> str:
    t = spec.tolerance
    parts = [f"±{t.abs}"] if t.abs else []
    parts += [f"±{t.rel * 100}%"] if t.rel else []
    return " or ".join(parts) or "exactly"


def _score_text(spec: TextField, given: str | int | float) -> FieldScore:
    text = given if isinstance(given, str) else json.dumps(given)
    if spec.exact:
        truths = {normalize_text(t) for t in (spec.value, *spec.aliases)}
        score = 1.0 if normalize_text(text) in truths else 0.0
    else:
        score = round(anls(text, [spec.value, *spec.aliases], threshold=spec.threshold), 6)
    if score == 1.0:
        return FieldScore(score=1.0, normalized=text)
    return FieldScore(
        score=score,
        reason="partial" if score > 0 else "mismatch",
        detail=f"ANLS {score:.3f} against {spec.value!r}",
        normalized=text,
    )


@dataclass(frozen=True, kw_only=True)
class AnswerProblem:
    """Why an ``answer.json`` cannot be scored at all; ``dodge`` names the cause when it is a
    cap or an unreadable file rather than a plain wrong answer."""

    reason: str
    dodge: str | None = None


def _depth(value: object) -> int:
    """The nesting depth of a parsed JSON value (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
    return deepest


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def parse_answer(data: bytes) -> tuple[dict[str, Any] | None, AnswerProblem | None]:
    """(the answer object, None) or (None, why it cannot be scored). Caps: ``MAX_ANSWER_BYTES``,
    ``MAX_JSON_DEPTH``, ``MAX_ANSWER_KEYS``; ``NaN``/``Infinity`` are not JSON."""
    if len(data) > MAX_ANSWER_BYTES:
        return None, AnswerProblem(
            reason=f"{ANSWER_FILE} is larger than {MAX_ANSWER_BYTES} bytes",
            dodge="answer_too_large",
        )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        return None, AnswerProblem(
            reason=f"{ANSWER_FILE} is not UTF-8 (byte {e.start})", dodge="not_utf8"
        )
    try:
        answer = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        return None, AnswerProblem(
            reason=f"{ANSWER_FILE} is nested deeper than {MAX_JSON_DEPTH} levels",
            dodge="json_too_deep",
        )
    except ValueError as e:
        return None, AnswerProblem(reason=f"{ANSWER_FILE} is not valid JSON: {str(e)[:200]}")
    if _depth(answer) > MAX_JSON_DEPTH:
        return None, AnswerProblem(
            reason=f"{ANSWER_FILE} is nested deeper than {MAX_JSON_DEPTH} levels",
            dodge="json_too_deep",
        )
    if not isinstance(answer, dict):
        kind = type(answer).__name__ if answer is not None else "null"
        return None, AnswerProblem(
            reason=f"{ANSWER_FILE} must hold a JSON object of fields, not {kind}"
        )
    if len(answer) > MAX_ANSWER_KEYS:
        return None, AnswerProblem(
            reason=f"{ANSWER_FILE} has more than {MAX_ANSWER_KEYS} keys", dodge="too_many_keys"
        )
    return answer, None


def combine(scores: dict[str, float], truth: GroundTruth) -> float:
    """The reward from the field scores (module docstring): with ``n`` the weighted mean
    score of the non-guessable fields and ``g`` that of the guessable ones, ``W_n``, ``W_g``
    their weights, ``reward = n * (W_n + W_g * g) / (W_n + W_g)``."""
    w_n = w_g = s_n = s_g = 0.0
    for key, spec in truth.fields.items():
        if spec.guessable:
            w_g, s_g = w_g + spec.weight, s_g + spec.weight * scores[key]
        else:
            w_n, s_n = w_n + spec.weight, s_n + spec.weight * scores[key]
    n = s_n / w_n
    g = s_g / w_g if w_g else 0.0
    return round(n * (w_n + w_g * g) / (w_n + w_g), 9)


def zero_result(reason: str, truth: GroundTruth, *, dodge: str | None = None) -> VerifierResult:
    """Reward 0 for an answer that cannot be scored at all (status ok)."""
    components: dict[str, float] = {f"field.{key}": 0.0 for key in truth.fields}
    components.update(fields_right=0.0, fields_total=float(len(truth.fields)))
    details: dict[str, Any] = {"reason": reason, "passed": False}
    if dodge is not None:
        details["dodge"] = dodge
    return VerifierResult(
        name=NAME, version=VERSION, status="ok", reward=0.0, components=components, details=details
    )


def score_answer(
    truth: GroundTruth, data: bytes | None, *, problem: str | None = None
) -> VerifierResult:
    """Score the bytes of ``answer.json`` (None when it could not be read, with ``problem``
    saying why) against ``truth``. Pure; the status is always ``ok``. Public details: per
    field its score and reason code; ``details["private"]["fields"]`` holds the truth."""
    if data is None:
        return zero_result(problem or f"no {ANSWER_FILE}", truth)
    answer, bad = parse_answer(data)
    if answer is None:
        assert bad is not None
        return zero_result(bad.reason, truth, dodge=bad.dodge)
    components: dict[str, float] = {}
    public: dict[str, Any] = {}
    private: dict[str, Any] = {}
    scores: dict[str, float] = {}
    for key, spec in truth.fields.items():
        given = answer.get(key)
        result = score_field(spec, given)
        scores[key] = result.score
        components[f"field.{key}"] = result.score
        public[key] = result.public()
        private[key] = result.private(expected=expected_text(spec), given=_short(given))
    components["fields_right"] = float(sum(s == 1.0 for s in scores.values()))
    components["fields_total"] = float(len(truth.fields))
    reward = combine(scores, truth)
    details: dict[str, Any] = {"fields": public, "passed": reward >= 1.0}
    unknown = sorted(k for k in answer if k not in truth.fields)
    if unknown:
        details["unknown_keys"] = [_short(k) for k in unknown[:50]]
    details["private"] = {"fields": private}
    return VerifierResult(
        name=NAME,
        version=VERSION,
        status="ok",
        reward=reward,
        components=components,
        details=details,
    )


def _short(value: object) -> object:
    """``value`` itself when it is a short scalar, else a truncated repr (details stay small)."""
    if isinstance(value, str):
        return value if len(value) <= 200 else value[:197] + "..."
    if value is None or isinstance(value, bool | int | float):
        return value if not isinstance(value, int) or value.bit_length() < 64 else json_repr(value)
    return json_repr(value)


# --------------------------------------------------------------------------- the end state


@dataclass(frozen=True, kw_only=True)
class DocumentCheck:
    """What one task asks of the verifier: its ground truth and where the answer is."""

    truth: GroundTruth
    answer_path: str


def check_for(task: Task) -> DocumentCheck:
    """The ground truth and answer path of ``task``.

    Raises:
        VerifierError: unknown settings, no tests directory, or a bad ground-truth file.
    """
    settings = dict(task.verifier_settings)
    unknown = sorted(set(settings) - _SETTINGS)
    if unknown:
        raise VerifierError(
            f"task {task.key}: unknown [crucible.settings] {unknown}; known: {sorted(_SETTINGS)}"
        )
    if task.tests_dir is None:
        raise VerifierError(f"task {task.key} has no tests/ directory with its ground truth")
    name = settings.get("ground_truth", DEFAULT_GROUND_TRUTH)
    answer_path = settings.get("answer_path", ANSWER_FILE)
    if not isinstance(name, str) or not isinstance(answer_path, str) or not answer_path:
        raise VerifierError(f"task {task.key}: ground_truth and answer_path must be strings")
    path = (task.tests_dir / name).resolve()
    if not path.is_relative_to(task.tests_dir.resolve()):
        raise VerifierError(f"task {task.key}: ground_truth {name!r} leaves tests/")
    answer_path = posixpath.normpath(posixpath.join(task.environment.workdir, answer_path))
    return DocumentCheck(truth=load_ground_truth(path), answer_path=answer_path)


def read_file(
    runtime: SandboxRuntime, container_id: str, path: str
) -> tuple[bytes | None, str, str | None]:
    """``(bytes, "", None)`` of a regular file read engine-side, or ``(None, why not, dodge)``
    where ``dodge`` names the cause when the path holds something other than a missing file
    (a directory, a link, a FIFO or another special file, a file over the cap, a path the
    engine cannot resolve while it reads the container: ``readback``).

    Raises ``CrucibleError`` for runtime failures other than a missing path.
    """
    try:
        stream = runtime.get_archive(container_id, path)
    except NotFound:
        return None, f"{path} does not exist", None
    except CrucibleError as e:
        if not engine_reads_container(runtime, container_id):
            raise
        return None, f"{path} cannot be read: {e.detail[:200]}", "unreadable_path"
    buf = bytearray()
    limit = MAX_ANSWER_BYTES + (64 << 10)  # the tar header and padding on top of the file
    too_large = f"{path} is larger than {MAX_ANSWER_BYTES} bytes"
    try:
        for chunk in stream:
            buf += chunk
            if len(buf) > limit:
                return None, too_large, "answer_too_large"
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()
    try:
        with tarfile.open(fileobj=io.BytesIO(bytes(buf))) as tar:
            member = tar.next()
            if member is None:
                return None, f"{path} does not exist", None
            if not member.isfile():
                kind = (
                    "a directory"
                    if member.isdir()
                    else "a link"
                    if member.issym()
                    else ("a FIFO" if member.isfifo() else "a special file")
                )
                return None, f"{path} is not a regular file ({kind})", "not_a_file"
            if member.size > MAX_ANSWER_BYTES:
                return None, too_large, "answer_too_large"
            fh = tar.extractfile(member)
            return (fh.read() if fh else b""), "", None
    except tarfile.TarError as e:
        raise VerifierError(f"reading {path}: the engine returned a bad archive: {e}") from e


def score_bounded(truth: GroundTruth, data: bytes) -> VerifierResult:
    """``score_answer`` in a bounded worker (``PARSE_TIMEOUT_S``, ``PARSE_MEMORY_MB``): an
    answer that makes parsing run out of time or memory, or crash, scores 0 with the cause
    in ``details["dodge"]`` (``parse_timeout``, ``parse_memory``, ``parse_crashed``). So
    does any exception the worker raises: it saw only the ground truth, which is fixed, and
    the answer, so what raised is the answer's doing (a trial's ``"1e99999999999999999999"``
    raised ``decimal.InvalidOperation``, and the verdict was an error, out of the loss).

    Raises ``VerifierError`` when no worker can be started (Crucible's failure).
    """
    try:
        return run_bounded(
            score_answer,
            truth,
            data,
            timeout_s=PARSE_TIMEOUT_S,
            memory_mb=PARSE_MEMORY_MB,
            what=f"parsing {ANSWER_FILE}",
        )
    except BoundExceeded as e:
        return zero_result(e.message, truth, dodge=f"parse_{e.cause}")
    except WorkerUnavailable as e:
        raise VerifierError(str(e)) from None
    except Exception as e:  # noqa: BLE001 (the answer's doing: see above)
        reason = f"scoring {ANSWER_FILE} failed on its content ({type(e).__name__})"
        return zero_result(reason, truth, dodge="parse_crashed")


def verify_episode(task: Task, end: EndState) -> VerifierResult:
    """Registry entry: score ``task``'s ``answer.json`` in the episode's end state."""
    t0 = time.perf_counter()

    def failed(reason: str) -> VerifierResult:
        return VerifierResult(
            name=NAME,
            version=VERSION,
            status="error",
            reward=None,
            duration_ms=(time.perf_counter() - t0) * 1e3,
            details={"reason": reason},
        )

    try:
        check = check_for(task)
        data, problem, dodge = read_file(end.runtime, end.episode_container_id, check.answer_path)
        if data is None:
            result = zero_result(problem, check.truth, dodge=dodge)
        else:
            result = score_bounded(check.truth, data)
    except VerifierError as e:
        return failed(e.detail)
    except CrucibleError as e:
        return failed(f"verifier infrastructure failed: {e.detail}")
    except Exception as e:  # a verifier bug is an error record, never a silent 0
        return failed(f"verifier crashed: {type(e).__name__}: {e}")
    return VerifierResult(
        name=result.name,
        version=result.version,
        status=result.status,
        reward=result.reward,
        components=result.components,
        details={**result.details, "answer_path": check.answer_path},
        duration_ms=(time.perf_counter() - t0) * 1e3,
    )


register(NAME, verify_episode)
