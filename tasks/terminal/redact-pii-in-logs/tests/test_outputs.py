"""Verifier for redact-pii-in-logs."""

import hashlib
import pathlib
import re

LOGS = pathlib.Path("/app/logs")
NAMES = ["auth.log", "billing.log", "mailer.log"]

# sha256 of the correctly redacted files (computed from the pristine logs)
EXPECTED_SHA256 = {
    "auth.log": "d0a413d243c708e65375a8e632f17026da6ed210b46534401bda7c51b5db37a1",
    "billing.log": "9afadfd206d534f7e27f0a4bff51d1baa2d5a882cc0a13c5a42d8cb0ee5fc2ab",
    "mailer.log": "e8893b8f2ece55f08b6ae98141fde7c8cb1fdf6e2b4cd6438c8b0da944a50a8a",
}
EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}")
CARD = re.compile(r"(?<!\d)\d{4}([- ]?)\d{4}\1\d{4}\1\d{4}(?!\d)")
TRACE = re.compile(r" trace=(\d{18}) ")


def _read(name):
    p = LOGS / name
    assert p.is_file(), f"missing {p}"
    return p.read_text()


def test_same_files_and_line_counts():
    assert sorted(p.name for p in LOGS.iterdir()) == NAMES
    for n in NAMES:
        lines = _read(n).splitlines()
        assert len(lines) == 400, n
        assert all(TRACE.search(l) for l in lines), f"{n}: trace ids damaged"


def test_no_email_left():
    for n in NAMES:
        assert not EMAIL.search(_read(n)), n
        assert "[EMAIL]" in _read(n)


def test_no_card_number_left():
    for n in NAMES:
        text = _read(n)
        assert not CARD.search(text), (n, CARD.search(text))
        assert re.search(r"\*\*\*\*-\*\*\*\*-\*\*\*\*-\d{4}", text), n


def test_passwords_masked():
    for n in NAMES:
        values = re.findall(r"(?:^| )password=(\S*)", _read(n), re.M)
        assert values, n
        assert set(values) == {"***"}, n


def test_password_policy_untouched():
    total = sum(_read(n).count("password_policy=strict min_length=") for n in NAMES)
    assert total == 105


def test_exact_redacted_content():
    for n in NAMES:
        digest = hashlib.sha256((LOGS / n).read_bytes()).hexdigest()
        assert digest == EXPECTED_SHA256[n], f"{n} differs from the expected redaction"
