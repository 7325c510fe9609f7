"""Telling the end state's faults from the engine's when a verifier reads an agent's file.

The engine resolves symbolic links when it archives a path of a container
(``evalSymlinksInScope``), so a path the agent made into a link loop (or anything else the
engine cannot follow) fails with a server error, which reads like an engine failure. The
rule: when the engine cannot read ``path`` but can still read the same container's root,
the engine is working and the path is what the agent left there: the agent's outcome
(score 0), not Crucible's (``status=error``).
"""

from __future__ import annotations

from service.errors import CrucibleError
from service.runtime.base import SandboxRuntime


def engine_reads_container(runtime: SandboxRuntime, container_id: str) -> bool:
    """Whether the engine can read ``container_id``'s filesystem at all (its root stats).

    Call it after a read of an agent-written path failed with a ``CrucibleError``: True
    means that failure was the path's, False that the engine or the container is at fault.
    """
    try:
        return runtime.stat_path(container_id, "/") is not None
    except CrucibleError:
        return False
