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
3. Tests arrive in the same archive, only now, and run with ``bash --noprofile --norc`` and
   an environment without user site-packages. Modules the agent put directly in the workdir
   under a name the test runner imports (``pytest.py``, ``json.py``: ``python3 -m pytest``
   puts the current directory first on ``sys.path``) are a hijack and score 0.
"""

from __future__ import annotations

import re
import sys
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

# Inherited by everything the test script starts (nested pytest runs of the agent's
# project included), so only settings that cannot change a legitimate run belong here.
VERIFIER_ENV = {
    "PYTHONNOUSERSITE": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "TEST_DIR": "/tests",
}

# Top-level module names that ``python3 -m pytest`` run in the workdir would import from
# the workdir (``sys.path[0]`` is the current directory) instead of the toolchain.
SHADOWABLE = frozenset(sys.stdlib_module_names) | {
    "pytest",
    "_pytest",
    "pluggy",
    "iniconfig",
    "packaging",
    "py",
    "tomli",
    "exceptiongroup",
    "attr",  # attrs: pytest < 7.3 imports it at start-up (found by a new-user trial)
    "attrs",
    "pygments",  # imported for coloured output
    "argcomplete",
    "colorama",
    "sitecustomize",
    "usercustomize",
    "conftest",
}


def is_protected(path: str) -> bool:
    """True when ``path`` lies in the verifier's trusted toolchain (see module docstring)."""
    if any(path == p or path.startswith(p + "/") for p in PROTECTED_PREFIXES):
        return True
    return any(p.match(path) for p in PROTECTED_PATTERNS)


@dataclass(frozen=True)
class ChangePlan:
    """What the agent changed, reduced to the entries to carry over.

    ``copy``: added or modified leaves (a directory added whole is one entry);
    ``delete``: paths to remove before the copy (deleted ones, and ones whose type changed
    between directory and non-directory); ``tampered``: protected paths the agent touched;
    ``shadowing``: modules the agent put in the workdir under a name the test runner
    itself imports (``pytest.py``, ``json.py``...), which would hijack it.
    """

    copy: tuple[str, ...]
    delete: tuple[str, ...]
    tampered: tuple[str, ...]
    shadowing: tuple[str, ...] = ()


_MODULE_SUFFIXES = (".py", ".pyc", ".so", ".pyd")
# importlib.metadata finds distributions by these on every sys.path entry; a ``.pth`` or
# ``.egg-link`` only acts in a site directory, never in the workdir.
_METADATA_SUFFIXES = (".dist-info", ".egg-info")


def shadowing_modules(paths: Iterable[str], workdir: str) -> tuple[str, ...]:
    """What the agent put directly in ``workdir`` (``sys.path[0]`` of ``python3 -m pytest``)
    that the test runner would pick up instead of its toolchain:

    - a module named like one the runner imports (``SHADOWABLE``): ``name.py``, a sourceless
      ``name.pyc``, an extension ``name*.so``, or a regular package ``name/__init__.py(c)``;
    - distribution metadata (``*.dist-info``, ``*.egg-info``): pytest loads plugins from the
      entry points of every distribution on ``sys.path``, so any of it can inject a plugin.

    A plain directory is at most a namespace package, which never wins over a real module.
    """
    paths = set(paths)
    root = workdir.rstrip("/")
    out = []
    for path in paths:
        parent, _, name = path.rpartition("/")
        if parent != root or not name:
            continue
        if name.endswith(_METADATA_SUFFIXES):
            out.append(path)
            continue
        if name.endswith(_MODULE_SUFFIXES):
            stem = name.split(".", 1)[0]
        elif f"{path}/__init__.py" in paths or f"{path}/__init__.pyc" in paths:
            stem = name
        else:
            continue
        if stem in SHADOWABLE:
            out.append(path)
    return tuple(sorted(out))


def plan_changes(changes: Iterable[FsChange], workdir: str | None = None) -> ChangePlan:
    """Reduce an engine diff to leaves (directories whose children are listed are skipped);
    with ``workdir``, also name the modules that would shadow the test runner's."""
    changes = list(changes)
    # Parents are computed over every entry, engine-made ones included, so a directory
    # changed only by the engine (``/opt`` holding the ``/opt/crucible`` mount point) is
    # not mistaken for a leaf.
    has_child = {posix_parent(c.path) for c in changes}
    rows = [c for c in changes if not _engine_made(c.path)]
    added_roots: list[str] = []
    copy, delete, tampered = [], [], []
    for c in sorted(rows, key=lambda c: c.path):
        if c.kind != "deleted" and any(c.path.startswith(r + "/") for r in added_roots):
            continue  # inside a directory that is copied whole
        if is_protected(c.path):
            if c.kind != "modified" or c.path not in has_child:
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
    added = [c.path for c in rows if c.kind != "deleted"]
    shadow = shadowing_modules(added, workdir) if workdir else ()
    return ChangePlan(tuple(copy), tuple(delete), tuple(tampered), shadow)


def _engine_made(path: str) -> bool:
    return path in ENGINE_ENTRIES or any(
        path.startswith(e + "/")
        for e in ("/proc", "/sys", "/dev", "/opt/crucible", "/opt/crucible-ctl")
    )


def posix_parent(path: str) -> str:
    """``/a/b`` -> ``/a``; ``/a`` -> ``/``."""
    head = path.rsplit("/", 1)[0]
    return head or "/"


def add_tests(t: tarfile.TarFile, tests_dir: Path | None, extra_files: Iterable[Path] = ()) -> None:
    """Add to ``t`` (extracted at ``/``): ``tests/`` (the task's tests plus ``extra_files``)
    and an empty ``logs/verifier/``, all root-owned. Extracting them is the whole test
    set-up."""

    def owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    for name in ("tests", "logs", "logs/verifier"):
        d = tarfile.TarInfo(name)
        d.type, d.mode = tarfile.DIRTYPE, 0o755
        t.addfile(d)
    if tests_dir is not None:
        for child in sorted(tests_dir.iterdir()):
            t.add(str(child), arcname=f"tests/{child.name}", filter=owned)
    for f in extra_files:
        t.add(str(f), arcname=f"tests/{f.name}", filter=owned)
