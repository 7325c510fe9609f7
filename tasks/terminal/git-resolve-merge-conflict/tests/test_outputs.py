"""Verifier for git-resolve-merge-conflict."""

import json
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


# Runs the committed pricing.py in a child process and prints plain JSON: the test process
# that reports never executes the agent's code (it would have the reporter's rights).
PRICING_DRIVER = r"""
import json, sys
req = json.load(sys.stdin)
ns = {}
exec(compile(req["src"], "pricing.py", "exec"), ns)
def plain(v):
    return v if type(v) in (int, str, bool, type(None)) else {"type": type(v).__name__}
rates = ns.get("VAT_RATES")
out = {"VAT_RATES": {str(k): plain(v) for k, v in rates.items()} if type(rates) is dict else None}
calls = []
for args, kwargs in req["calls"]:
    try:
        calls.append(plain(ns["gross_cents"](*args, **kwargs)))
    except ValueError:
        calls.append({"raises": "ValueError"})
    except Exception as e:
        calls.append({"raises": type(e).__name__})
out["calls"] = calls
print(json.dumps(out))
"""
RATES = {"UK": 20, "DE": 19, "FR": 20, "IE": 23}


def committed_pricing(calls):
    """What pricing.py as committed on main (not the working tree) gives for ``calls``
    (``[args, kwargs]`` of ``gross_cents``), and its ``VAT_RATES``, from a child process."""
    src = git("show", "main:shopcalc/pricing.py")
    r = subprocess.run(
        [sys.executable, "-c", PRICING_DRIVER],
        input=json.dumps({"src": src, "calls": calls}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert isinstance(out, dict) and len(out.get("calls") or []) == len(calls), out
    return out


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
    cases = [
        (((1000,), {}), 1200),
        (((1000, "DE"), {}), 1190),
        (((999,), {"region": "IE"}), 1229),
        (((1000,), {"discount_pct": 10}), 1080),
        (((1000,), {"region": "DE", "discount_pct": 10}), 1071),
        (((999, "IE", 15), {}), 1044),
        (((1234,), {"region": "FR", "discount_pct": 33}), 992),
        (((1,), {"region": "UK", "discount_pct": 50}), 1),
        (((999,), {"region": "DE", "discount_pct": 100}), 0),
    ]
    for n in range(0, 3000, 37):
        for region, rate in RATES.items():
            for d in (0, 5, 12, 50, 99):
                want = (n * (100 - d) * (100 + rate) + 5000) // 10000
                cases.append((((n,), {"region": region, "discount_pct": d}), want))
    out = committed_pricing([[list(a), k] for (a, k), _ in cases])
    assert out["VAT_RATES"] == RATES
    for ((args, kwargs), want), got in zip(cases, out["calls"]):
        assert got == want, (args, kwargs, got)


def test_validation():
    bad = (
        {"region": "XX"},
        {"discount_pct": -1},
        {"discount_pct": 101},
        {"region": "DE", "discount_pct": 150},
    )
    out = committed_pricing([[[1000], kwargs] for kwargs in bad])
    for kwargs, got in zip(bad, out["calls"]):
        assert got == {"raises": "ValueError"}, f"no ValueError for {kwargs}"


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
