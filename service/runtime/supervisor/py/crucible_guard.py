"""Import precedence in the verifier's sandbox: the pristine toolchain wins every name.

Loaded at interpreter start-up by ``crucible-verifier.pth``, which Crucible puts into every
site directory of the task image's toolchain in the verifier's sandbox only (never in an
episode's). It runs in every Python process there and must not depend on anything but the
standard library (Python 3.8 or newer).

The rule, by construction rather than by a list of names: a top-level module is resolved
over ``sys.path`` entry by entry, and the first location that holds a *pristine* module of
that name wins over any earlier location holding an *agent-written* one. A location is
agent-written when its change time is at or after ``CRUCIBLE_PRISTINE_BEFORE`` (ns since the
epoch): everything of the episode's end state arrived in the verifier's sandbox by one
archive extraction after that moment, and no process can set a file's change time, while
the image's own files are older. ``/tests`` (the task's tests, placed by Crucible) and
Crucible's own read-only mount count as pristine. So ``pytest.py``, ``_pytest/``,
``json.py``, ``sitecustomize.py``, sourceless ``.pyc`` and extension modules in the
workdir, in any letter case or suffix Python's own finder accepts, never displace the
toolchain; a module only the agent provides (``solution``, the package under test) still
imports. Names that are not top-level (``pkg.sub``) follow their package's ``__path__``.
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import PathFinder

_TRUSTED_PREFIXES = ("/tests/", "/opt/crucible/")


def _threshold() -> int:
    try:
        return int(os.environ.get("CRUCIBLE_PRISTINE_BEFORE", ""))
    except ValueError:
        return 0


def _location(spec) -> str | None:  # noqa: ANN001 (ModuleSpec; kept 3.8-compatible)
    if spec.origin and spec.origin not in ("built-in", "frozen", "namespace"):
        return spec.origin
    locations = list(spec.submodule_search_locations or ())
    return locations[0] if locations else None


def is_agent_written(path: str, threshold: int) -> bool:
    """True when ``path`` (a module file or package directory) arrived with the end state."""
    if threshold <= 0 or path.startswith(_TRUSTED_PREFIXES):
        return False
    try:
        return os.stat(path).st_ctime_ns >= threshold
    except OSError:
        return False


class PristineFirstFinder:
    """A ``sys.meta_path`` finder placed first: pristine modules win over agent-written ones.

    Returns ``None`` (defer to the normal finders) for submodules, for names no ``sys.path``
    entry holds and when the first candidate is already pristine.
    """

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001, ANN201
        if path is not None or "." in name:
            return None
        first_agent = None
        for entry in list(sys.path):
            try:
                spec = PathFinder.find_spec(name, [entry])
            except (ImportError, OSError, ValueError):
                continue
            if spec is None:
                continue
            location = _location(spec)
            if location is None or not is_agent_written(location, self.threshold):
                return spec if first_agent is not None else None
            if first_agent is None:
                first_agent = spec
        return None

    def invalidate_caches(self) -> None:
        """Nothing cached here (``PathFinder`` keeps its own caches)."""


def install() -> None:
    """Put the finder first on ``sys.meta_path`` once per process (no-op without a
    threshold, i.e. outside a Crucible verification)."""
    threshold = _threshold()
    if threshold <= 0:
        return
    if any(isinstance(f, PristineFirstFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, PristineFirstFinder(threshold))


install()
