"""Run calls against the agent's ``semverlite`` in this (child) process and print the results
as JSON: the test process that reports never runs the code under test, so only plain data
comes back from it.

stdin: a JSON list of calls, each ``[op, *args]`` with op one of ``str`` (``str(parse(s))``),
``fields`` (the parsed version's parts), ``compare``, ``satisfies``, ``max_satisfying``.
stdout: one JSON list, a result per call; a call that raised gives
``{"raises": <exception class name>, "value_error": <isinstance ValueError>}``.
"""

import json
import sys

sys.path.insert(0, "/app/semverlite")
sys.dont_write_bytecode = True

from semverlite import compare, max_satisfying, parse, satisfies  # noqa: E402


def plain(value):
    """Only JSON's own types survive; anything else is named by its type."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value if type(value) in (bool, int, float, str, type(None)) else repr(value)
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return {"type": type(value).__name__}


def run(op, *args):
    if op == "str":
        return str(parse(args[0]))
    if op == "fields":
        v = parse(args[0])
        return [v.major, v.minor, v.patch, list(v.prerelease), list(v.build)]
    if op == "compare":
        return compare(*args)
    if op == "satisfies":
        return satisfies(*args)
    if op == "max_satisfying":
        return max_satisfying(*args)
    raise SystemExit(f"unknown op {op!r}")


results = []
for call in json.load(sys.stdin):
    try:
        results.append(plain(run(*call)))
    except Exception as e:  # noqa: BLE001 (the test decides what a raise means)
        results.append({"raises": type(e).__name__, "value_error": isinstance(e, ValueError)})
print(json.dumps(results))
