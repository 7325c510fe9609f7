"""Verifier for git-resolve-merge-conflict."""

import os
import subprocess
import sys

REPO = "/app/shopcalc"
OLD_MAIN = "f983ec2d7b4314d11256102ca5a8f11324c2c8f5"
FEATURE = "bac58777348e816f5bffcc034fc3b9e17ec0e425"
BLOBS = {
    "shopcalc/coupons.py": "f83573aae63b2fde932c140530829ae0cebab2f8",
    "tests/test_discounts.py": "da7c3ca7703ddd2d48294c74e126a0fea1f7434d",
    "tests/test_pricing.py": "bb9f5245a95ed1b6b28a9ed545997b689307f17d",
}
CHANGELOG = """# Changelog

## Unreleased
- Support regional VAT rates (`region`).
- Add percentage discounts (`discount_pct`) and coupon codes.

## 1.0.0
- First release.
"""


def git(*args):
    r = subprocess.run(["git", "-c", "safe.directory=*", *args], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _committed_pricing():
    """Import pricing.py exactly as committed on main (not the working tree)."""
    src = git("show", "main:shopcalc/pricing.py")
    ns = {}
    exec(compile(src, "pricing.py", "exec"), ns)
    return ns


def test_merge_commit_parents():
    parents = git("rev-list", "--parents", "-n", "1", "main").split()[1:]
    assert parents == [OLD_MAIN, FEATURE]


def test_feature_branch_untouched():
    assert git("rev-parse", "refs/heads/feature/discounts").strip() == FEATURE


def test_merge_finished_and_clean():
    assert not os.path.exists(os.path.join(REPO, ".git", "MERGE_HEAD"))
    assert git("symbolic-ref", "HEAD").strip() == "refs/heads/main"
    assert git("status", "--porcelain").strip() == ""
    assert git("diff", "--name-only", "--diff-filter=U").strip() == ""


def test_no_conflict_markers():
    for path in git("ls-files").split():
        text = git("show", f"main:{path}")
        for marker in ("<<<<<<<", ">>>>>>>", "\n=======\n"):
            assert marker not in text, f"{path} contains {marker!r}"


def test_files_from_both_branches():
    for path, blob in BLOBS.items():
        assert git("rev-parse", f"main:{path}").strip() == blob, path


def test_changelog():
    assert git("show", "main:CHANGELOG.md") == CHANGELOG


def test_combined_pricing_behaviour():
    ns = _committed_pricing()
    g = ns["gross_cents"]
    assert ns["VAT_RATES"] == {"UK": 20, "DE": 19, "FR": 20, "IE": 23}
    assert g(1000) == 1200
    assert g(1000, "DE") == 1190
    assert g(999, region="IE") == 1229
    assert g(1000, discount_pct=10) == 1080
    assert g(1000, region="DE", discount_pct=10) == 1071
    assert g(999, "IE", 15) == 1044
    assert g(1234, region="FR", discount_pct=33) == 992
    assert g(1, region="UK", discount_pct=50) == 1
    assert g(999, region="DE", discount_pct=100) == 0
    for n in range(0, 3000, 37):
        for region, rate in ns["VAT_RATES"].items():
            for d in (0, 5, 12, 50, 99):
                assert g(n, region=region, discount_pct=d) == (n * (100 - d) * (100 + rate) + 5000) // 10000


def test_validation():
    g = _committed_pricing()["gross_cents"]
    for kwargs in (
        {"region": "XX"},
        {"discount_pct": -1},
        {"discount_pct": 101},
        {"region": "DE", "discount_pct": 150},
    ):
        try:
            g(1000, **kwargs)
        except ValueError:
            continue
        raise AssertionError(f"no ValueError for {kwargs}")


def test_project_tests_pass():
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "6 passed" in r.stdout, r.stdout
