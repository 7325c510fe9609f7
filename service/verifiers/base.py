"""The verifier result type shared by every domain.

Status semantics (DESIGN.md section 7): ``ok`` means the verifier ran and ``reward`` is
the score (0 included); ``error`` and ``timeout`` mean the verifier itself failed: the
reward is ``None`` and the record is excluded from loss and retried, never scored 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

VerifierStatus = Literal["ok", "error", "timeout"]


@dataclass(frozen=True, kw_only=True)
class VerifierResult:
    """One verification.

    ``reward`` is on the verifier's own scale (terminal: 0..1); ``components`` holds the
    named parts it was composed from (e.g. ``tests_passed``); ``details`` is free-form and
    JSON-serializable (test counts, reasons, what was restored).
    """

    name: str
    version: str
    status: VerifierStatus
    reward: float | None
    components: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    duration_ms: float = 0.0

    def __post_init__(self) -> None:
        if self.status == "ok" and self.reward is None:
            raise ValueError("an ok verification needs a reward")
        if self.status != "ok" and self.reward is not None:
            raise ValueError("a failed verification has no reward (never a silent 0)")
