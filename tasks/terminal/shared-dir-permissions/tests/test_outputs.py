"""Verifier for shared-dir-permissions."""

import grp
import os
import pathlib
import pwd
import stat
import subprocess

S = pathlib.Path("/srv/projects")
SHARED_DIRS = ["", "q1", "q1/raw", "q2", "tools"]
SHARED_FILES = {  # path -> expected owner
    "q1/raw/sales.csv": "bob",
    "q1/raw/costs.csv": "root",
    "q1/summary.md": "root",
    "q2/plan.md": "alice",
    "notes.txt": "alice",
    "tools/refresh.sh": "root",
    "tools/export.sh": "root",
    "tools/README": "root",
}
AUDIT_DIRS = ["", "2024"]
AUDIT_FILES = ["2024/jan.log", "2024/feb.log", "findings.md"]


def _st(p):
    return os.lstat(p)


def _owner(st):
    return pwd.getpwuid(st.st_uid).pw_name, grp.getgrgid(st.st_gid).gr_name


def test_file_set_unchanged():
    files = sorted(str(p.relative_to(S)) for p in S.rglob("*") if p.is_file())
    expected = sorted(["shared/" + f for f in SHARED_FILES] + ["audit/" + f for f in AUDIT_FILES] + ["dropbox/README"])
    assert files == expected


def test_projects_root():
    st = _st(S)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o755)


def test_shared_directories():
    for d in SHARED_DIRS:
        st = _st(S / "shared" / d)
        assert _owner(st) == ("root", "analysts"), d
        assert stat.S_IMODE(st.st_mode) == 0o2770, (d, oct(st.st_mode))


def test_shared_files_group_and_mode():
    for f in SHARED_FILES:
        st = _st(S / "shared" / f)
        assert grp.getgrgid(st.st_gid).gr_name == "analysts", f
        want = 0o770 if f.endswith(".sh") else 0o660
        assert stat.S_IMODE(st.st_mode) == want, (f, oct(st.st_mode))


def test_shared_file_owners():
    for f, owner in SHARED_FILES.items():
        st = _st(S / "shared" / f)
        assert pwd.getpwuid(st.st_uid).pw_name == owner, f


def test_audit_tree():
    for d in AUDIT_DIRS:
        st = _st(S / "audit" / d)
        assert _owner(st) == ("carol", "auditors") and stat.S_IMODE(st.st_mode) == 0o750, d
    for f in AUDIT_FILES:
        st = _st(S / "audit" / f)
        assert _owner(st) == ("carol", "auditors") and stat.S_IMODE(st.st_mode) == 0o640, f


def test_dropbox():
    st = _st(S / "dropbox")
    assert (st.st_uid, st.st_gid) == (0, 0)
    assert stat.S_IMODE(st.st_mode) == 0o1733
    readme = _st(S / "dropbox/README")
    assert (readme.st_uid, stat.S_IMODE(readme.st_mode)) == (0, 0o644)


def test_deploy_keys():
    key, pub = _st("/app/deploy/id_deploy"), _st("/app/deploy/id_deploy.pub")
    assert _owner(key) == ("alice", "alice") and stat.S_IMODE(key.st_mode) == 0o600
    assert _owner(pub) == ("alice", "alice") and stat.S_IMODE(pub.st_mode) == 0o644


USERS = {"alice": 1001, "bob": 1002, "carol": 1003}  # the image's (environment/setup.sh)


def _identities_are_the_images():
    """The users the tests switch to are the image's, before `runuser` looks them up by name,
    as the C library resolves them (glibc skips leading blanks and reads "00" as 0, so the
    file's text alone is not enough): one entry per name, no second uid 0, each with its uid,
    home and login shell. A trial put a uid-0 "alice" first in /etc/passwd, and
    `runuser -l alice` ran the end state's profile as root with every capability."""
    entries = pwd.getpwall()
    names = [e.pw_name for e in entries]
    assert len(names) == len(set(names)), "a user name is listed twice"
    assert [e.pw_name for e in entries if e.pw_uid == 0] == ["root"], "only root may have uid 0"
    for line in pathlib.Path("/etc/passwd").read_text().splitlines():
        assert line == line.strip() and not line.startswith("#"), "a passwd line is not plain"
    for name, uid in USERS.items():
        (entry,) = [e for e in entries if e.pw_name == name]
        assert (entry.pw_uid, entry.pw_dir, entry.pw_shell) == (uid, f"/home/{name}", "/bin/bash")
        assert pwd.getpwnam(name).pw_uid == uid, name


def test_alice_login_umask():
    _identities_are_the_images()
    r = subprocess.run(["runuser", "-l", "alice", "-c", "umask"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "0007"


def test_collaboration_works():
    _identities_are_the_images()
    probe = S / "shared/q2/.probe_by_bob"
    try:
        r = subprocess.run(
            ["runuser", "-u", "bob", "--", "sh", "-c", f"umask 007 && echo hi > {probe}"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert r.returncode == 0, r.stderr
        assert grp.getgrgid(_st(probe).st_gid).gr_name == "analysts"
        r = subprocess.run(
            ["runuser", "-u", "alice", "--", "cat", str(probe)], capture_output=True, text=True, timeout=30
        )
        assert r.returncode == 0 and r.stdout == "hi\n", r.stderr
        r = subprocess.run(
            ["runuser", "-u", "carol", "--", "cat", str(S / "shared/notes.txt")],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert r.returncode != 0, "carol must not read the analysts' files"
    finally:
        if probe.exists():
            probe.unlink()
