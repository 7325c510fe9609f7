"""Verifier for git-purge-leaked-secret."""

import contextlib
import os
import subprocess
import zlib

REPO = "/app/payments-service"
SECRETS = [b"sk_live_51Hx9TQ2eZvKYlo2CzQwR8f3", b"hunter2-prod-7731"]
# (subject, author, author date, expected tree after the purge), oldest first
MAIN = [
    ("Initial skeleton", "Priya Natarajan", "2024-02-02T09:30:00+01:00", "a9a26b518807282228c1353f7c293e2bbb15d4fb"),
    ("Add payment client", "Tom Becker", "2024-02-04T09:30:00+01:00", "52ee39afaeac5f5fa2ee3e92a9c2de8c560cf9f5"),
    ("Add settings", "Priya Natarajan", "2024-02-06T09:30:00+01:00", "56669869b280779bc34b18541140d086fbbb1be1"),
    ("Add deploy script", "Tom Becker", "2024-02-08T09:30:00+01:00", "19ce956676b4478c0879bbc50b70bcf86769812c"),
    ("Release 1.0.0", "Priya Natarajan", "2024-02-10T09:30:00+01:00", "b6665ec35622c03e21f0dd470b1bbcd43ba152c8"),
    ("Add refunds", "Priya Natarajan", "2024-02-14T09:30:00+01:00", "64cdcbeed086f06b09077585e39cce6857fe63e8"),
    (
        "Read Stripe key from the environment",
        "Priya Natarajan",
        "2024-02-16T09:30:00+01:00",
        "ad0eef2b16b58a615eb44ad05b92824b5ce7efb7",
    ),
    ("Document STRIPE_KEY", "Priya Natarajan", "2024-02-18T09:30:00+01:00", "39acfc353c78e6aacff340f2502a091ad1490532"),
]
RELEASE = MAIN[:5] + [
    (
        "Hotfix: raise timeout to 30s",
        "Tom Becker",
        "2024-02-12T09:30:00+01:00",
        "37296e4886b094fae22031148ab926aa9526eb28",
    ),
]


def git(*args, text=True):
    r = subprocess.run(["git", "-c", "safe.directory=*", *args], cwd=REPO, capture_output=True, text=text)
    assert r.returncode == 0, r.stderr
    return r.stdout


def history(ref):
    out = git("log", "--reverse", "--format=%s%x1f%an%x1f%aI%x1f%T", ref)
    return [tuple(line.split("\x1f")) for line in out.splitlines()]


def test_refs():
    refs = git("for-each-ref", "--format=%(refname)").split()
    assert sorted(refs) == ["refs/heads/main", "refs/heads/release/1.x", "refs/tags/v1.0.0"]
    assert git("symbolic-ref", "HEAD").strip() == "refs/heads/main"


def test_main_history_rewritten():
    assert history("main") == MAIN


def test_release_history_rewritten():
    assert history("release/1.x") == RELEASE
    base = git("merge-base", "main", "release/1.x").strip()
    assert git("log", "-1", "--format=%s", base).strip() == "Release 1.0.0"


def test_annotated_tag():
    assert git("cat-file", "-t", "refs/tags/v1.0.0").strip() == "tag"
    body = git("cat-file", "-p", "refs/tags/v1.0.0")
    assert body.rstrip("\n").endswith("\n\nVersion 1.0.0")
    assert git("rev-parse", "v1.0.0^{commit}").strip() == git("rev-parse", "main~3").strip()


def test_no_secret_in_any_object():
    objs = git("cat-file", "--batch-all-objects", "--batch-check=%(objectname)").split()
    assert objs, "object database is empty"
    data = subprocess.run(
        ["git", "-c", "safe.directory=*", "cat-file", "--batch"],
        cwd=REPO,
        input="\n".join(objs).encode() + b"\n",
        capture_output=True,
        check=True,
    ).stdout
    for s in SECRETS:
        assert s not in data, f"an object still contains {s!r}"


def test_no_unreachable_old_history():
    r = subprocess.run(
        ["git", "-c", "safe.directory=*", "fsck", "--unreachable", "--no-reflogs", "--no-progress"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    bad = [l for l in r.stdout.splitlines() if l.startswith("unreachable commit")]
    assert bad == [], bad
    assert git("reflog", "show", "--all").strip() == "" or all(
        s.decode() not in git("log", "-g", "--all", "-p") for s in SECRETS
    )


def test_no_secret_in_any_file_on_disk():
    for dirpath, _, files in os.walk(REPO):
        for name in files:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                data = f.read()
            if "/.git/objects/" in path and "/pack/" not in path and "/info/" not in path:
                with contextlib.suppress(zlib.error):
                    data = zlib.decompress(data)
            for s in SECRETS:
                assert s not in data, f"{path} contains {s!r}"


def test_worktree_clean_on_main():
    assert git("status", "--porcelain").strip() == ""
    assert not os.path.exists(os.path.join(REPO, "deploy/.env"))
    with open(os.path.join(REPO, "config/settings.py")) as f:
        assert 'STRIPE_KEY = os.environ["STRIPE_KEY"]' in f.read()
