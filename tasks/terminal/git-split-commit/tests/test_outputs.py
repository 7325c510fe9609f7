"""Verifier for git-split-commit."""

import os
import subprocess
import sys
import tarfile
import tempfile

REPO = "/app/textstats"
PARENT = "ad1c7a8b8d9460fe0ddf0fc4bbc520b7f84bd48f"
ORIGINAL_TREE = "a4e1cf38b43e6daf42a6fa383cbb162c21bae6d9"
FIX_TREE = "c056b7437a26ec368faeb8bdc359db3843640b61"
AUTHOR = "Lea Hoffmann|lea@example.com|2024-04-03T16:20:00+02:00"


def git(*args):
    r = subprocess.run(["git", "-c", "safe.directory=*", *args], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def run_tests_at(rev):
    with tempfile.TemporaryDirectory() as d:
        archive = os.path.join(d, "src.tar")
        subprocess.run(["git", "-c", "safe.directory=*", "archive", "-o", archive, rev], cwd=REPO, check=True)
        with tarfile.open(archive) as t:
            t.extractall(os.path.join(d, "src"))
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
            cwd=os.path.join(d, "src"),
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )


def test_parent_unchanged():
    assert git("rev-parse", "main~2").strip() == PARENT
    assert git("rev-list", "--count", "main").strip() == "4"


def test_messages():
    assert git("log", "-1", "--format=%B", "main~1").strip() == "Fix hyphenated word counting"
    assert git("log", "-1", "--format=%B", "main").strip() == "Add command-line interface"


def test_authorship_preserved():
    for rev in ("main~1", "main"):
        assert git("log", "-1", "--format=%an|%ae|%aI", rev).strip() == AUTHOR, rev


def test_final_tree_identical():
    assert git("rev-parse", "main^{tree}").strip() == ORIGINAL_TREE


def test_fix_commit_touches_only_fix_files():
    files = sorted(git("diff", "--name-only", "main~2", "main~1").split())
    assert files == ["CHANGELOG.md", "tests/test_core.py", "textstats/core.py"]
    core = git("show", "main~1:textstats/core.py")
    assert "def top_words" not in core
    assert "(?:-[A-Za-z']+)*" in core


def test_fix_commit_exact_tree():
    assert git("rev-parse", "main~1^{tree}").strip() == FIX_TREE


def test_fix_commit_tests_pass_alone():
    r = run_tests_at("main~1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3 passed" in r.stdout, r.stdout


def test_final_tests_pass_and_clean():
    r = run_tests_at("main")
    assert r.returncode == 0 and "4 passed" in r.stdout, r.stdout + r.stderr
    assert git("symbolic-ref", "HEAD").strip() == "refs/heads/main"
    assert git("status", "--porcelain").strip() == ""
