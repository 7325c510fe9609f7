"""Hidden checks for semver-library-bugfix (every rule of the documented spec).

The agent's package never runs in this process: ``semver_calls.py`` calls it in a child
process and only JSON comes back, so the outcome this process reports is evidence
(code that ran here would have the reporter's rights).
"""

import hashlib
import itertools
import json
import os
import subprocess
import sys

PKG = "/app/semverlite"
# read here: the processes this one starts cannot read the tests (Crucible hides them)
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "semver_calls.py")) as f:
    DRIVER = f.read()

TESTS_SHA256 = "ffc285b3221def9e70ad203fdf494c6bc662243be1609f5a6ecac30f6821db66"


def call(*calls):
    """Results of ``calls`` (``[op, *args]``, see ``semver_calls.py``), from a child process."""
    r = subprocess.run(
        [sys.executable, "-c", DRIVER],
        input=json.dumps(calls),
        capture_output=True,
        text=True,
        cwd=PKG,
        timeout=60,
        env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert isinstance(out, list) and len(out) == len(calls), out
    return out


def parse_str(s):
    return call(["str", s])[0]


def compare(a, b):
    return call(["compare", a, b])[0]


def satisfies(v, r):
    return call(["satisfies", v, r])[0]


def max_satisfying(vs, r):
    return call(["max_satisfying", vs, r])[0]


def test_parse_valid_and_roundtrip():
    for s in [
        "0.0.0",
        "1.2.3-alpha.1",
        "1.0.0-0.3.7",
        "1.0.0-x.7.z.92",
        "1.0.0-x-y-z.--",
        "1.0.0+20130313144700",
        "1.0.0-beta+exp.sha.5114f85",
        "1.0.0+21AF26D3----117B344092BD",
        "1.0.0-0a",
        "1.0.0+001",
        "10.20.30",
        "1.2.3----RC-SNAPSHOT.12.9.1--.12+788",
    ]:
        assert parse_str(s) == s, s
    assert parse_str("  v1.2.3 ") == "1.2.3"
    assert parse_str("=1.2.3-rc.1") == "1.2.3-rc.1"
    assert call(["fields", "1.2.3-beta.11+b.7"])[0] == [1, 2, 3, ["beta", "11"], ["b", "7"]]


INVALID = [
    "01.1.1",
    "1.01.1",
    "1.1.01",
    "1.2",
    "1.2.3-",
    "1.2.3+",
    "1.2.3-01",
    "1.2.3-alpha.01",
    "1.2.3-a..b",
    "1.2.3-a$",
    "1.2.3+a..b",
    "",
    "v",
    "1.2.3.4",
    "a.b.c",
    "1.2.3 -a",
    "vv1.2.3",
    "-1.2.3",
]


def test_parse_rejects_invalid():
    results = call(*[["str", bad] for bad in INVALID])
    for bad, got in zip(INVALID, results):
        assert isinstance(got, dict) and got.get("value_error") is True, (bad, got)


def test_precedence_chain():
    chain = [
        "1.0.0-alpha",
        "1.0.0-alpha.1",
        "1.0.0-alpha.beta",
        "1.0.0-beta",
        "1.0.0-beta.2",
        "1.0.0-beta.11",
        "1.0.0-rc.1",
        "1.0.0",
        "1.0.1-0",
        "1.0.1",
        "1.9.0",
        "1.10.0",
        "2.0.0",
        "10.0.0",
    ]
    pairs = list(itertools.product(enumerate(chain), repeat=2))
    results = call(*[["compare", a, b] for (_, a), (_, b) in pairs])
    for ((i, a), (j, b)), got in zip(pairs, results):
        assert got == (i > j) - (i < j), (a, b)


def test_numeric_identifiers_lower_than_alphanumeric():
    assert compare("1.0.0-1", "1.0.0--") == -1
    assert compare("1.0.0--", "1.0.0-1") == 1
    assert compare("1.0.0-999", "1.0.0-a") == -1
    assert compare("1.0.0-a.1", "1.0.0-a.-") == -1
    assert compare("1.0.0-2", "1.0.0-10") == -1
    assert compare("1.0.0-0a", "1.0.0-1") == 1


def test_build_metadata_ignored():
    assert compare("1.0.0+a", "1.0.0+b") == 0
    assert compare("1.0.0-rc.1+x.1", "1.0.0-rc.1") == 0
    assert compare("1.0.0+zzz", "1.0.1") == -1
    assert satisfies("1.2.3+build.5", "=1.2.3")


def test_caret_ranges():
    cases = {
        "^1.2.3": {"1.2.3": True, "1.9.9": True, "2.0.0": False, "1.2.2": False},
        "^0.2.3": {"0.2.3": True, "0.2.99": True, "0.3.0": False, "1.0.0": False},
        "^0.0.3": {"0.0.3": True, "0.0.4": False, "0.1.0": False},
    }
    for rng, expect in cases.items():
        results = call(*[["satisfies", v, rng] for v in expect])
        for (v, ok), got in zip(expect.items(), results):
            assert got is ok, (v, rng)


def test_tilde_ranges():
    expect = {"1.2.3": True, "1.2.9": True, "1.3.0": False, "1.2.2": False}
    for (v, ok), got in zip(expect.items(), call(*[["satisfies", v, "~1.2.3"] for v in expect])):
        assert got is ok, v
    assert satisfies("0.0.5", "~0.0.1") and not satisfies("0.1.0", "~0.0.1")


def test_prerelease_against_bounds():
    assert satisfies("2.0.0-rc.1", "<2.0.0")
    assert satisfies("2.0.0-rc.1", "^1.2.3")
    assert not satisfies("1.2.3-alpha", ">=1.2.3")
    assert satisfies("1.2.3-alpha.10", ">1.2.3-alpha.9")


def test_whitespace_and_or():
    assert satisfies("1.5.0", "  >=1.2.3    <2.0.0  ")
    assert satisfies("1.5.0", ">= 1.2.3 < 2.0.0")
    assert not satisfies("2.0.0", ">= 1.2.3 < 2.0.0")
    assert satisfies("3.1.0", "^1.0.0||^3.0.0")
    assert satisfies("3.1.0", " ^1.0.0 ||  ^3.0.0 ")
    assert not satisfies("2.5.0", "^1.0.0 || ^3.0.0")
    assert satisfies("1.2.3", "1.2.3") and satisfies("1.2.3", "=1.2.3") and satisfies("1.2.3", "v1.2.3")
    assert satisfies("0.9.0", "<=0.9.0") and not satisfies("0.9.1", "<=0.9.0")
    assert satisfies("0.9.1", ">0.9.0") and not satisfies("0.9.0", ">0.9.0")


def test_max_satisfying():
    vs = ["1.2.3", "1.10.0", "1.9.0", "2.0.0-rc.1", "2.0.0", "1.10.0-beta.1"]
    assert max_satisfying(vs, "^1.0.0") == "2.0.0-rc.1"
    assert max_satisfying(vs, "~1.9.0") == "1.10.0-beta.1"
    assert max_satisfying(vs, "~1.2.0") == "1.2.3"
    assert max_satisfying(vs, ">=1.10.0-alpha <1.10.0") == "1.10.0-beta.1"
    assert max_satisfying(vs, ">3.0.0") is None
    assert max_satisfying(["1.2.3+b", "1.2.3+a", "1.2.2"], "^1.0.0") == "1.2.3+b"


def test_package_tests_pass_and_unchanged():
    with open(os.path.join(PKG, "tests/test_semverlite.py"), "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == TESTS_SHA256
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=PKG,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "7 passed" in r.stdout
