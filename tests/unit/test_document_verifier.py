"""The document verifier: field scoring, the reward, malformed answers, ground-truth and
settings validation, reading the answer from the end state (fake runtime), and every
bundled document task's oracle (1.0) and empty answer (0.0)."""

from __future__ import annotations

import io
import json
import posixpath
import tarfile
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from service.errors import NotFound, SandboxError, VerifierError
from service.runtime.base import ExecRequest, SandboxSpec
from service.tasks.loader import load_suite
from service.templates import Template
from service.verifiers import registry
from service.verifiers.document import (
    MAX_ANSWER_BYTES,
    GroundTruth,
    check_for,
    load_ground_truth,
    score_answer,
    score_field,
    verify_episode,
)
from service.verifiers.registry import EndState

SUITE = Path(__file__).resolve().parents[2] / "tasks" / "document"


def spec(**entry: Any) -> Any:
    return GroundTruth.model_validate({"version": 1, "fields": {"f": entry}}).fields["f"]


def truth(fields: dict[str, dict[str, Any]]) -> GroundTruth:
    return GroundTruth.model_validate({"version": 1, "fields": fields})


MONEY = {
    "type": "money",
    "value": 1284.372,
    "currency": "USD",
    "scale": "millions",
    "tolerance": {"abs": 0.05},
}


# --------------------------------------------------------------------------- fields


@pytest.mark.parametrize(
    ("given", "score"),
    [
        (1284.372, 1.0),
        (1284.4, 1.0),  # within 0.05
        (1284.3, 0.0),  # truncated, not rounded: 0.072 off
        (1284.422, 1.0),  # exactly at the bound
        (1284.423, 0.0),
        ("1,284.372", 1.0),
        ("$1,284.4 million", 1.0),
        ("US$1.284372bn", 1.0),
        ("1284372 thousand", 1.0),
        ("USD 1,284,372k", 1.0),
        ("1284372000", 0.0),  # no scale word: read in millions
        ("€1,284.4m", 0.0),  # wrong currency
        ("12.5%", 0.0),  # a percentage is not an amount
        ("-1,284.4", 0.0),  # sign matters
        ("about 1284", 0.0),
        (None, 0.0),
        (True, 0.0),
    ],
)
def test_money(given: object, score: float) -> None:
    assert score_field(spec(**MONEY), given).score == score


def test_money_reasons() -> None:
    s = spec(**MONEY)
    eur = score_field(s, "€1,284.4m")
    assert (eur.reason, eur.detail) == ("mismatch", "currency EUR where USD was asked for")
    wrong = score_field(s, 1300)
    assert wrong.normalized == "1300 (millions)"
    assert wrong.reason == "mismatch"
    assert wrong.detail == "1300 (millions) is not 1284.372 within ±0.05"
    assert (score_field(s, None).reason, score_field(s, None).detail) == ("missing", "no answer")
    assert score_field(s, "abc").reason == "unparseable"
    assert score_field(s, "abc").detail.startswith("unreadable: ")


def test_number_refuses_a_currency_and_honours_rel_tolerance() -> None:
    s = spec(type="number", value=13213, unit="employees", tolerance={"rel": 0.01})
    assert score_field(s, 13213).score == 1.0
    assert score_field(s, "13,345").score == 1.0  # 1% of 13213 = 132.13
    assert score_field(s, "13,346").score == 0.0
    assert score_field(s, "$13,213").score == 0.0
    exact = spec(type="number", value=59, unit="countries")
    assert score_field(exact, 59).score == 1.0
    assert score_field(exact, 59.5).score == 0.0


def test_negative_money_in_accounting_notation() -> None:
    s = spec(type="money", value=-11.157, currency="USD", scale="millions", tolerance={"abs": 0.05})
    for given in (-11.157, "(11.157)", "\u221211.2", "$(11,157)k", "-11,157 thousand"):
        assert score_field(s, given).score == 1.0, given
    assert score_field(s, 11.157).score == 0.0


def test_percent_field() -> None:
    s = spec(type="percent", value=26.6749, tolerance={"abs": 0.06})
    for given in ("26.7%", 26.7, 0.267, "0.2667", "26.6749 %", "2667.49 bp"):
        assert score_field(s, given).score == 1.0, given
    for given in (2667, "26.8%", "$26.7", 0.25):
        assert score_field(s, given).score == 0.0, given
    assert score_field(s, 0.267).normalized == "26.7%"
    points = spec(type="percent", value=0.84, bare="points", tolerance={"abs": 0.001})
    assert score_field(points, 0.84).score == 1.0
    assert score_field(points, "0.84%").score == 1.0
    assert score_field(points, 84).score == 0.0


def test_date_field() -> None:
    s = spec(type="date", value="2024-12-09")
    for given in ("2024-12-09", "9 December 2024", "Dec. 9, 2024", "09.12.2024"):
        assert score_field(s, given).score == 1.0, given
    assert score_field(s, "12/09/2024").score == 0.0  # ambiguous without an order
    assert score_field(spec(type="date", value="2024-12-09", order="MDY"), "12/09/2024").score == 1
    assert score_field(s, "2024-09-12").score == 0.0
    assert score_field(s, "2024-09-12").detail == "2024-09-12 is not 2024-12-09"
    ambiguous = spec(type="date", value="2024-04-03")
    assert score_field(ambiguous, "03/04/2024").score == 0.0  # ambiguous: unreadable
    dmy = spec(type="date", value="2024-04-03", order="DMY")
    assert score_field(dmy, "03/04/2024").score == 1.0


def test_currency_field() -> None:
    s = spec(type="currency", value="CAD")
    for given in ("CAD", "cad", "C$", "Canadian dollars"):
        assert score_field(s, given).score == 1.0, given
    assert score_field(s, "$").score == 0.0  # "$" is USD
    assert score_field(s, "$").detail == "USD is not CAD"
    assert score_field(s, 5).score == 0.0


def test_text_field_is_anls() -> None:
    s = spec(type="text", value="Kestrel Robotics Inc.", aliases=["Kestrel Robotics, Inc."])
    assert score_field(s, "kestrel robotics inc.").score == 1.0
    assert score_field(s, "Kestrel Robotics, Inc.").score == 1.0
    assert score_field(s, "Kestrel Robotics").score == pytest.approx(16 / 21, abs=1e-6)
    assert score_field(s, "Acme").score == 0.0
    assert score_field(s, ["Kestrel Robotics Inc."]).score == 0.0
    long = score_field(s, "Kestrel Robotics Inc." + " " * 1000)
    assert (long.score, long.reason, long.detail) == (
        0.0,
        "too_long",
        "longer than 1000 characters",
    )
    number = spec(type="text", value="10234")
    assert score_field(number, 10234).score == 1.0  # a JSON number is compared as text


def test_an_exact_text_field_pays_only_the_identifier() -> None:
    # Trial 21: an invoice number's format guessed from the instruction ("INV-2025-000000")
    # earned ANLS partial credit (~0.26 with another field); an identifier one character
    # off is another invoice.
    s = spec(type="text", value="INV-2025-006116", exact=True)
    assert score_field(s, "inv-2025-006116").score == 1.0  # case and spacing only
    assert score_field(s, " INV-2025-006116 ").score == 1.0
    for near in ("INV-2025-006117", "INV-2025-000000", "INV-2025-00611"):
        assert (score_field(s, near).score, score_field(s, near).reason) == (0.0, "mismatch")
    assert score_field(spec(type="text", value="INV-2025-006116"), "INV-2025-000000").score > 0


def test_the_generated_invoice_number_is_exact() -> None:
    root = Path(__file__).resolve().parents[2] / "tasks" / "document" / "invoice-line-items"
    fields = json.loads((root / "tests" / "expected.json").read_text())["fields"]
    assert fields["invoice_number"]["exact"] is True
    assert "exactly as printed" in (root / "instruction.md").read_text()


# --------------------------------------------------------------------------- the answer


def test_reward_is_the_weighted_mean_and_components_name_fields() -> None:
    gt = truth(
        {
            "a": MONEY,
            "b": {"type": "date", "value": "2023-12-31"},
            "c": {"type": "text", "value": "Kestrel Robotics Inc.", "weight": 2},
            "d": {"type": "currency", "value": "EUR", "weight": 0},
        }
    )
    answer = {"a": "$1,284.4m", "b": "31.12.2023", "c": "Kestrel Robotics", "x": 1}
    r = score_answer(gt, json.dumps(answer).encode())
    c = round(16 / 21, 6)
    assert r.status == "ok"
    assert r.reward == pytest.approx((1 + 1 + 2 * c) / 4)
    assert r.components == {
        "field.a": 1.0,
        "field.b": 1.0,
        "field.c": c,
        "field.d": 0.0,
        "fields_right": 2.0,
        "fields_total": 4.0,
    }
    assert r.details["unknown_keys"] == ["x"]
    assert r.details["passed"] is False
    assert r.details["fields"]["d"] == {"score": 0.0, "reason": "missing"}
    assert r.details["fields"]["c"] == {"score": c, "reason": "partial"}
    assert r.details["private"]["fields"]["d"] == {
        "expected": "EUR",
        "given": None,
        "detail": "no answer",
    }
    assert r.details["private"]["fields"]["a"]["normalized"] == "1284.4 (millions)"
    # nothing but the private part names an expected value
    public = {k: v for k, v in r.details.items() if k != "private"}
    assert "EUR" not in json.dumps(public) and "Kestrel" not in json.dumps(public)


def test_all_right_scores_one() -> None:
    gt = truth({"a": MONEY, "b": {"type": "percent", "value": 12.5}})
    r = score_answer(gt, b'\xef\xbb\xbf{"a": 1284.372, "b": "12.5%"}')  # a BOM is accepted
    assert (r.reward, r.details["passed"]) == (1.0, True)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (None, "no answer.json"),
        (b"", "answer.json is not valid JSON"),
        (b"{", "answer.json is not valid JSON"),
        (b"[1, 2]", "answer.json must hold a JSON object of fields, not list"),
        (b"null", "answer.json must hold a JSON object of fields, not null"),
        (b'"text"', "answer.json must hold a JSON object of fields, not str"),
        (b'{"a": "\xff"}', "answer.json is not UTF-8"),
        (b" " * (MAX_ANSWER_BYTES + 1), "answer.json is larger than"),
    ],
)
def test_malformed_answers_score_zero_with_a_reason(data: bytes | None, reason: str) -> None:
    r = score_answer(truth({"a": MONEY}), data)
    assert (r.status, r.reward) == ("ok", 0.0)
    assert r.details["reason"].startswith(reason)
    assert r.components == {"field.a": 0.0, "fields_right": 0.0, "fields_total": 1.0}


def test_empty_object_scores_zero() -> None:
    r = score_answer(truth({"a": MONEY}), b"{}")
    assert (r.status, r.reward) == ("ok", 0.0)


# --------------------------------------------------------------------------- ground truth


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"a": {"type": "money", "value": 1, "currency": "XXX"}},
        {"a": {"type": "money", "value": 1}},
        {"a": {"type": "number", "value": 1, "scale": "lakhs"}},
        {"a": {"type": "number", "value": 1, "typo": True}},
        {"a": {"type": "percent", "value": 1, "bare": "sometimes"}},
        {"a": {"type": "date", "value": "2024-02-30"}},
        {"a": {"type": "currency", "value": "Euro"}},
        {"a": {"type": "text", "value": ""}},
        {"a": {"type": "vector", "value": 1}},
        {"a": {"type": "number", "value": 1, "tolerance": {"abs": -1}}},
        {"a": {"type": "number", "value": 1, "weight": 0}},
    ],
)
def test_invalid_ground_truth_is_a_verifier_error(tmp_path: Path, fields: dict[str, Any]) -> None:
    path = tmp_path / "expected.json"
    path.write_text(json.dumps({"version": 1, "fields": fields}))
    with pytest.raises(VerifierError, match="ground truth"):
        load_ground_truth(path)


def test_missing_ground_truth_is_a_verifier_error(tmp_path: Path) -> None:
    with pytest.raises(VerifierError, match="unreadable"):
        load_ground_truth(tmp_path / "nope.json")


def test_ground_truth_values_are_exact_decimals() -> None:
    gt = truth({"a": MONEY})
    assert gt.fields["a"].value == Decimal("1284.372")


# --------------------------------------------------------------------------- tasks and settings


def _task(tmp_path: Path, settings: str = "", expected: object | None = None) -> Any:
    root = tmp_path / "suite" / "t1"
    (root / "environment").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "environment" / "Dockerfile").write_text("FROM scratch\n")
    (root / "instruction.md").write_text("Read the PDF.\n")
    (root / "task.toml").write_text(
        '[crucible]\ndomain = "document"\n[crucible.settings]\n' + settings
    )
    if expected is None:
        expected = {"version": 1, "fields": {"a": MONEY}}
    (root / "tests" / "expected.json").write_text(json.dumps(expected))
    suite = load_suite(tmp_path / "suite")
    assert not suite.errors, suite.errors
    return suite.tasks[0]


def test_check_for_defaults_and_settings(tmp_path: Path) -> None:
    task = _task(tmp_path)
    assert task.verifier == "document" and task.test_command is None
    assert check_for(task).answer_path == "/app/answer.json"
    other = _task(tmp_path / "b", 'answer_path = "out/result.json"\n')
    assert check_for(other).answer_path == "/app/out/result.json"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ("answer_file = 'x'\n", "unknown"),
        ("ground_truth = '../task.toml'\n", "leaves tests/"),
        ("ground_truth = 'missing.json'\n", "unreadable"),
        ("answer_path = 3\n", "must be strings"),
    ],
)
def test_check_for_refuses_bad_settings(tmp_path: Path, settings: str, message: str) -> None:
    with pytest.raises(VerifierError, match=message):
        check_for(_task(tmp_path, settings))


# --------------------------------------------------------------------------- the end state


class FakeRuntime:
    """Just enough of an engine for the document verifier: archives of the episode's frozen
    container; it refuses exec and container creation."""

    def __init__(self, files: dict[str, bytes | str | None], *, engine_down: bool = False):
        self.files = files  # bytes: a file; "link": a symlink; None: a directory
        self.engine_down = engine_down
        self.read_from: list[str] = []

    def create(self, spec: SandboxSpec) -> str:
        raise AssertionError("the document verifier needs no sandbox of its own")

    def exec(self, container_id: str, request: ExecRequest) -> None:
        raise AssertionError("the document verifier must never exec")

    def stat_path(self, container_id: str, path: str) -> object:
        if self.engine_down:
            raise SandboxError("engine is down")
        return object()

    def get_archive(self, container_id: str, path: str) -> Iterator[bytes]:
        if self.engine_down:
            raise SandboxError("engine is down")
        self.read_from.append(container_id)
        if self.files.get(path) == "refused":
            raise SandboxError("evalSymlinksInScope: too many links")
        if path not in self.files:
            raise NotFound(f"no such file {path}")
        content = self.files[path]
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(posixpath.basename(path))
            if content == "link":
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tar.addfile(info)
            elif content is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                assert isinstance(content, bytes)
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
        data = buf.getvalue()
        return iter([data[i : i + 1000] for i in range(0, len(data), 1000)])


def _end(runtime: FakeRuntime, disposed: list[str]) -> EndState:
    return EndState(
        runtime=runtime,  # type: ignore[arg-type]
        episode_container_id="episode",
        pristine_image="sha256:pristine",
        template=Template(name="t", image="task:1", workdir="/app"),
        deployment="test",
        fresh_sandbox=lambda: runtime.create(None),  # type: ignore[arg-type]
        dispose=disposed.append,
    )


def test_verify_reads_the_answer_from_the_frozen_episode_container(tmp_path: Path) -> None:
    task = _task(tmp_path)
    runtime = FakeRuntime({"/app/answer.json": b'{"a": "$1,284.4 million"}'})
    disposed: list[str] = []
    r = verify_episode(task, _end(runtime, disposed))
    assert (r.status, r.reward) == ("ok", 1.0)
    assert runtime.read_from == ["episode"]
    assert disposed == []
    assert r.details["answer_path"] == "/app/answer.json" and r.duration_ms > 0


@pytest.mark.parametrize(
    ("files", "reason"),
    [
        ({}, "/app/answer.json does not exist"),
        ({"/app/answer.json": "link"}, "/app/answer.json is not a regular file"),
        ({"/app/answer.json": None}, "/app/answer.json is not a regular file"),
        ({"/app/answer.json": b"x" * (MAX_ANSWER_BYTES + 10)}, "/app/answer.json is larger"),
        ({"/app/answer.json": b"{not json"}, "answer.json is not valid JSON"),
        ({"/app/answer.json": "refused"}, "/app/answer.json cannot be read"),
    ],
)
def test_agent_outcomes_score_zero_not_error(
    tmp_path: Path, files: dict[str, Any], reason: str
) -> None:
    disposed: list[str] = []
    r = verify_episode(_task(tmp_path), _end(FakeRuntime(files), disposed))
    assert (r.status, r.reward) == ("ok", 0.0)
    assert r.details["reason"].startswith(reason)
    assert disposed == []


def test_infrastructure_failures_are_errors(tmp_path: Path) -> None:
    disposed: list[str] = []
    r = verify_episode(_task(tmp_path), _end(FakeRuntime({}, engine_down=True), disposed))
    assert (r.status, r.reward) == ("error", None)
    assert "engine is down" in r.details["reason"]
    assert disposed == []
    broken = _task(tmp_path / "b", expected={"version": 1, "fields": {}})
    r = verify_episode(broken, _end(FakeRuntime({}), disposed))
    assert (r.status, r.reward) == ("error", None)
    assert r.details["reason"].startswith("ground truth")


def test_registered_as_document() -> None:
    assert registry.get("document") is verify_episode


# --------------------------------------------------------------------------- bundled tasks


def _oracle_answer(task_dir: Path) -> bytes:
    script = (task_dir / "solution" / "solve.sh").read_text()
    return script.split("<<'JSON'\n", 1)[1].rsplit("JSON\n", 1)[0].encode()


def test_bundled_suite_loads() -> None:
    suite = load_suite(SUITE)
    assert not suite.errors
    assert len(suite) >= 10
    for task in suite:
        assert (task.domain, task.verifier, task.test_command) == ("document", "document", None)
        assert task.environment.allow_internet is False and task.solution_path is not None
        check = check_for(task)
        assert check.answer_path == "/app/answer.json"
        assert len(check.truth.fields) >= 4


@pytest.mark.parametrize("task_id", sorted(p.name for p in SUITE.iterdir() if p.is_dir()))
def test_bundled_oracle_scores_one_and_empty_zero(task_id: str) -> None:
    task = next(t for t in load_suite(SUITE) if t.id == task_id)
    gt = check_for(task).truth
    r = score_answer(gt, _oracle_answer(task.path))
    assert r.reward == 1.0, r.details
    assert all(v["score"] == 1.0 for v in r.details["fields"].values())
    assert score_answer(gt, b"{}").reward == 0.0
    # every key the instruction names is a ground-truth field, and the reverse
    for key in gt.fields:
        assert f"`{key}`" in task.instruction
