"""The task image's toolchain, found in the image itself rather than listed in code.

A task image may carry its verifier's tools anywhere: Debian's ``/usr``, a virtualenv at
``/opt/verifier-venv`` (as Terminal-Bench 2 tasks commonly build), a ``site-packages`` under
``/usr/local`` or ``/srv``, a tool directory on ``PATH``. Whatever the agent changed there
must never reach the verifier. ``scan`` asks a pristine sandbox of the image (nothing of the
agent's has run in it) where those are:

- every virtualenv (a directory holding ``pyvenv.cfg``) and every ``site-packages`` or
  ``dist-packages`` directory;
- every directory on the image's ``PATH`` and ``LD_LIBRARY_PATH``, except the workdir, its
  ancestors and what lies inside it (the agent's own output lives there).

Those become protected prefixes (``isolation.plan_changes``) on top of the fixed ones; the
site directories also receive Crucible's ``crucible-verifier.pth``. The answer depends only
on the image, so it is cached per image for the life of the process.
"""

from __future__ import annotations

import logging
import posixpath
import threading
from dataclasses import dataclass

from service.runtime.base import ROOT, ExecRequest, SandboxRuntime

log = logging.getLogger(__name__)

_SCAN = r"""
find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /opt/crucible \
  -o -path /opt/crucible-ctl -o -path /tests -o -path /logs \) -prune -o \
  \( -name pyvenv.cfg -o -name site-packages -o -name dist-packages \) -print 2>/dev/null
printf 'PATH=%s\n' "$PATH"
printf 'LD_LIBRARY_PATH=%s\n' "$LD_LIBRARY_PATH"
"""
_MAX_SCAN_BYTES = 1 << 20


@dataclass(frozen=True)
class Toolchain:
    """Where an image keeps its tools (absolute, normalized paths).

    ``protected``: directory prefixes whose changes are never replayed; ``site_dirs``:
    Python site directories (for the verifier's ``.pth``); ``complete``: False when the scan
    could not run (only the fixed prefixes then apply).
    """

    protected: tuple[str, ...] = ()
    site_dirs: tuple[str, ...] = ()
    complete: bool = True


def parse_scan(output: str, workdir: str) -> Toolchain:
    """The toolchain from ``_SCAN``'s output (pure; unit-tested directly)."""
    work = posixpath.normpath(workdir)
    protected: set[str] = set()
    sites: set[str] = set()

    def keep(path: str) -> bool:
        if not path.startswith("/"):
            return False
        p = posixpath.normpath(path)
        # Not the workdir or an ancestor of it: the agent's output lives there.
        return not (p == "/" or p == work or work.startswith(p.rstrip("/") + "/"))

    for line in output.splitlines():
        if line.startswith(("PATH=", "LD_LIBRARY_PATH=")):
            for entry in line.split("=", 1)[1].split(":"):
                p = posixpath.normpath(entry) if entry else ""
                if keep(p) and not (p + "/").startswith(work.rstrip("/") + "/"):
                    protected.add(p)
            continue
        path = posixpath.normpath(line.strip())
        if not keep(path):
            continue
        name = posixpath.basename(path)
        if name == "pyvenv.cfg":
            venv = posixpath.dirname(path)
            if keep(venv):
                protected.add(venv)
        elif name in ("site-packages", "dist-packages"):
            protected.add(path)
            sites.add(path)
    return Toolchain(protected=tuple(sorted(protected)), site_dirs=tuple(sorted(sites)))


_cache: dict[tuple[str, str], Toolchain] = {}
_lock = threading.Lock()


def scan(runtime: SandboxRuntime, container_id: str, *, image: str, workdir: str) -> Toolchain:
    """The toolchain of ``image``, asked of ``container_id`` (a pristine sandbox of it) on
    the first call per (image, workdir), cached after. Never raises for the image's sake: a
    scan that cannot run gives ``complete=False`` (logged) and only the fixed prefixes hold.
    Engine failures (``CrucibleError``) propagate."""
    key = (image, workdir)
    with _lock:
        found = _cache.get(key)
    if found is not None:
        return found
    res = runtime.exec(
        container_id,
        ExecRequest(
            cmd=["/bin/sh", "-c", _SCAN],
            timeout_s=60,
            user=ROOT,
            max_output_bytes=_MAX_SCAN_BYTES,
        ),
    )
    out = res.stdout.decode("utf-8", "replace")
    if res.timed_out or res.stdout_truncated or "PATH=" not in out:
        log.warning("toolchain scan of %s failed (exit %s): %s", image, res.exit_code, out[-300:])
        return Toolchain(complete=False)
    found = parse_scan(out, workdir)
    with _lock:
        _cache[key] = found
    return found
