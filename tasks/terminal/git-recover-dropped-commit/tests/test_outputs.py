"""Verifier for git-recover-dropped-commit."""

import os
import subprocess

REPO = "/app/ledger"
README_COMMIT = "55cb13904cee02d66ad333ec37cff2eb69e29b49"
EXPERIMENT = "7d5cf31d2caf5c43030e18dcd5df97577b782e55"
VAT_BLOB = "662965104f31078f3c04968ab0b29d3c572cbc8a"
TEST_VAT_BLOB = "3f3a5d22bc84595656c4f0ea9a27930ef5802490"
README_BLOB = "27b76fed48abbe0ebd0a43f592f414a13f4c2690"


def git(*args, check=True):
    r = subprocess.run(["git", "-c", "safe.directory=*", *args], cwd=REPO, capture_output=True, text=True)
    if check:
        assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_on_main_and_clean():
    assert git("symbolic-ref", "HEAD") == "refs/heads/main"
    status = [
        l for l in git("status", "--porcelain").splitlines() if "__pycache__" not in l and ".pytest_cache" not in l
    ]
    assert status == []


def test_readme_commit_kept():
    r = subprocess.run(
        ["git", "-c", "safe.directory=*", "merge-base", "--is-ancestor", README_COMMIT, "main"], cwd=REPO
    )
    assert r.returncode == 0


def test_recovered_commits_on_top_in_order():
    subjects = git("log", "--format=%s", f"{README_COMMIT}..main").splitlines()
    assert subjects[::-1] == ["Add VAT rounding rules", "Add tests for VAT rounding"]


def test_recovered_authorship():
    lines = git("log", "--reverse", "--format=%an|%ae|%aI|%s", f"{README_COMMIT}..main").splitlines()
    assert lines == [
        "Rosa Diaz|rosa@example.com|2024-03-04T10:00:00+00:00|Add VAT rounding rules",
        "Rosa Diaz|rosa@example.com|2024-03-05T10:00:00+00:00|Add tests for VAT rounding",
    ]


def test_file_contents_match_lost_work():
    assert git("rev-parse", "main:ledger/vat.py") == VAT_BLOB
    assert git("rev-parse", "main:tests/test_vat.py") == TEST_VAT_BLOB
    assert git("rev-parse", "main:README.md") == README_BLOB


def test_first_commit_touches_only_vat_module():
    rules = git("log", "--format=%H", "--reverse", f"{README_COMMIT}..main").splitlines()[0]
    assert git("show", "--format=", "--name-only", rules).splitlines() == ["ledger/vat.py"]


def test_experiment_branch_untouched():
    assert git("rev-parse", "refs/heads/experiment") == EXPERIMENT


def test_project_tests_pass():
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run(
        ["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "4 passed" in r.stdout, r.stdout
