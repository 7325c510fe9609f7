"""Building the verifier's sandbox: a fresh container holding the episode's end state on a
toolchain the agent could not have modified.

1. The episode's container is frozen (every process suspended) and never executed in again.
   The verifier runs in a DIFFERENT container: a pristine sandbox of the image the episode
   started from (taken from the warm pool when it holds one), so none of the agent's
   processes exist there.
2. The filesystem diff of the episode's container against its image (read engine-side)
   lists every path the agent changed. Changes outside the protected paths are replayed
   onto the pristine sandbox: deletions (and entries whose type changed between directory
   and file) are removed first by the pristine ``rm``; added and modified entries arrive in
   one archive, read from the frozen container with owners, modes and links kept. Changes
   under a protected path (the toolchain: ``/usr``, ``/bin``, ``/lib*``, the dynamic
   loader's configuration, Python's site configuration, shell start-up files, pytest root
   config, ``/tests``, ``/logs``) are not replayed: the verifier's toolchain is always the
   pristine one, and the tampering is reported.
3. Tests arrive in the same archive, only now, with Crucible's ``crucible-verifier.pth`` in
   every site directory of the image's toolchain (``toolchain``), and run with
   ``bash --noprofile --norc``, no user site-packages, pytest plugin autoload off and
   Crucible's observer plugin on. The ``.pth`` installs ``crucible_guard``: a pristine module
   wins every name over an agent-written one (``pytest.py`` or ``json.py`` in the workdir
   never displaces the toolchain, whatever its case or suffix), by the files' change times,
   not by a list of names.
4. Limits: an end state with more than ``MAX_CHANGED_ENTRIES`` changed entries, or a path
   longer than ``MAX_PATH_BYTES``, is not replayed (the verifier scores 0 with the reason).
"""

from __future__ import annotations

import io
import re
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from service.runtime.base import FsChange

# Paths whose modification by the agent makes the snapshot untrusted as a toolchain.
PROTECTED_PREFIXES = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc/ld.so.preload",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/ld.so.cache",
    "/etc/profile",
    "/etc/profile.d",
    "/etc/bash.bashrc",
    "/etc/environment",
    "/etc/alternatives",
    # configuration that makes the pristine toolchain load native code: libc's name
    # services (libnss_<service>.so.2, and a service name may be a path), OpenSSL's
    # providers and engines, PAM and PKCS#11 modules, sudo's plugins (a trial loaded its
    # own library into the test command's bash through nsswitch.conf, and into the judge
    # through openssl.cnf). The data they read (passwd, group, certificates) stays the
    # agent's to change.
    "/etc/nsswitch.conf",
    "/etc/ssl/openssl.cnf",
    "/etc/ssl/openssl.cnf.d",
    "/etc/pam.conf",
    "/etc/pam.d",
    "/etc/security",
    "/etc/pkcs11",
    "/etc/sudo.conf",
    "/tests",
    "/logs",
    "/conftest.py",
    "/pytest.ini",
    "/.pytest.ini",
    "/pyproject.toml",
    "/tox.ini",
    "/setup.cfg",
)
PROTECTED_PATTERNS = (re.compile(r"^/etc/python3(\.\d+)?(/|$)"),)
# Entries the engine itself creates in every container (mount points of init and volumes).
ENGINE_ENTRIES = frozenset(
    {
        "/usr/sbin/docker-init",
        "/opt/crucible",
        "/opt/crucible-ctl",
        "/etc/hostname",
        "/etc/hosts",
        "/etc/resolv.conf",
        "/etc/mtab",
        "/dev",
        "/proc",
        "/sys",
    }
)

HIDDEN_UID = 65533  # owns the tests and the key file; no process runs as it
MAX_CHANGED_ENTRIES = 50_000
MAX_PATH_BYTES = 3072  # the host reads layers under a prefix of ~100 bytes; PATH_MAX is 4096

# Inherited by everything the test script starts (nested pytest runs of the agent's
# project included), so only settings that cannot change a legitimate run belong here;
# the observer plugin restores autoload for nested runs (``CRUCIBLE_RESTORE_AUTOLOAD``).
VERIFIER_ENV = {
    "PYTHONNOUSERSITE": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "TEST_DIR": "/tests",
}
PTH_NAME = "crucible-verifier.pth"
PTH_SOURCE = Path(__file__).resolve().parents[1] / "runtime" / "supervisor" / "py" / PTH_NAME


def is_protected(path: str, extra: Iterable[str] = ()) -> bool:
    """True when ``path`` lies in the verifier's trusted toolchain: a fixed prefix, a
    pattern, or one of ``extra`` (what ``toolchain.scan`` found in the image)."""
    for p in (*PROTECTED_PREFIXES, *extra):
        if path == p or path.startswith(p.rstrip("/") + "/"):
            return True
    return any(p.match(path) for p in PROTECTED_PATTERNS)


@dataclass(frozen=True)
class ChangePlan:
    """What the agent changed, reduced to the entries to carry over.

    ``copy``: added or modified leaves (a directory added whole is one entry);
    ``delete``: paths to remove before the copy (deleted ones, and ones whose type changed
    between directory and non-directory); ``tampered``: protected paths the agent touched;
    ``too_big``: why the end state is not replayed at all (a limit it exceeds), else None.
    """

    copy: tuple[str, ...]
    delete: tuple[str, ...]
    tampered: tuple[str, ...]
    too_big: str | None = None


def plan_changes(changes: Iterable[FsChange], *, protected: Iterable[str] = ()) -> ChangePlan:
    """Reduce an engine diff to leaves (directories whose children are listed are skipped);
    ``protected`` adds prefixes to the fixed ones (the image's toolchain)."""
    changes = list(changes)
    protected = tuple(protected)
    rows = [c for c in changes if not _engine_made(c.path)]
    if len(rows) > MAX_CHANGED_ENTRIES:
        return ChangePlan((), (), (), f"{len(rows)} changed entries (limit {MAX_CHANGED_ENTRIES})")
    longest = max((len(c.path.encode("utf-8", "surrogateescape")) for c in rows), default=0)
    if longest > MAX_PATH_BYTES:
        return ChangePlan((), (), (), f"a path longer than {MAX_PATH_BYTES} bytes")
    # Parents are computed over every entry, engine-made ones included, so a directory
    # changed only by the engine (``/opt`` holding the ``/opt/crucible`` mount point) is
    # not mistaken for a leaf.
    has_child = {posix_parent(c.path) for c in changes}
    added_roots: list[str] = []
    copy, delete, tampered = [], [], []
    for c in sorted(rows, key=lambda c: c.path):
        if c.kind != "deleted" and any(c.path.startswith(r + "/") for r in added_roots):
            continue  # inside a directory that is copied whole
        if is_protected(c.path, protected):
            if c.kind != "modified" or c.path not in has_child:
                tampered.append(c.path)
            continue
        leaf = c.replaced or c.kind != "modified" or c.path not in has_child
        if leaf and _shields(c.path, protected):
            # an ancestor of a protected path added, deleted or replaced (``/etc/ssl`` made a
            # symlink to the agent's directory): carrying it over would carry the protected
            # path with it
            tampered.append(c.path)
            continue
        if c.replaced:
            delete.append(c.path)  # the pristine entry is of the other type: remove it first
        if c.kind == "modified" and c.path in has_child:
            continue  # a directory whose changed children are listed
        if c.kind == "deleted":
            delete.append(c.path)
        else:
            copy.append(c.path)
            if c.kind == "added":
                added_roots.append(c.path)
    return ChangePlan(tuple(copy), tuple(delete), tuple(tampered))


def _shields(path: str, extra: Iterable[str] = ()) -> bool:
    """True when ``path`` is an ancestor of a protected prefix."""
    prefix = path.rstrip("/") + "/"
    return any(p.startswith(prefix) for p in (*PROTECTED_PREFIXES, *extra))


def _engine_made(path: str) -> bool:
    return path in ENGINE_ENTRIES or any(
        path.startswith(e + "/")
        for e in ("/proc", "/sys", "/dev", "/opt/crucible", "/opt/crucible-ctl")
    )


def posix_parent(path: str) -> str:
    """``/a/b`` -> ``/a``; ``/a`` -> ``/``."""
    head = path.rsplit("/", 1)[0]
    return head or "/"


def add_tests(
    t: tarfile.TarFile,
    tests_dir: Path | None,
    extra_files: Iterable[Path] = (),
    site_dirs: Iterable[str] = (),
    private_files: Iterable[tuple[str, bytes]] = (),
) -> None:
    """Add to ``t`` (extracted at ``/``): ``tests/`` (the task's tests plus ``extra_files``),
    an empty ``logs/verifier/``, Crucible's ``.pth`` in each of ``site_dirs`` and
    ``private_files`` (absolute path, bytes; mode 0400). Extracting them is the whole test
    set-up.

    The tests and the private files belong to ``HIDDEN_UID``, a user no process runs as,
    with no access for anyone else (directories 0700, files 0600 or 0700): the test
    command and the judging pytest process read them as root through ``DAC_OVERRIDE``, but
    the processes the judge starts run without it (and without ``FOWNER``, ``CHOWN``,
    ``SETUID``, ``SETGID``: ``crucible_observer``), so the agent's programs that the tests
    run can neither read the hidden tests nor take the session keys. ``/logs`` and
    ``/logs/verifier`` belong to it too (0755), so those children cannot rename or replace
    the report directory either (a trial made it a symlink loop)."""

    def hidden(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = HIDDEN_UID
        info.uname = info.gname = ""
        info.mode = 0o700 if info.isdir() or info.mode & 0o100 else 0o600
        return info

    for name, mode in (("tests", 0o700), ("logs", 0o755), ("logs/verifier", 0o755)):
        d = tarfile.TarInfo(name)
        d.type, d.mode = tarfile.DIRTYPE, mode
        d = hidden(d)
        d.mode = mode  # /logs stays listable; only its owner (nobody) may change it
        t.addfile(d)
    if tests_dir is not None:
        for child in sorted(tests_dir.iterdir()):
            t.add(str(child), arcname=f"tests/{child.name}", filter=hidden)
    for f in extra_files:
        t.add(str(f), arcname=f"tests/{f.name}", filter=hidden)
    pth = PTH_SOURCE.read_bytes()
    for site in site_dirs:
        info = tarfile.TarInfo(f"{site.strip('/')}/{PTH_NAME}")
        info.size, info.mode = len(pth), 0o644
        t.addfile(info, io.BytesIO(pth))
    for path, data in private_files:
        info = tarfile.TarInfo(path.strip("/"))
        info.size, info.mode = len(data), 0o400
        info.uid = info.gid = HIDDEN_UID
        t.addfile(info, io.BytesIO(data))
