"""Fault injection for crash and chaos tests: a slow or failing engine, read from the
environment once at start-up. Off unless a ``CRUCIBLE_FAULT_*`` variable is set.

- ``CRUCIBLE_FAULT_SLOW_MS="snapshot=400,create=300"``: sleep that many milliseconds before
  each call of the named runtime methods (widens the windows a test kills the server in).
- ``CRUCIBLE_FAULT_FAIL="create=0.2"``: raise ``SandboxError`` from the named methods with
  that probability (seeded by ``CRUCIBLE_FAULT_SEED``, default 0).

``wrap(runtime)`` returns the runtime itself when nothing is configured, else a proxy that
applies the faults and forwards everything else unchanged.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Mapping
from typing import Any

from service.errors import SandboxError

SLOW_ENV = "CRUCIBLE_FAULT_SLOW_MS"
FAIL_ENV = "CRUCIBLE_FAULT_FAIL"
SEED_ENV = "CRUCIBLE_FAULT_SEED"


def _parse(value: str, env: str) -> dict[str, float]:
    """``"a=1,b=2.5"`` -> ``{"a": 1.0, "b": 2.5}`` (``ValueError`` naming ``env`` if bad)."""
    out = {}
    for part in filter(None, (p.strip() for p in value.split(","))):
        name, sep, number = part.partition("=")
        try:
            if not sep or not name.strip():
                raise ValueError(part)
            out[name.strip()] = float(number)
        except ValueError:
            raise ValueError(f"{env}: {part!r} is not NAME=NUMBER") from None
    return out


class FaultyRuntime:
    """Forwards to ``inner``; ``slow_ms`` and ``fail_p`` apply per method name."""

    def __init__(
        self, inner: Any, *, slow_ms: Mapping[str, float], fail_p: Mapping[str, float], seed: int
    ) -> None:
        self._inner, self._slow, self._fail = inner, dict(slow_ms), dict(fail_p)
        self._rng = random.Random(seed)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr) or (name not in self._slow and name not in self._fail):
            return attr

        def faulty(*args: Any, **kwargs: Any) -> Any:
            if name in self._slow:
                time.sleep(self._slow[name] / 1e3)
            if self._rng.random() < self._fail.get(name, 0.0):
                raise SandboxError(f"injected fault in {name} ({FAIL_ENV})")
            return attr(*args, **kwargs)

        return faulty


def wrap(runtime: Any, environ: Mapping[str, str] | None = None) -> Any:
    """``runtime`` with the configured faults (itself when none are configured)."""
    env = os.environ if environ is None else environ
    slow = _parse(env.get(SLOW_ENV, ""), SLOW_ENV)
    fail = _parse(env.get(FAIL_ENV, ""), FAIL_ENV)
    if not slow and not fail:
        return runtime
    return FaultyRuntime(runtime, slow_ms=slow, fail_p=fail, seed=int(env.get(SEED_ENV, "0")))
