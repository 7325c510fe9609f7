"""``crucible_guard``'s watch on the judging process (issue 9): every way agent-written code
enters a Python process that the hook can see is named before the code runs, in a real
interpreter with real change times; pristine files and plain data reads are not."""

from __future__ import annotations

import json
import os
import py_compile
import subprocess
import sys
import time
from pathlib import Path

import pytest

PY = Path(__file__).resolve().parents[2] / "service" / "runtime" / "supervisor" / "py"

DRIVER = r"""
import json, os, sys
sys.path.insert(0, {py!r})
import crucible_guard
seen = []
def sink(path, how):
    # what the judge would send; the agent's code has not run yet when this is called
    seen.append((path, how, os.environ.get("RAN", "")))
crucible_guard.watch_agent_code(sink)
crucible_guard.allow_agent_modules()  # as the observer does once it holds its key
sys.path.insert(0, {work!r})
sys.dont_write_bytecode = True
{body}
print(json.dumps(seen))
"""


def run(work: Path, body: str, window: tuple[int, int]) -> list[list[str]]:
    """Run ``body`` in a fresh interpreter with the guard installed as in the judge."""
    env = dict(
        os.environ,
        CRUCIBLE_PRISTINE_BEFORE=str(window[0]),
        CRUCIBLE_AGENT_WRITTEN_UNTIL=str(window[1]),
        PYTHONPATH=str(PY),
    )
    env.pop("CRUCIBLE_GUARD_RELAXED", None)
    code = DRIVER.format(py=str(PY), work=str(work), body=body)
    script = work.parent / "driver.py"
    script.write_text(code)
    # "pytest" in argv makes the guard treat the process as a judge (strict start-up)
    out = subprocess.run(
        [sys.executable, "-c", f"exec(open({str(script)!r}).read())", "pytest"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, tuple[int, int]]:
    """A workdir with a pristine module (before the window) and agent-written files in it."""
    work = tmp_path / "app"
    (work / "pkg").mkdir(parents=True)
    (work / "pristine_mod.py").write_text("VALUE = 1\n")
    (work / "pkg" / "__init__.py").write_text("")
    (work / "data.txt").write_text("print('data')\n")
    time.sleep(0.05)
    start = time.time_ns()
    time.sleep(0.05)
    (work / "agent_mod.py").write_text("import os\nos.environ['RAN'] = 'yes'\n")
    (work / "pkg" / "sub.py").write_text("import os\nos.environ['RAN'] = 'yes'\n")
    (work / "script.py").write_text("import os\nos.environ['RAN'] = 'yes'\n")
    src = tmp_path / "srcless_src.py"
    src.write_text("import os\nos.environ['RAN'] = 'yes'\n")
    py_compile.compile(str(src), cfile=str(work / "srcless.pyc"))
    # bytecode the agent planted for a pristine module: its header matches the source
    pristine = work / "pristine_mod.py"
    cache = work / "__pycache__"
    cache.mkdir()
    evil = tmp_path / "evil.py"
    evil.write_text("import os\nos.environ['RAN'] = 'yes'\nVALUE = 2\n")
    tag = sys.implementation.cache_tag
    py_compile.compile(str(evil), cfile=str(cache / f"pristine_mod.{tag}.pyc"))
    data = (cache / f"pristine_mod.{tag}.pyc").read_bytes()
    st = pristine.stat()
    header = (
        data[:8]
        + int(st.st_mtime).to_bytes(4, "little")
        + (st.st_size & 0xFFFFFFFF).to_bytes(4, "little")
    )
    (cache / f"pristine_mod.{tag}.pyc").write_bytes(header + data[16:])
    time.sleep(0.05)
    return work, (start, time.time_ns())


@pytest.mark.parametrize(
    ("body", "path", "how"),
    [
        ("import agent_mod", "agent_mod.py", "compile"),
        ("import pkg.sub", "pkg/sub.py", "compile"),
        # a sourceless .pyc's code can name any file: the module's own file is checked
        ("import srcless", "srcless.pyc", "exec"),
        ("import runpy; runpy.run_path({work!r} + '/script.py')", "script.py", "compile"),
        (
            "p = {work!r} + '/script.py'; exec(compile(open(p).read(), p, 'exec'))",
            "script.py",
            "compile",
        ),
        ("import pristine_mod; assert pristine_mod.VALUE == 2", "__pycache__", "bytecode"),
    ],
)
def test_agent_code_is_named_before_it_runs(
    tree: tuple[Path, tuple[int, int]], body: str, path: str, how: str
) -> None:
    work, window = tree
    seen = run(work, body.format(work=str(work)), window)
    assert seen, "the agent's code ran unseen"
    first_path, first_how, ran_before = seen[0]
    assert path in first_path and first_how == how, seen
    assert ran_before == "", "the sink was told only after the agent's code had run"


def test_pristine_code_and_data_reads_are_not_agent_code(
    tree: tuple[Path, tuple[int, int]],
) -> None:
    work, window = tree
    (work / "__pycache__").rename(work.parent / "moved-cache")  # only the real source
    body = "import pristine_mod, json, pkg; open({work!r} + '/script.py').read()"
    assert run(work, body.format(work=str(work)), window) == []


def test_outside_a_verification_nothing_is_watched(
    tree: tuple[Path, tuple[int, int]],
) -> None:
    work, _ = tree
    assert run(work, "import agent_mod", (0, 0)) == []


def test_text_the_tests_evaluate_themselves_counts_as_agent_code(
    tree: tuple[Path, tuple[int, int]],
) -> None:
    """A trial committed a forging file that the task's tests ``exec``-ed under a made-up
    name: text compiled from the tests' own frames is the agent's as far as the verifier
    knows. The same text evaluated by a library (dataclasses, namedtuple) is not."""
    work, window = tree
    tests_code = "exec(compile(\"exec('x = 1')\", '/tests/test_outputs.py', 'exec'))"
    seen = run(work, tests_code, window)
    assert seen and seen[0][:2] == ["/tests/test_outputs.py:1", "tests_compile"], seen
    library = "import collections; collections.namedtuple('P', 'x y')"
    assert run(work, library, window) == []


def test_a_file_changed_while_the_judge_runs_is_the_agents_unless_it_wrote_it(
    tree: tuple[Path, tuple[int, int]],
) -> None:
    """A program the tests ran planted ``/app/html.py`` for a later lazy import in the
    judge; files the judge writes itself (its own bytecode caches, outputs) stay its own."""
    work, window = tree
    planted = (
        "import subprocess, sys\n"
        "subprocess.run([sys.executable, '-c', "
        f"\"open({str(work)!r} + '/late.py', 'w').write('X = 1')\"], check=True)\n"
        "import importlib; importlib.invalidate_caches(); import late"
    )
    seen = run(work, planted, window)
    assert seen and seen[0][0].endswith("/late.py"), seen
    own = f"open({str(work)!r} + '/mine.py', 'w').write('X = 1')\nimport mine"
    assert run(work, own, window) == []


def test_a_watch_that_fails_on_an_event_fails_closed(
    tree: tuple[Path, tuple[int, int]],
) -> None:
    """An event the watch could not check may have been agent code: the judge hears of it
    (as ``watch_error``) instead of the failure being swallowed. A code object naming a
    file with a NUL byte makes the change-time check itself raise."""
    work, window = tree
    body = "c = compile('x = 1', 'f', 'exec').replace(co_filename='/t\\x00b'); exec(c)"
    seen = run(work, body, window)
    assert seen and seen[0][1] == "watch_error" and "ValueError" in seen[0][0], seen
