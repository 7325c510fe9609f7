"""What the verifier hears from its own pytest plugin, and what it makes of it.

The plugin (``service/runtime/supervisor/py/crucible_observer.py``, on the read-only
supervisor mount) writes one JSON line per event to the test command's observation pipe
(fd 3, see ``ExecRequest.observe_bytes``). Every line carries the run's ``nonce``; each
pytest session reports ``start``, one ``test`` per test (``o``: passed, failed, error,
skipped, xfailed) and ``end``. Two canaries per session, a must-pass and a must-fail named
like the task's tests and placed at random among them, carry secret tokens (``c``).

The verdict (``judge``) trusts nothing the tests' code could have bent without showing it on
a canary: a line without the nonce, a session without its end, a canary missing, repeated,
or with the wrong outcome make the run ``tampered``; no session at all means no test ran.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

OBSERVE_BYTES = 4 << 20  # what the pipe may carry: ~50k tests
MAX_TESTS = 20_000  # real tests per verification; above it the run is not judged


@dataclass(frozen=True)
class Secret:
    """One verification's secret: delivered to the plugin in ``CRUCIBLE_OBSERVE``, never
    recorded (tenants and admins see only whether it held)."""

    nonce: str
    pass_token: str
    fail_token: str
    seed: str

    @classmethod
    def new(cls) -> Secret:
        """Fresh random values (``secrets``: 128 bits each)."""
        return cls(*(secrets.token_hex(16) for _ in range(4)))

    def env_value(self) -> str:
        """The JSON the plugin reads from ``CRUCIBLE_OBSERVE``."""
        return json.dumps(
            {
                "nonce": self.nonce,
                "tokens": {"pass": self.pass_token, "fail": self.fail_token},
                "seed": self.seed,
            }
        )


@dataclass
class Observation:
    """The judged outcome of one test command.

    ``tests``: real tests (canaries excluded) by node id -> outcome, over every session;
    ``sessions``: pytest sessions seen; ``tampered``: why the report cannot be trusted
    (None when it can); ``passed``/``total``: counts over ``tests``.
    """

    tests: dict[str, str] = field(default_factory=dict)
    sessions: int = 0
    tampered: str | None = None

    @property
    def total(self) -> int:
        """Real tests observed."""
        return len(self.tests)

    @property
    def passed(self) -> int:
        """Real tests that passed (setup, call and teardown)."""
        return sum(1 for o in self.tests.values() if o == "passed")

    def counts(self) -> dict[str, int]:
        """Outcome -> number of real tests."""
        out: dict[str, int] = {}
        for o in self.tests.values():
            out[o] = out.get(o, 0) + 1
        return out

    def summary(self) -> dict[str, Any]:
        """What a record may show: counts, never test names (they are the task's)."""
        return {"sessions": self.sessions, "total": self.total, **self.counts()}


@dataclass
class _Session:
    canaries: dict[str, list[str]] = field(default_factory=lambda: {"pass": [], "fail": []})
    tests: int = 0
    ended: bool = False


def judge(raw: bytes, secret: Secret, *, truncated: bool = False) -> Observation:
    """Judge the observation pipe's bytes (pure; unit-tested directly).

    Never raises: anything malformed is a ``tampered`` verdict with the reason.
    """
    obs = Observation()
    if truncated:
        obs.tampered = f"the observation exceeded {OBSERVE_BYTES} bytes"
        return obs
    sessions: dict[int, _Session] = {}
    tokens = {secret.pass_token: "pass", secret.fail_token: "fail"}
    for n, line in enumerate(raw.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict) or rec.get("k") != secret.nonce:
                raise ValueError("no nonce")
            pid, event = int(rec["p"]), rec["e"]
        except (ValueError, KeyError, TypeError):
            obs.tampered = f"line {n} of the observation was not written by Crucible's plugin"
            return obs
        if event == "start":
            if pid in sessions and not sessions[pid].ended:
                obs.tampered = "a test session started twice"
                return obs
            sessions[pid] = _Session()
            obs.sessions += 1
            continue
        session = sessions.get(pid)
        if session is None or session.ended:
            obs.tampered = f"line {n}: an event outside a test session"
            return obs
        if event == "end":
            session.ended = True
        elif event == "test":
            outcome, token = str(rec.get("o", "")), rec.get("c")
            if token is not None:
                kind = tokens.get(str(token))
                if kind is None:
                    obs.tampered = "a canary carried an unknown token"
                    return obs
                session.canaries[kind].append(outcome)
            else:
                session.tests += 1
                nodeid = str(rec.get("id", ""))
                previous = obs.tests.get(nodeid)
                # A test run twice (a second session) passes only if it passed every time.
                obs.tests[nodeid] = outcome if previous in (None, "passed") else previous
                if len(obs.tests) > MAX_TESTS:
                    obs.tampered = f"more than {MAX_TESTS} tests were reported"
                    return obs
    for session in sessions.values():
        if not session.ended:
            obs.tampered = "a test session ended without reporting its end (killed or exited early)"
            return obs
        if not session.tests and not any(session.canaries.values()):
            continue  # nothing was collected: no canaries either (judged as no tests)
        if session.canaries["pass"] != ["passed"]:
            obs.tampered = f"the must-pass canary reported {session.canaries['pass'] or 'nothing'}"
            return obs
        if session.canaries["fail"] != ["failed"]:
            obs.tampered = f"the must-fail canary reported {session.canaries['fail'] or 'nothing'}"
            return obs
    return obs
