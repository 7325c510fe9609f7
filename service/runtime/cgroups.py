"""Host-side view of a sandbox's processes: its pids cgroup and who in it is the agent's.

Used where nothing can start inside the sandbox any more (a fork bomb holds every pid) or
where the control plane must stop the sandbox's writers (the disk watcher). Needs the
control plane on the engine's host (as for ``service.runtime.overlay``); every function
answers None / 0 where that view is missing, and callers fall back to reporting.

Which processes are spared: the container's init (``State.Pid``) and the exec supervisor
(``/opt/crucible/crucible-exec``: its idle instance, channel handlers, ``docker exec``
instances, each with an init, a supervisor or a process outside the container as parent).
Everything else is the agent's. Sources: cgroup v1 ``pids`` controller files and cgroup v2
``cgroup.procs`` / ``pids.max`` (Documentation/admin-guide/cgroup-v1/pids.rst, cgroup-v2.rst).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

SUPERVISOR_EXE = "/opt/crucible/crucible-exec"
CGROUP_ROOT = Path("/sys/fs/cgroup")
_KILL_BUDGET_S = 3.0


@dataclass(frozen=True)
class PidsState:
    """A pids cgroup now: ``current`` processes and threads, ``limit`` (None = no limit)."""

    current: int
    limit: int | None

    @property
    def exhausted(self) -> bool:
        """True when no further fork fits (a couple of pids of slack)."""
        return self.limit is not None and self.current >= self.limit - 2


def pids_dir(init_pid: int) -> Path | None:
    """The pids cgroup directory of the process ``init_pid`` (v1 controller or v2), or None."""
    try:
        lines = Path(f"/proc/{init_pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):
            candidate = CGROUP_ROOT / "pids" / path.lstrip("/")
            if candidate.is_dir():
                return candidate
    for line in lines:
        if line.startswith("0::"):
            candidate = CGROUP_ROOT / line[3:].lstrip("/")
            if (candidate / "pids.max").exists():
                return candidate
    return None


def pids_state(init_pid: int) -> PidsState | None:
    """``pids.current`` and ``pids.max`` of ``init_pid``'s cgroup, or None when unreadable."""
    d = pids_dir(init_pid)
    if d is None:
        return None
    try:
        current = int((d / "pids.current").read_text())
        raw = (d / "pids.max").read_text().strip()
    except (OSError, ValueError):
        return None
    return PidsState(current=current, limit=None if raw == "max" else int(raw))


def pids_max_events(directory: Path) -> int | None:
    """The ``max`` counter of ``pids.events`` in a pids cgroup ``directory`` (forks refused
    at ``pids.max`` so far), or None when unreadable.

    Read with ``os.open``/``os.read`` of bytes: it runs after every exec on the event loop,
    and ``Path.read_text``'s text layer cost ~6% of the loop's CPU per exec there."""
    try:
        fd = os.open(os.path.join(directory, "pids.events"), os.O_RDONLY | os.O_CLOEXEC)
        try:
            raw = os.read(fd, 4096)
        finally:
            os.close(fd)
        for line in raw.split(b"\n"):
            key, _, value = line.partition(b" ")
            if key == b"max":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def _ppid_and_exe(pid: int) -> tuple[int, str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        return None
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        exe = ""
    return ppid, exe


def agent_pids(init_pid: int) -> list[int] | None:
    """Host pids of the sandbox's processes other than init and the supervisor's (see the
    module docstring), or None when the cgroup cannot be read."""
    d = pids_dir(init_pid)
    if d is None:
        return None
    try:
        members = {int(p) for p in (d / "cgroup.procs").read_text().split()}
    except (OSError, ValueError):
        return None
    info = {pid: _ppid_and_exe(pid) for pid in members}
    spared = {init_pid}
    changed = True
    while changed:  # supervisors whose parent is init, a supervisor, or outside the container
        changed = False
        for pid, row in info.items():
            if pid in spared or row is None or row[1] != SUPERVISOR_EXE:
                continue
            if row[0] in spared or row[0] not in members:
                spared.add(pid)
                changed = True
    return sorted(pid for pid, row in info.items() if pid not in spared and row is not None)


def kill_agent_processes(init_pid: int, *, budget_s: float = _KILL_BUDGET_S) -> int | None:
    """SIGKILL the agent's processes (``agent_pids``) until none is left or ``budget_s``
    passes (one pass at least: ``budget_s=0`` signals each once, as in a frozen container,
    where the killed stay until the thaw); return how many were signalled, or None when the
    cgroup cannot be read."""
    killed = 0
    deadline = time.monotonic() + budget_s
    while True:
        pids = agent_pids(init_pid)
        if pids is None:
            return None if killed == 0 else killed
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        if time.monotonic() >= deadline:
            break
        time.sleep(0.01)
    return killed
