"""What the verifier hears from its own pytest plugin, and what it makes of it.

The plugin (``service/runtime/supervisor/py/crucible_observer.py``, on the read-only
supervisor mount) writes one JSON line per event to the test command's observation pipe
(fd 3, see ``ExecRequest.observe_bytes``). Each pytest session takes one key from the
one-use key file (``Secret.file_bytes``, placed by the replay) and signs every line with it
(HMAC-SHA256, RFC 2104); each session reports ``start``, one ``test`` per test (``o``:
passed, failed, error, skipped, xfailed) and ``end``. Two canaries per session, a must-pass
and a must-fail named like the task's tests and placed at random among them, carry ``c``.

A session also reports ``agent_code`` (at any point, even before its ``start``) for every
agent-written file whose code is about to run in the reporting process: the plugin hears of
it from ``crucible_guard``'s audit hook before that code runs, so the code cannot unsay it.
Such an outcome is not evidence (``Observation.agent_code``).

The verdict (``judge``) trusts nothing the tests' code could have bent without showing it:
a line not signed with an unused session key, a session started twice or without its end,
a canary missing, repeated or with the wrong outcome make the run ``tampered``; no session
at all means no test ran.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass, field
from typing import Any

OBSERVE_BYTES = 4 << 20  # what the pipe may carry: ~50k tests
MAX_TESTS = 20_000  # real tests per verification; above it the run is not judged


SESSIONS = 4  # pytest sessions one test command may run (one key each)
MAX_AGENT_CODE = 20  # agent-written files named in a verdict (the first ones)
INTERRUPTED = 2  # pytest's ExitCode.INTERRUPTED
SECRET_PATH = "/logs/.crucible-observe.json"


@dataclass(frozen=True)
class Secret:
    """One verification's secret: the nonce, one key per pytest session and the canaries'
    seed, delivered to the plugin in a root-only file the plugin consumes; never recorded."""

    nonce: str
    keys: tuple[str, ...]
    seed: str

    @classmethod
    def new(cls, sessions: int = SESSIONS) -> Secret:
        """Fresh random values (``secrets``: 128 bits each)."""
        return cls(
            secrets.token_hex(16),
            tuple(secrets.token_hex(16) for _ in range(sessions)),
            secrets.token_hex(16),
        )

    def file_bytes(self) -> bytes:
        """The key file's content (``SECRET_PATH`` in the verifier's sandbox)."""
        return json.dumps(
            {"nonce": self.nonce, "keys": list(self.keys), "used": 0, "seed": self.seed}
        ).encode()

    def sign(self, record: dict[str, Any]) -> dict[str, Any]:
        """``record`` with its ``m`` (what the plugin writes; for tests)."""
        body = json.dumps(record, separators=(",", ":"), sort_keys=True).encode()
        key = self.keys[int(record["s"])].encode()
        return {**record, "m": hmac.new(key, body, hashlib.sha256).hexdigest()}

    def verified(self, line: bytes) -> dict[str, Any] | None:
        """The record of a line signed with one of the session keys, else None."""
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict) or rec.get("k") != self.nonce:
                return None
            mac, index = str(rec.pop("m")), rec["s"]
            if not (isinstance(index, int) and 0 <= index < len(self.keys)):
                return None
        except (ValueError, KeyError, TypeError, RecursionError):
            return None
        body = json.dumps(rec, separators=(",", ":"), sort_keys=True).encode()
        good = hmac.new(self.keys[index].encode(), body, hashlib.sha256).hexdigest()
        return rec if hmac.compare_digest(mac, good) else None


@dataclass
class Observation:
    """The judged outcome of one test command.

    ``tests``: real tests (canaries excluded) by node id -> outcome, over every session;
    ``sessions``: pytest sessions seen; ``tampered``: why the report cannot be trusted
    (None when it can); ``agent_code``: agent-written files (at most ``MAX_AGENT_CODE``)
    whose code ran inside a reporting process, so that its outcomes are the agent's word;
    ``leftovers``: processes the sessions killed when their tests were done
    (``crucible_observer.end_leftovers``); ``passed``/``total``: counts over ``tests``.
    """

    tests: dict[str, str] = field(default_factory=dict)
    sessions: int = 0
    tampered: str | None = None
    agent_code: list[str] = field(default_factory=list)
    leftovers: int = 0

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
    for line in raw.split(b"\n"):
        if not line.strip():
            continue
        rec = secret.verified(line)
        if rec is None:
            obs.tampered = "a line of the observation was not written by Crucible's plugin"
            return obs
        index, event = rec["s"], rec.get("e")
        if event == "agent_code":
            path = str(rec.get("path", ""))
            if path not in obs.agent_code and len(obs.agent_code) < MAX_AGENT_CODE:
                obs.agent_code.append(path)
            continue
        if event == "start":
            if index in sessions:
                obs.tampered = "a test session started twice"
                return obs
            sessions[index] = _Session()
            obs.sessions += 1
            continue
        session = sessions.get(index)
        if session is None or session.ended:
            obs.tampered = "an event outside a test session"
            return obs
        if event == "end":
            session.ended = True
            left = rec.get("leftovers", 0)
            obs.leftovers += left if isinstance(left, int) and left > 0 else 0
            if rec.get("exitstatus") == INTERRUPTED:
                # a signal or KeyboardInterrupt in the middle (a trial's child sent SIGINT
                # to the judge once its forgery was in place): the run did not finish
                obs.tampered = "the test session was interrupted"
                return obs
        elif event == "test":
            outcome, kind = str(rec.get("o", "")), rec.get("c")
            if kind is not None:
                if kind not in ("pass", "fail"):
                    obs.tampered = "a canary of an unknown kind"
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
